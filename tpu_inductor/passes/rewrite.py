"""The one FX edit most rewrite passes make: swap a node for another call."""

from __future__ import annotations

from typing import Any

import torch.fx


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
