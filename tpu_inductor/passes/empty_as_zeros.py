"""Allocate with zeros instead of ``empty`` / ``empty_strided`` / ``empty_like``.

Why: an uninitialized allocation lowers to ``tensor.empty``, which XLA
rejects once it reaches an island output (``log_sigmoid_forward``'s unused
buffer, ``new_zeros`` built as ``empty_strided`` + ``fill``), and
``empty_strided`` with symbolic strides becomes a ``torch.runtime.assert``
with no StableHLO lowering. Zeros are a valid value for memory whose contents
are undefined, and XLA folds them away wherever they are overwritten.

Before: ``empty_strided([4, 5], [5, 1], dtype=f32)``; ``empty_like(%x)``; ``new_empty_strided(%x, [4], [1])``
After:  ``full([4, 5], 0, dtype=f32)``; ``full_like(%x, 0)``; ``new_full(%x, [4], 0)``

Strides (``empty_strided``, ``empty_permuted``) are dropped: XLA has no
layouts to honour, and every reader of uninitialized memory writes it first.
"""

from __future__ import annotations

import torch
import torch.fx

from tpu_inductor.passes.rewrite import replace_with_call

aten = torch.ops.aten

# Allocation -> the op that fills the same shape with a value.
_ALLOCATIONS = {
    aten.empty.memory_format: aten.full.default,
    aten.empty_strided.default: aten.full.default,
    aten.empty_permuted.default: aten.full.default,
    aten.empty_like.default: aten.full_like.default,
    aten.new_empty.default: aten.new_full.default,
    aten.new_empty_strided.default: aten.new_full.default,
}
_KWARGS = {
    aten.full.default: ("dtype", "layout", "device", "pin_memory"),
    aten.full_like.default: ("dtype", "layout", "device", "pin_memory", "memory_format"),
    aten.new_full.default: ("dtype", "layout", "device", "pin_memory"),
}
# How many leading arguments the fill keeps before its value: (size) or
# (like) for the first two, (self, size) for new_full.
_KEPT_ARGS = {aten.full.default: 1, aten.full_like.default: 1, aten.new_full.default: 2}


def empty_as_zeros(gm: torch.fx.GraphModule) -> torch.fx.GraphModule:
    changed = False
    for node in list(gm.graph.nodes):
        fill = _ALLOCATIONS.get(node.target) if node.op == "call_function" else None
        if fill is None:
            continue
        kwargs = {k: v for k, v in node.kwargs.items() if k in _KWARGS[fill]}
        replace_with_call(gm, node, fill, (*node.args[: _KEPT_ARGS[fill]], 0), kwargs)
        changed = True
    if changed:
        gm.recompile()
    return gm
