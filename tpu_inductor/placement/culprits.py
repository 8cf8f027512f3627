"""Which ops broke an island that torch-mlir or XLA rejected, proven one at a time.

Why: what is learned here keeps an op off the device in every later graph
and process, so nothing is learned on suspicion. An op is a culprit only
when it fails *alone*, lowered with its real arguments (the ops torch-mlir's
diagnostics name are tried first, else every distinct call of the island).
When every op lowers alone and only the island fails, the shortest failing
run of the island (in graph order, found by bisection) runs in eager for
this graph only, and nothing is learned. When the island itself lowers and
compiles as a probe, what failed came after (building its runner: our code,
not torch-mlir's or XLA's); no op is blamed, the island runs in eager for
this graph, and the caller says so loudly (``Diagnosis.unexplained``).

Before this, a depthwise ``convolution_backward`` that XLA refused, probed
as "the same op" as a dense one that lowers, put its reason on every
``mul``, ``add`` and ``mm`` of the island, in every later process.
"""

from __future__ import annotations

import dataclasses
import operator
from typing import Callable, Sequence

import torch
import torch.fx
from torch.fx.passes.utils.fuser_utils import fuse_as_graphmodule

from tpu_inductor.lowering.pipelines import IslandLoweringError
from tpu_inductor.lowering.stablehlo import failure_reason
from tpu_inductor.placement.support import SupportTable, op_key
from tpu_inductor.placement.partition import Island

BUILT_AFTER_COMPILE_FAILED = "the island lowers and compiles, but building it failed after that"
"""How an unexplained failure's reason starts (tests treat it as a bug of ours)."""

Lowers = Callable[[Island], object]
"""Lowers and compiles an island; raises on failure."""


@dataclasses.dataclass
class Diagnosis:
    """Why an island failed: ops that fail alone, or a run that fails only together."""

    proven: list[tuple[torch.fx.Node, str]]
    """Each fails when lowered alone: learnable for every later graph."""
    together: list[tuple[torch.fx.Node, str]]
    """Lower alone but not as one island: eager for this graph only."""
    unexplained: bool = False
    """The whole island lowers and compiles as a probe: no op explains the failure."""


def find_culprits(island: Island, error: Exception, signature: Callable[[torch.fx.Node], str], lowers: Lowers) -> Diagnosis:
    """Prove which nodes of ``island`` keep it from lowering."""
    named = set(error.failed_ops) if isinstance(error, IslandLoweringError) else set()
    calls = [n for n in island.nodes if n.op == "call_function" and isinstance(n.target, torch._ops.OpOverload)]
    suspects = [n for n in calls if op_key(n.target) in named] or calls
    proven = _fail_alone(island, suspects, signature, lowers)
    if not proven and len(suspects) < len(calls):
        named_nodes = set(suspects)
        proven = _fail_alone(island, [n for n in calls if n not in named_nodes], signature, lowers)
    if proven:
        return Diagnosis(proven=proven, together=[])
    compute = [n for n in island.nodes if _is_compute_call(n)]
    if not _fails(island, compute, lowers):
        # Blaming a run "together" here would be a guess: jaxlib 0.11's result
        # handlers, which the runner builds after the compile, once failed so.
        reason = f"{BUILT_AFTER_COMPILE_FAILED}: {failure_reason(error)}"
        return Diagnosis(proven=[], together=[(n, reason) for n in compute], unexplained=True)
    run = _smallest_failing_run(island, compute, lowers)
    reason = f"lowers alone but not with the {len(run) - 1} other op(s) beside it: {failure_reason(error)}"
    return Diagnosis(proven=[], together=[(n, reason) for n in run])


def recheck_learned(gm: torch.fx.GraphModule, support: SupportTable, lowers: Lowers) -> None:
    """Re-probe, one op each, the failures another process learned for calls in ``gm``.

    A confirmed entry is trusted from then on; one that lowers now is
    forgotten, so one odd call in an earlier process never keeps a call that
    lowers off the device for good.
    """
    seen: set[str] = set()
    nodes = set(gm.graph.nodes)
    for node in gm.graph.nodes:
        if node.op != "call_function" or not support.needs_recheck(node):
            continue
        key = support.signature(node)
        if key in seen:
            continue
        seen.add(key)
        probe = _probe_island(gm, [node], nodes)
        try:
            lowers(probe)
        except Exception:  # torch-mlir, refinement and XLA raise many types
            support.confirm(key)
        else:
            support.forget(key)


def _fail_alone(
    island: Island, nodes: Sequence[torch.fx.Node], signature: Callable[[torch.fx.Node], str], lowers: Lowers
) -> list[tuple[torch.fx.Node, str]]:
    failures, tried = [], set()
    members_of_island = set(island.nodes)
    for node in nodes:
        # The same signature at other sizes is a different call: probe each shape once.
        key = (signature(node), _shapes(node))
        if key in tried:
            continue
        tried.add(key)
        probe = _probe_island(island.owner, [node], members_of_island)
        try:
            lowers(probe)
        except Exception as exc:  # torch-mlir, refinement and XLA raise many types
            failures.append((node, failure_reason(exc)))
    return failures


def _smallest_failing_run(island: Island, run: list[torch.fx.Node], lowers: Lowers) -> list[torch.fx.Node]:
    """The shortest contiguous run of ``run`` (graph order) that still fails.

    A contiguous run of a topologically sorted island is itself cycle-free,
    so it lowers as an island of its own. Any run holding a failing one
    fails too, so the latest start and then the earliest end are each found
    by bisection: about ``2 log2(n)`` probes.
    """
    low, high = 0, len(run) - 1  # run[low:] fails; find the latest such start
    while low < high:
        middle = (low + high + 1) // 2
        low, high = (middle, high) if _fails(island, run[middle:], lowers) else (low, middle - 1)
    run = run[low:]
    low, high = 1, len(run)  # run[:high] fails; find the earliest such end
    while low < high:
        middle = (low + high) // 2
        low, high = (low, middle) if _fails(island, run[:middle], lowers) else (middle + 1, high)
    return run[:high]


def _fails(island: Island, part: list[torch.fx.Node], lowers: Lowers) -> bool:
    """Whether ``part`` of ``island`` (compute nodes, in graph order) fails as an island of its own."""
    try:
        lowers(_probe_island(island.owner, part, set(island.nodes)))
    except Exception:  # torch-mlir, refinement and XLA raise many types
        return True
    return False


def _probe_island(owner: torch.fx.GraphModule, part: list[torch.fx.Node], within: set[torch.fx.Node]) -> Island:
    """``part`` as an island of its own, with each multi-output op's getitems in ``within``."""
    members = [m for n in part for m in [n] + _getitems(n, within)]
    graph, _, _ = fuse_as_graphmodule(owner, members, "probe", always_return_tuple=True)
    return Island(name="probe", nodes=members, graph=graph, owner=owner)


def _getitems(node: torch.fx.Node, within: set[torch.fx.Node]) -> list[torch.fx.Node]:
    """A multi-output op's getitems, so every output of the probe is a tensor."""
    return [u for u in node.users if u.target is operator.getitem and u in within]


def _is_compute_call(node: torch.fx.Node) -> bool:
    return node.op == "call_function" and node.target is not operator.getitem


def _shapes(node: torch.fx.Node) -> tuple:
    """The input shapes, as text: a symbolic size (``s0``) is not hashable."""
    return tuple(
        str(tuple(v.shape)) if isinstance(v, torch.Tensor) else None
        for v in (a.meta.get("val") for a in node.all_input_nodes)
    )


__all__ = ["Diagnosis", "find_culprits", "recheck_learned"]
