"""The one compile pipeline every ATen graph goes through.

Why: static and symbolic graphs (inference, forward or backward) used to
run their passes in different orders, each with its own lower-and-retry
loop, so a fix or a feature landed on one path only. Here:

* :data:`STAGES` is the one ordered list of graph rewrites. A stage is
  skipped only by its stated condition (:attr:`Stage.skip`, which reads
  :class:`GraphFacts`), and :func:`stages_for` says which run for a graph.
* :func:`lower_with_retries` is the one loop that partitions, builds every
  island (a static executable, or a symbolic module compiled per bucket:
  the caller's ``build``), and, when torch-mlir or XLA rejects one, proves
  which op broke it (placement/culprits.py), re-partitions and tries again.

``compiled_graph.build_compiled_graph`` and ``dynamic.graph.DynamicShapeGraph``
differ only in what they build per island and what they do per call.
"""

from __future__ import annotations

import dataclasses
import logging
from typing import Any, Callable, Collection, Mapping, Optional, Protocol

import sympy
import torch
import torch.fx
from torch.fx.passes.graph_transform_observer import GraphTransformObserver

from tpu_inductor import report
from tpu_inductor.errors import LoweringError, RanksDisagreeError, describe_node
from tpu_inductor.placement.culprits import BUILT_AFTER_COMPILE_FAILED, Diagnosis, find_culprits, recheck_learned
from tpu_inductor.placement.support import GraphSupport, SupportTable
from tpu_inductor.passes import run_passes
from tpu_inductor.passes.attention import decompose_attention
from tpu_inductor.passes.depthwise_convolutions_as_taps import depthwise_convolutions_as_taps
from tpu_inductor.passes.device_random import device_random
from tpu_inductor.passes.hoist_sizes import hoist_sizes
from tpu_inductor.passes.input_writes_in_place import (
    DeferredWrites,
    InputWrites,
    defer_input_writes,
    input_writes_in_place,
)
from tpu_inductor.passes.grown_caches import GrownCaches, find_grown_caches, keep_grown_caches
from tpu_inductor.passes.padded_positions import padded_positions
from tpu_inductor.analysis.padding_safety import PaddingAnalysis, padding_safety
from tpu_inductor.placement.partition import Island, PartitionPlan, propose_islands
from tpu_inductor.placement.placement import place, settle
from tpu_inductor.passes.pointwise_convolutions_as_matmuls import pointwise_convolutions_as_matmuls
from tpu_inductor.analysis.real_lengths import RealLengths
from tpu_inductor.passes.small_convolutions_as_matmuls import small_convolutions_as_matmuls
from tpu_inductor.reporting import hooks

log = logging.getLogger(__name__)


@dataclasses.dataclass
class GraphFacts:
    """What decides which stages run for one graph, and what they leave for later ones."""

    symbolic: bool
    platform: str
    fallback_random: bool = False
    """Random ops stay on torch's generator, in eager (``Config.fallback_random``)."""
    analysis: Optional[PaddingAnalysis] = None
    """Which symbols padding may change (symbolic graphs; set by ``padding_safety``)."""
    real_lengths: Optional[RealLengths] = None
    """The graph's ``valid_<size>`` inputs: real sizes the padded graph reads at run time."""
    input_writes: Optional[InputWrites] = None
    """Which outputs are inputs' new values, for AOTAutograd to copy back (inference graphs)."""
    keeps_device_copies: bool = False
    """The client keeps device copies of torch's inputs (a TPU, ``zero_copy=False``; one device)."""
    deferred_writes: Optional[DeferredWrites] = None
    """Input writes a padded graph leaves to its caller (set by ``input_writes_in_place``)."""
    grown_caches: Optional[GrownCaches] = None
    """Inputs a padded graph returns grown by ``cat``, which its caller rebuilds (set by ``find_grown_caches``)."""

    @classmethod
    def of(cls, context: Any, *, symbolic: bool, input_writes: Optional[InputWrites] = None) -> "GraphFacts":
        """The facts a graph compiled under ``context`` (a ``CompileContext``) starts with."""
        return cls(
            symbolic=symbolic,
            platform=context.platform.name,
            fallback_random=context.config.fallback_random,
            input_writes=input_writes,
            # A mesh's executables take no device copies from the graph (runtime/sharded.py).
            keeps_device_copies=context.platform.keeps_device_copies and context.mesh is None,
        )

    @property
    def real_length_exprs(self) -> list[sympy.Expr]:
        return self.real_lengths.exprs if self.real_lengths is not None else []

    @property
    def padded(self) -> frozenset:
        return frozenset(self.analysis.safe) if self.analysis is not None else frozenset()


