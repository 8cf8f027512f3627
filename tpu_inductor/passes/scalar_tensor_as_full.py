"""Rewrite ``aten.scalar_tensor`` (and ``prims.scalar_tensor``) as a 0-d ``aten.full``.

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

# prims' own is what PyTorch's decomposition of ``xlogy(x, 2.0)`` emits, and
# torch-mlir has no lowering for it at all.
_SCALAR_TENSORS = (aten.scalar_tensor.default, torch.ops.prims.scalar_tensor.default)


def scalar_tensor_as_full(gm: torch.fx.GraphModule) -> torch.fx.GraphModule:
    changed = False
    nodes = [node for target in _SCALAR_TENSORS for node in gm.graph.find_nodes(op="call_function", target=target)]
    for node in nodes:
        (value,) = node.args
        kwargs = {k: v for k, v in node.kwargs.items() if k in ("dtype", "layout", "device", "pin_memory")}
        value_meta = node.meta.get("val")
        if kwargs.get("dtype") is None and isinstance(value_meta, torch.Tensor):
            kwargs["dtype"] = value_meta.dtype  # the dtype the number gave it, as full would not
        replace_with_call(gm, node, aten.full.default, ([], value), kwargs)
        changed = True
    if changed:
        gm.recompile()
    return gm
