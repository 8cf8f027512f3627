"""``aten.view`` left to eager becomes ``aten.reshape``.

Why: a view that runs in eager PyTorch between islands reads a tensor whose
strides may differ from the ones it was traced with: an island returns its
results dense and row-major, an eager kernel chosen by measurement may
return channels-last. ``view`` then raises ``view size is not compatible
with input tensor's size and stride`` in the user's call (caformer_s18's
training step). ``reshape`` is ``view`` wherever ``view`` works, and copies
only where it would have raised, so no result changes.

Runs on the graph after partitioning, so it sees only the views left to
eager; views inside an island are XLA's to lay out.
"""

from __future__ import annotations

import torch
import torch.fx

aten = torch.ops.aten

_VIEWS = (aten.view.default, aten._unsafe_view.default)


def eager_views_as_reshape(gm: torch.fx.GraphModule) -> torch.fx.GraphModule:
    changed = False
    for view in _VIEWS:
        for node in gm.graph.find_nodes(op="call_function", target=view):
            node.target = aten.reshape.default
            changed = True
    if changed:
        gm.recompile()
    return gm