@dataclasses.dataclass(frozen=True)
class Stage:
    """One graph rewrite of the pipeline."""

    name: str
    run: Callable[[torch.fx.GraphModule, GraphFacts], torch.fx.GraphModule]
    skip: Callable[[GraphFacts], Optional[str]] = lambda facts: None
    """The stated reason this graph skips the stage, or None to run it."""


def _input_writes(gm: torch.fx.GraphModule, facts: GraphFacts) -> torch.fx.GraphModule:
    if facts.symbolic:
        gm, facts.deferred_writes = defer_input_writes(gm, facts.input_writes, facts.keeps_device_copies)
        return gm
    return input_writes_in_place(gm, facts.input_writes, facts.keeps_device_copies)


def _rewrites(gm: torch.fx.GraphModule, facts: GraphFacts) -> torch.fx.GraphModule:
    return run_passes(gm)


def _padding_safety(gm: torch.fx.GraphModule, facts: GraphFacts) -> torch.fx.GraphModule:
    gm = padding_safety(gm)
    facts.analysis = gm.meta["padding_analysis"]
    return gm


def _lengths(gm: torch.fx.GraphModule, facts: GraphFacts) -> RealLengths:
    if facts.real_lengths is None:
        facts.real_lengths = RealLengths(gm)
    return facts.real_lengths


def _padded_positions(gm: torch.fx.GraphModule, facts: GraphFacts) -> torch.fx.GraphModule:
    return padded_positions(gm, facts.padded, _lengths(gm, facts))


def _find_grown_caches(gm: torch.fx.GraphModule, facts: GraphFacts) -> torch.fx.GraphModule:
    gm, facts.grown_caches = find_grown_caches(gm, facts.padded)
    return gm


def _unless_padded_with_device_copies(facts: GraphFacts) -> Optional[str]:
    if not facts.symbolic:
        return "static shapes: nothing is padded"
    if not facts.keeps_device_copies:
        return "the client shares memory with torch: a grown cache costs no transfer"
    return None


def _keep_grown_caches(gm: torch.fx.GraphModule, facts: GraphFacts) -> torch.fx.GraphModule:
    return keep_grown_caches(gm, facts.grown_caches) if facts.grown_caches is not None else gm


def _attention(gm: torch.fx.GraphModule, facts: GraphFacts) -> torch.fx.GraphModule:
    return decompose_attention(gm, facts.padded, _lengths(gm, facts))


def _device_random(gm: torch.fx.GraphModule, facts: GraphFacts) -> torch.fx.GraphModule:
    return device_random(gm)


def _unless_fallback_random(facts: GraphFacts) -> Optional[str]:
    return "fallback_random: random ops draw from torch's generator, in eager" if facts.fallback_random else None


def _hoist_sizes(gm: torch.fx.GraphModule, facts: GraphFacts) -> torch.fx.GraphModule:
    return hoist_sizes(gm)


def _small_convolutions(gm: torch.fx.GraphModule, facts: GraphFacts) -> torch.fx.GraphModule:
    return small_convolutions_as_matmuls(gm)


def _depthwise_convolutions(gm: torch.fx.GraphModule, facts: GraphFacts) -> torch.fx.GraphModule:
    return depthwise_convolutions_as_taps(gm)


