"""Rewrite ``aten.scalar_tensor`` as a 0-d ``aten.full``.

Why: torch-mlir folds ``sign`` and comparisons of a ``scalar_tensor`` constant
wrongly: ``sign(scalar_tensor(3.0))`` came back ``-1`` and
``scalar_tensor(3.0) < 0`` came back ``True`` (torch-mlir 20261001), a silent
wrong number. PyTorch's own decompositions emit ``scalar_tensor`` often. A
0-d ``full`` with the same value and dtype lowers and folds correctly.

Before: ``%c = aten.scalar_tensor(3.0, dtype=f32)``
After:  ``%c = aten.full([], 3.0, dtype=f32)``
"""

from __future__ import annotations

import torch
import torch.fx

from tpu_inductor.passes.rewrite import replace_with_call

aten = torch.ops.aten


def scalar_tensor_as_full(gm: torch.fx.GraphModule) -> torch.fx.GraphModule:
    changed = False
    for node in list(gm.graph.find_nodes(op="call_function", target=aten.scalar_tensor.default)):
        (value,) = node.args
        kwargs = {k: v for k, v in node.kwargs.items() if k in ("dtype", "layout", "device", "pin_memory")}
        replace_with_call(gm, node, aten.full.default, ([], value), kwargs)
        changed = True
    if changed:
        gm.recompile()
    return gm
