"""Where every node of an ATen graph runs, and why: the one placement decision.

Why: whether a node ran on the device or in eager used to be decided in
about eight places (the support table, ``as_strided``'s layout rule, host
constants, kernel choice, small islands between eager kernels, run-time
switches of the island runners, the recompile budget, in-place-update
graphs), each writing its own report entries. Here :func:`place` computes
one :class:`Placement` per graph from every compile-time source, and
everything downstream reads it: the partitioner (placement/partition.py)
groups its device nodes into islands, :func:`settle` records its eager
nodes (or refuses them under ``strict``), and the report's ``fallbacks``
and ``eager_kernels`` come only from this module, each with its
:attr:`Decision.why`.

The sources, in the order they win (the first that says eager decides):

0. ``input written in place``: the in-place write of a graph input that
   passes/input_writes_in_place.py made of AOTAutograd's copy-back (eager
   by construction: it writes torch's tensor); ``complex crossing``: a view
   that carries a complex tensor to or from its real parts
   (passes/complex_as_real_pairs.py: the device has no complex dtype);
1. ``reads eager's layout``: an ``as_strided`` left by its rewrite and the
   views up to its storage owner (passes/as_strided_as_gather.py);
2. ``host constant``: a 0-d compile-time constant that feeds a comparison,
   which torch-mlir would fold wrongly (:func:`constant_fold_hazards`);
3. ``chosen by measurement``: PyTorch's kernel timed faster
   (placement/kernel_choice.py);
4. the support table (placement/support.py): ``unsupported``,
   ``data-dependent``, ``random``, ``learned failure``, and, for one graph,
   ``fails in this graph`` and ``tie order``.

A device node is ``lowers``, ``parameter-only`` (``freeze_parameters``:
it gets an island of its own whose results are kept), ``collective in
island`` (under torchrun, a functional collective and its ``wait_tensor``,
when every collective of the graph runs over one process group: part of an
island compiled as each rank's program, lowering/with_collectives.py), or
``collective`` (the graph's collectives span several groups: an island of
its own, runtime/collectives.py; its ``wait_tensor`` is ``collective
done``). After the partition,
device nodes that joined no island (views and 0-d arithmetic, not worth a
device call) run eagerly as bookkeeping, unrecorded.

Decisions made later, at run time, move a whole island or graph: a result
that does not match what was compiled (``result mismatch``), a bucket past
the recompile budget (``budget exceeded``), an in-place-update graph run as
traced (``in-place update graph``), a graph whose compile failed
(``whole graph``). They are recorded through :func:`record_eager` too.
"""

from __future__ import annotations

import dataclasses
import logging
from typing import TYPE_CHECKING, Collection, Mapping, Optional

import torch
import torch.fx

from tpu_inductor.passes.as_strided_as_gather import eager_storage_reads
from tpu_inductor.passes.complex_as_real_pairs import CROSSING
from tpu_inductor.passes.input_writes_in_place import WRITES_INPUT

if TYPE_CHECKING:
    from tpu_inductor import report
    from tpu_inductor.placement.support import GraphSupport

log = logging.getLogger(__name__)

ON_DEVICE = ("lowers", "parameter-only", "collective", "collective in island")
FALLBACKS = (
    "unsupported",
    "data-dependent",
    "random",
    "learned failure",
    "fails in this graph",
    "tie order",
    "reads eager's layout",
    "result mismatch",
    "budget exceeded",
    "whole graph",
)
"""Eager because the device cannot (or may not) run it: the report's ``fallbacks``."""
CHOICES = ("chosen by measurement", "in-place update graph")
"""Eager on purpose, though it would lower: the report's ``eager_kernels``."""
BOOKKEEPING = ("host constant", "collective done", "input written in place", "complex crossing")
"""Eager, feeding the device; neither a fallback nor a choice."""
WHYS = ON_DEVICE + FALLBACKS + CHOICES + BOOKKEEPING


@dataclasses.dataclass(frozen=True)
class Decision:
    """Where one node runs: ``why`` (one of :data:`WHYS`) and the detail a user reads."""

    why: str
    detail: str = ""

    def __post_init__(self) -> None:
        assert self.why in WHYS, self.why

    @property
    def on_device(self) -> bool:
        return self.why in ON_DEVICE


