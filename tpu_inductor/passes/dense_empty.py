"""Allocate dense buffers with ``empty`` rather than ``empty_strided``.

Why: decompositions allocate with ``empty_strided(size, stride)`` even when
the strides are the row-major default. With static sizes torch-mlir checks
that at compile time; with symbolic sizes it cannot, emits a
``torch.runtime.assert "not all strides are default"`` that has no StableHLO
lowering, and the op (and everything around it) falls back to eager. When
the strides are provably the default ones, ``empty`` says the same thing.

Before: ``empty_strided([s0, s0], [s0, 1], dtype=torch.bool)``;
after: ``empty.memory_format([s0, s0], dtype=torch.bool)``.
"""

from __future__ import annotations

import sympy
import torch
import torch.fx
from torch._prims_common import make_contiguous_strides_for

from tpu_inductor.passes.padding_safety import expr_of
from tpu_inductor.passes.rewrite import replace_with_call

aten = torch.ops.aten


def dense_empty(gm: torch.fx.GraphModule) -> torch.fx.GraphModule:
    changed = False
    for node in list(gm.graph.find_nodes(op="call_function", target=aten.empty_strided.default)):
        val = node.meta.get("val")
        if not isinstance(val, torch.Tensor):
            continue
        default = make_contiguous_strides_for(val.shape)
        if not all(sympy.expand(expr_of(a) - expr_of(b)) == 0 for a, b in zip(val.stride(), default)):
            continue
        replace_with_call(gm, node, aten.empty.memory_format, (node.args[0],), dict(node.kwargs))
        changed = True
    if changed:
        gm.recompile()
    return gm
