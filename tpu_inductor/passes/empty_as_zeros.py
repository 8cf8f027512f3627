"""Allocate with ``full(size, 0)`` instead of ``empty`` / ``empty_strided``.

Why: an uninitialized allocation lowers to ``tensor.empty``, which XLA
rejects once it reaches an island output (``log_sigmoid_forward``'s unused
buffer, ``new_zeros`` built as ``empty_strided`` + ``fill``), and
``empty_strided`` with symbolic strides becomes a ``torch.runtime.assert``
with no StableHLO lowering. Zeros are a valid value for memory whose contents
are undefined, and XLA folds them away wherever they are overwritten.

Before: ``empty_strided([4, 5], [5, 1], dtype=f32)``
After:  ``full([4, 5], 0, dtype=f32)``
"""

from __future__ import annotations

import torch
import torch.fx

from tpu_inductor.passes.rewrite import replace_with_call

aten = torch.ops.aten

_ALLOCATIONS = (aten.empty.memory_format, aten.empty_strided.default)
_FULL_KWARGS = ("dtype", "layout", "device", "pin_memory")


def empty_as_zeros(gm: torch.fx.GraphModule) -> torch.fx.GraphModule:
    changed = False
    for node in list(gm.graph.nodes):
        if node.op != "call_function" or node.target not in _ALLOCATIONS:
            continue
        kwargs = {k: v for k, v in node.kwargs.items() if k in _FULL_KWARGS}
        replace_with_call(gm, node, aten.full.default, (node.args[0], 0), kwargs)
        changed = True
    if changed:
        gm.recompile()
    return gm