LOWERS = Decision("lowers")
PARAMETER_ONLY = Decision("parameter-only", "computed from parameters alone; its results are kept")
COLLECTIVE = Decision("collective", "runs in XLA over every rank's device (PJRT's distributed runtime)")
COLLECTIVE_IN_ISLAND = Decision(
    "collective in island", "runs in XLA inside its island's program, over its process group's ranks"
)
COLLECTIVE_DONE = Decision("collective done", "the collective it waits for ran in XLA: nothing to wait for")
INPUT_WRITTEN = Decision(
    "input written in place", "only the rows it writes come from the device (passes/input_writes_in_place.py)"
)
COMPLEX_CROSSING = Decision(
    "complex crossing", "a view between a complex tensor and its real parts (passes/complex_as_real_pairs.py)"
)


@dataclasses.dataclass
class Placement:
    """Every ``call_function`` node of one graph, with its :class:`Decision`."""

    decisions: dict[torch.fx.Node, Decision]

    def of(self, node: torch.fx.Node) -> Decision:
        return self.decisions.get(node, LOWERS)

    def on_device(self, node: torch.fx.Node) -> bool:
        return self.of(node).on_device

    def frozen(self, node: torch.fx.Node) -> bool:
        return self.of(node) is PARAMETER_ONLY

    def collective(self, node: torch.fx.Node) -> bool:
        return self.of(node).why == "collective"

    def eager(self, kinds: Collection[str]) -> list[tuple[torch.fx.Node, Decision]]:
        """The nodes decided eager for one of ``kinds``, in graph order."""
        return [(node, d) for node, d in self.decisions.items() if d.why in kinds]


def place(
    gm: torch.fx.GraphModule,
    support: "GraphSupport",
    chosen: Optional[Mapping[torch.fx.Node, str]] = None,
    frozen: Collection[torch.fx.Node] = frozenset(),
) -> Placement:
    """Decide every node of ``gm``: the sources of the module docstring, in order.

    ``chosen``: nodes kernel choice keeps on PyTorch's kernel, with why.
    ``frozen``: parameter-only nodes (analysis/frozen_parameters.py).
    """
    chosen = chosen or {}
    layout_bound = eager_storage_reads(gm)
    hazards = constant_fold_hazards(gm)
    decisions: dict[torch.fx.Node, Decision] = {}
    in_islands = _collectives_join_islands(gm)
    for node in gm.graph.nodes:
        if node.op != "call_function":
            continue
        if node.meta.get(WRITES_INPUT):
            decision = INPUT_WRITTEN
        elif node.meta.get(CROSSING):
            decision = COMPLEX_CROSSING
        elif node in layout_bound:
            decision = Decision("reads eager's layout", layout_bound[node])
        elif node in hazards:
            decision = Decision("host constant", hazards[node])
        elif node in chosen:
            decision = Decision("chosen by measurement", chosen[node])
        elif isinstance(node.target, torch._ops.OpOverload) and node.target.namespace == "_c10d_functional":
            decision = _collective(node, decisions, in_islands) or support.decide(node) or LOWERS
        else:
            decision = support.decide(node) or (PARAMETER_ONLY if node in frozen else LOWERS)
        decisions[node] = decision
    return Placement(decisions)


def _collective(
    node: torch.fx.Node, decided: Mapping[torch.fx.Node, Decision], in_islands: bool
) -> Optional[Decision]:
    """A functional collective under torchrun runs in XLA over its group's
    ranks: inside an island (``in_islands``) or as one of its own
    (runtime/collectives.py); the ``wait_tensor`` on its result joins the
    island or has nothing left to wait for. None where the process group keeps it."""
    from tpu_inductor.runtime import collectives, distributed

    if not distributed.active():
        return None
    if node.target is collectives.WAIT:
        source = decided.get(node.args[0], LOWERS)
        if source is COLLECTIVE_IN_ISLAND:
            return COLLECTIVE_IN_ISLAND
        return COLLECTIVE_DONE if source.why == "collective" else None
    if node.target not in collectives.LOWERED:
        return None
    why = collectives.why_not_lowered(node)
    if why:
        return Decision("unsupported", why)
    return COLLECTIVE_IN_ISLAND if in_islands else COLLECTIVE


def _collectives_join_islands(gm: torch.fx.GraphModule) -> bool:
    """Whether the graph's collectives go inside its islands: under torchrun,
    when every one XLA runs is over the same process group (an island is one
    program over that group's ranks) and no shape is symbolic."""
    from tpu_inductor.dynamic import has_symbolic_inputs
    from tpu_inductor.runtime import collectives, distributed

    if not distributed.active():
        return False
    if has_symbolic_inputs([node.meta.get("val") for node in gm.graph.find_nodes(op="placeholder")]):
        return False
    groups = {
        collectives.Collective.of(node).ranks
        for node in gm.graph.nodes
        if node.target in collectives.LOWERED and collectives.why_not_lowered(node) is None
    }
    return len(groups) == 1


