"""Calls of a shared subgraph (``torch.compiler.nested_compile_region``), inlined.

Why: a function marked ``@torch.compiler.nested_compile_region`` (a repeated
transformer layer, to trace it once) reaches the ATen graph as
``invoke_subgraph(subgraph_0, "subgraph_0", *operands)``, forward and backward.
The region is a compile-time saving for Dynamo and AOTAutograd; the call is
a plain function call of an ATen graph, which no lowering knows, so each one
ran in eager PyTorch and split the islands around it. Inductor inlines it
the same way by default. XLA compiles the inlined body with its neighbours.

Before: ``%r = invoke_subgraph(%subgraph_0, "subgraph_0", %x, %w)``; ``%y = getitem(%r, 0)``
After:  ``%mm = mm(%x, %w)``; ``%y = relu(%mm)`` (the body of ``subgraph_0``)
"""

from __future__ import annotations

import logging

import torch
import torch.fx

from tpu_inductor.passes.rewrite import drop_inlined_subgraphs, inline_replacement

log = logging.getLogger(__name__)

INVOKE_SUBGRAPH = torch.ops.higher_order.invoke_subgraph


def inline_subgraph_calls(gm: torch.fx.GraphModule) -> torch.fx.GraphModule:
    inlined = 0
    # A body may call another region: inline until no call is left.
    while calls := [n for n in gm.graph.nodes if n.op == "call_function" and n.target is INVOKE_SUBGRAPH]:
        for node in calls:
            body, _identifier, *operands = node.args
            inline_replacement(gm, node, getattr(gm, body.target), operands)
            inlined += 1
    if inlined:
        drop_inlined_subgraphs(gm)
        log.debug("inlined %d call(s) of nested compile regions", inlined)
    return gm