def _pointwise_convolutions(gm: torch.fx.GraphModule, facts: GraphFacts) -> torch.fx.GraphModule:
    return pointwise_convolutions_as_matmuls(gm)


def _only_symbolic(why: str) -> Callable[[GraphFacts], Optional[str]]:
    return lambda facts: None if facts.symbolic else why


def _static_cpu(why_cpu: str) -> Callable[[GraphFacts], Optional[str]]:
    """Run on static graphs for the CPU client only: ``why_cpu`` says why other platforms skip."""

    def skip(facts: GraphFacts) -> Optional[str]:
        if facts.platform != "cpu":
            return why_cpu
        if facts.symbolic:
            return "the rewrite is built from sizes known at compile time"
        return None

    return skip


STAGES: tuple[Stage, ...] = (
    # First, while the graph's placeholders are AOTAutograd's (device_random
    # and real_lengths append some); the functional write it leaves for the
    # device's readers goes through every later stage.
    Stage("input_writes_in_place", _input_writes),
    # Correctness rewrites and cleanup (passes.PIPELINE), first: every later
    # stage, and attention's own traced decompositions, see their result.
    Stage("rewrites", _rewrites),
    # Before attention, which it needs whole to see is_causal.
    Stage("padding_safety", _padding_safety, _only_symbolic("static shapes: nothing is padded")),
    # Before padded_positions, which realigns the cat it looks for.
    Stage("find_grown_caches", _find_grown_caches, _unless_padded_with_device_copies),
    # After the analysis, which accepts these ops because of this rewrite.
    Stage("padded_positions", _padded_positions, _only_symbolic("static shapes: nothing is padded")),
    Stage("attention", _attention),
    # After the padding analysis (which keeps dims a random op draws over
    # unpadded) and attention (whose dropout it draws); it appends the seed
    # input after every valid_<size> input.
    Stage("device_random", _device_random, _unless_fallback_random),
    Stage("hoist_sizes", _hoist_sizes, _only_symbolic("static shapes: every size is a constant")),
    Stage(
        "small_convolutions_as_matmuls",
        _small_convolutions,
        _static_cpu("only XLA:CPU's convolution is slow on few output positions"),
    ),
    # Before placement: as taps, the convolution fuses with its neighbours
    # on the device instead of being timed against oneDNN (kernel choice).
    Stage(
        "depthwise_convolutions_as_taps",
        _depthwise_convolutions,
        _static_cpu("only XLA:CPU's depthwise convolution is slow"),
    ),
    # After small_convolutions_as_matmuls, which takes the ones with few output positions.
    Stage(
        "pointwise_convolutions_as_matmuls",
        _pointwise_convolutions,
        _static_cpu("only XLA:CPU transposes around each convolution of a channels-first graph"),
    ),
    # Last: the cut it adds reads the cache's length input as it is, in no later rewrite.
    Stage("keep_grown_caches", _keep_grown_caches, _unless_padded_with_device_copies),
)


def stages_for(facts: GraphFacts) -> list[str]:
    """The names of the stages a graph with ``facts`` runs, in order."""
    return [stage.name for stage in STAGES if stage.skip(facts) is None]


def run_stages(gm: torch.fx.GraphModule, facts: GraphFacts) -> torch.fx.GraphModule:
    """Every stage that applies, each under PyTorch's ``GraphTransformObserver``
    (``torch._inductor.config.trace.log_url_for_graph_xform`` shows a diff per stage)."""
    with report.stage("passes"):
        for stage in STAGES:
            why = stage.skip(facts)
            if why is not None:
                log.debug("tpu_inductor: skipping %s: %s", stage.name, why)
                continue
            with GraphTransformObserver(gm, stage.name, subsystem="tpu_inductor"):
                gm = stage.run(gm, facts)
    return gm


# -- lowering ------------------------------------------------------------------------