# torch-mlir folds these wrongly when their input is a 0-d compile-time
# constant: sign(3.0) -> -1 and 3.0 < 0 -> True (torch-mlir 20261001; negative
# values, and constant vectors such as iotas, fold right). Run eagerly, their
# results reach the island as arguments, which nothing can fold.
FOLDS_WRONGLY_ON_CONSTANTS = frozenset(
    {"aten.sign", "aten.lt", "aten.gt", "aten.le", "aten.ge", "aten.eq", "aten.ne"}
)


def constant_fold_hazards(gm: torch.fx.GraphModule) -> dict[torch.fx.Node, str]:
    """0-d constants to compute on the host, so torch-mlir cannot fold them.

    Returns the producers of 0-d compile-time constants that feed a
    comparison or ``sign``. Computed eagerly, they reach the island as
    arguments: the comparison itself still runs on the device.
    """
    from tpu_inductor.placement.support import op_key

    from_inputs: set[torch.fx.Node] = set()
    for node in gm.graph.nodes:
        if node.op in ("placeholder", "get_attr") or any(a in from_inputs for a in node.all_input_nodes):
            from_inputs.add(node)
    hazards = {}
    for node in gm.graph.nodes:
        if node.op != "call_function" or op_key(node.target) not in FOLDS_WRONGLY_ON_CONSTANTS:
            continue
        for constant in node.all_input_nodes:
            value = constant.meta.get("val")
            if (
                constant.op == "call_function"
                and constant not in from_inputs
                and isinstance(value, torch.Tensor)
                and value.dim() == 0
            ):
                hazards[constant] = "0-d constant kept on the host: torch-mlir folds comparisons of it wrongly"
    return hazards


def settle(
    placement: Placement,
    in_islands: Collection[torch.fx.Node],
    strict: bool,
    record: "report.GraphRecord",
) -> None:
    """Accept the compute ops left to eager: record each fallback and choice,
    or, under ``strict``, refuse the fallbacks in one error naming each op and line.

    ``in_islands``: the nodes the partition put on the device; only nodes
    that produce tensors are recorded (shape arithmetic is bookkeeping). A
    view is recorded when it was decided eager itself (an ``expand`` XLA
    cannot compile), not when it only rides along with the ``as_strided``
    that reads its storage.
    """
    from tpu_inductor.errors import UnsupportedOpError, describe_node
    from tpu_inductor.placement.partition import is_compute, produces_tensor

    def recorded(kinds: Collection[str]) -> list[tuple[torch.fx.Node, Decision]]:
        return [
            (node, decision)
            for node, decision in placement.eager(kinds)
            if node not in in_islands
            and produces_tensor(node)
            and (is_compute(node) or decision.why != "reads eager's layout")
        ]

    fallbacks = recorded(FALLBACKS)
    if strict and fallbacks:
        lines = "\n".join(f"  {describe_node(node)}: {d.detail}" for node, d in fallbacks)
        raise UnsupportedOpError(
            f"tpu_inductor (strict): {len(fallbacks)} op(s) cannot run on the device:\n{lines}\n"
            "Set strict=False (option) or TPU_INDUCTOR_STRICT=0 to run them in eager PyTorch."
        )
    for node, decision in fallbacks:
        log.info("tpu_inductor: running %s eagerly: %s", describe_node(node), decision.detail)
    for node, decision in fallbacks + [(n, d) for n, d in placement.decisions.items() if d.why in CHOICES]:
        record_eager(record, node, decision)


def record_eager(record: "report.GraphRecord", what: "torch.fx.Node | str", decision: Decision) -> None:
    """Write one eager decision into the graph's record: a node, or a whole
    island or graph (``what`` names it) moved at compile or run time."""
    from tpu_inductor import report
    from tpu_inductor.errors import op_name, user_source_line

    if isinstance(what, torch.fx.Node):
        entry = report.FallbackRecord(op_name(what), decision.detail, user_source_line(what), decision.why)
    else:
        entry = report.FallbackRecord(what, decision.detail, None, decision.why)
    (record.eager_kernels if decision.why in CHOICES else record.fallbacks).append(entry)
