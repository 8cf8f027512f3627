"""FX edits the rewrite passes share: swap a node for another call, or build
new calls with FakeTensor metadata in its place."""

from __future__ import annotations

from typing import Any

import torch
import torch.fx
from torch._guards import detect_fake_mode


def replace_with_call(
    gm: torch.fx.GraphModule, node: torch.fx.Node, target: Any, args: tuple, kwargs: dict
) -> torch.fx.Node:
    """Put ``target(*args, **kwargs)`` where ``node`` was, keeping its metadata
    (FakeTensor value, user stack trace) so lowering and reports still see them."""
    with gm.graph.inserting_before(node):
        replacement = gm.graph.call_function(target, args, kwargs)
    replacement.meta = dict(node.meta)
    node.replace_all_uses_with(replacement)
    gm.graph.erase_node(node)
    return replacement


class GraphBuilder:
    """Inserts calls before ``anchor``'s place with FakeTensor values and its stack
    trace, so later passes, lowering and reports see them like traced nodes.
    Use inside ``graph.inserting_before(anchor)``."""

    def __init__(self, graph: torch.fx.Graph, anchor: torch.fx.Node) -> None:
        self.graph = graph
        self.anchor = anchor
        self.fake_mode = detect_fake_mode([anchor.meta.get("val")])

    def call(self, target: Any, *args: Any, **kwargs: Any) -> torch.fx.Node:
        node = self.graph.call_function(target, args, kwargs)
        fake_args, fake_kwargs = torch.fx.node.map_arg((args, kwargs), lambda n: n.meta["val"])
        with self.fake_mode:
            node.meta["val"] = target(*fake_args, **fake_kwargs)
        node.meta["stack_trace"] = self.anchor.meta.get("stack_trace") or ""
        return node

    def arange(self, extent: int) -> torch.fx.Node:
        node = self.graph.call_function(torch.ops.aten.arange.default, (extent,), {"dtype": torch.int64})
        with self.fake_mode:
            node.meta["val"] = torch.arange(extent, dtype=torch.int64)
        node.meta["stack_trace"] = self.anchor.meta.get("stack_trace") or ""
        return node

    def replace_anchor(self, result: torch.fx.Node) -> None:
        """Let ``result`` stand where the anchor was, and drop the anchor."""
        self.anchor.replace_all_uses_with(result)
        self.graph.erase_node(self.anchor)
