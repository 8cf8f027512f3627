"""Rewrite ``x[mask] = scalar`` (``index_put`` with one boolean mask) as ``where``.

Why: torch-mlir fails to lower ``index_put`` whose index is a boolean mask
("failed to legalize operation 'torch.constant.int'"), and models write
``input_ids[image_mask] = 0`` (Gemma 3, every vision-language model that
swaps placeholder tokens): the whole assignment ran in eager. With one value
for every selected element and no accumulation, the assignment is
elementwise: ``where(mask, value, x)``, with the mask broadcast over the dims
it does not index.

Before: ``index_put(%x, [%mask], %zero)``        (mask: bool[2, 16], x: [2, 16])
After:  ``where(%mask, %zero, %x)``
"""

from __future__ import annotations

import torch
import torch.fx

from tpu_inductor.passes.rewrite import GraphBuilder

aten = torch.ops.aten

_INDEX_PUT = (aten.index_put.default, aten._unsafe_index_put.default)


def mask_index_put_as_where(gm: torch.fx.GraphModule) -> torch.fx.GraphModule:
    graph, changed = gm.graph, False
    for node in list(graph.nodes):
        if node.op != "call_function" or node.target not in _INDEX_PUT:
            continue
        source, indices, values = node.args[:3]
        accumulate = node.args[3] if len(node.args) > 3 else node.kwargs.get("accumulate", False)
        if accumulate or len(indices) != 1 or not isinstance(indices[0], torch.fx.Node):
            continue
        x, mask, value = (n.meta.get("val") for n in (source, indices[0], values))
        if not all(isinstance(t, torch.Tensor) for t in (x, mask, value)):
            continue
        if mask.dtype != torch.bool or value.numel() != 1 or tuple(mask.shape) != tuple(x.shape[: mask.dim()]):
            continue
        trailing = x.dim() - mask.dim()
        builder = GraphBuilder(graph, node)
        with graph.inserting_before(node):
            condition = indices[0]
            if trailing:
                condition = builder.call(aten.view.default, condition, [*mask.shape] + [1] * trailing)
            scalar = builder.call(aten.view.default, values, [])
            builder.replace_anchor(builder.call(aten.where.self, condition, scalar, source))
        changed = True
    if changed:
        gm.recompile()
    return gm