def graph_support(gm: torch.fx.GraphModule, context: Any, probe: "Probe") -> GraphSupport:
    """The support table placement reads for ``gm``: the shared table, after
    re-probing (one op at a time) the failures another process learned for
    calls in ``gm``, plus what this graph will keep off the device by itself."""
    recheck_learned(gm, context.support, probe)
    return GraphSupport(context.support, context.platform.name)


class IslandRunner(Protocol):
    """What a graph calls in place of an island, one interface for both paths:
    ``compiled_graph.DeviceIsland`` (one static executable) and
    ``dynamic.island.SymbolicIsland`` (one executable per bucket of sizes)."""

    def run(self, *args: Any) -> tuple[torch.Tensor, ...]: ...


Build = Callable[[Island], IslandRunner]
"""Lower and compile one island, returning its runner; raises on failure."""
Probe = Callable[[Island], None]
"""Lower and compile a piece of a graph to see whether it can be (nothing kept, nothing cached)."""


def lower_with_retries(
    gm: torch.fx.GraphModule,
    support: GraphSupport,
    record: report.GraphRecord,
    context: Any,
    build: Build,
    probe: Probe,
    *,
    learn_for_later: bool,
    chosen: Optional[Mapping[torch.fx.Node, str]] = None,
    frozen: Collection[torch.fx.Node] = frozenset(),
    plan: Optional[PartitionPlan] = None,
) -> tuple[PartitionPlan, dict[str, IslandRunner]]:
    """Place and partition ``gm``, build every island; on a failure, learn and
    retry; then settle the placement (record what runs eagerly, or refuse it
    under ``strict``).

    An op proven to fail alone is learned in the shared table when
    ``learn_for_later`` (for every later graph and process), else for this
    graph only; a run that fails only together is always this graph's.
    Each failed attempt moves at least one node to eager, so this ends.
    ``chosen``: nodes kernel choice keeps on PyTorch's kernel; ``frozen``:
    parameter-only nodes (placement/placement.py). ``plan``: the first
    proposal, when the caller has made it already.
    """
    if plan is None:
        plan = propose_islands(gm, place(gm, support, chosen, frozen))
    for _ in range(len(gm.graph.nodes) + 1):
        built: dict[str, IslandRunner] = {}
        failure: Optional[tuple[Island, Exception]] = None
        for island in plan.islands:
            try:
                built[island.name] = build(island)
            except RanksDisagreeError:  # no retry can make the ranks agree
                raise
            except Exception as exc:  # torch-mlir, refinement and XLA raise many types
                failure = (island, exc)
                break
        if failure is None:
            settle(plan.placement, plan.in_islands, context.config.strict, record)
            return plan, built
        record.lowering_retries += 1
        diagnosis = _learn(*failure, support, probe, learn_for_later)
        hooks.on_island_failed(*failure, context, record, after_compile=diagnosis.unexplained)
        plan = propose_islands(gm, place(gm, support, chosen, frozen))
    raise LoweringError("tpu_inductor: partitioning did not converge")  # pragma: no cover


def _learn(island: Island, error: Exception, support: GraphSupport, probe: Probe, learn_for_later: bool) -> Diagnosis:
    """Find the ops that broke ``island`` and keep them off the device; what was found."""
    shared: SupportTable = support.base
    diagnosis = find_culprits(island, error, shared.signature, probe)
    if diagnosis.unexplained:
        log.warning(
            "tpu_inductor: %s: %s (%s: %s); it runs in eager PyTorch in this graph. "
            "No op is to blame: please report this.",
            island.name, BUILT_AFTER_COMPILE_FAILED, type(error).__name__, error, exc_info=error,
        )
    for node, why in diagnosis.proven:
        log.info("tpu_inductor: %s does not lower (%s)", describe_node(node), why)
        if learn_for_later:
            shared.learn(shared.signature(node), why)
        else:
            support.local[node] = why
    for node, why in diagnosis.together:
        log.info("tpu_inductor: %s runs eagerly in this graph: %s", describe_node(node), why)
        support.local[node] = why
    return diagnosis
