"""Which ops broke an island that torch-mlir or XLA rejected.

The answer feeds the support table, so the island can be re-partitioned
without them. In order: the ops torch-mlir's diagnostics name; else each
distinct op signature lowered on its own (a multi-output op with its
getitems, so every output is a tensor); else, when the ops lower alone but
not together, every op of the island.
"""

from __future__ import annotations

import operator
from typing import Callable

import torch
import torch.fx
from torch.fx.passes.utils.fuser_utils import fuse_as_graphmodule

from tpu_inductor.lowering.stablehlo import IslandLoweringError, failure_reason
from tpu_inductor.lowering.support import op_key
from tpu_inductor.passes.partition import Island

Culprits = list[tuple[torch.fx.Node, str]]


def find_culprits(
    island: Island,
    error: Exception,
    signature: Callable[[torch.fx.Node], str],
    lowers: Callable[[Island], object],
) -> Culprits:
    """Nodes to keep off the device, each with the reason; ``lowers`` raises on failure."""
    named = set(error.failed_ops) if isinstance(error, IslandLoweringError) else set()
    reason = failure_reason(error)
    culprits = [(n, reason) for n in island.nodes if n.op == "call_function" and op_key(n.target) in named]
    if not culprits:
        culprits = _probe_nodes_alone(island, signature, lowers)
    if not culprits:
        culprits = [(n, reason) for n in island.nodes if n.op == "call_function"]
    return culprits


def _probe_nodes_alone(
    island: Island, signature: Callable[[torch.fx.Node], str], lowers: Callable[[Island], object]
) -> Culprits:
    failures, seen = [], set()
    for node in island.nodes:
        if node.op != "call_function" or not isinstance(node.target, torch._ops.OpOverload):
            continue
        if signature(node) in seen:
            continue
        seen.add(signature(node))
        members = [node] + [u for u in node.users if u.target is operator.getitem and u in island.nodes]
        graph, _, _ = fuse_as_graphmodule(island.owner, members, "probe", always_return_tuple=True)
        try:
            lowers(Island(name="probe", nodes=members, graph=graph, owner=island.owner))
        except Exception as exc:  # torch-mlir, refinement and XLA raise many types
            failures.append((node, failure_reason(exc)))
    return failures
