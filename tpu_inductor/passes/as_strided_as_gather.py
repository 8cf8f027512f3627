"""Rewrite ``as_strided`` of a contiguous tensor as a view or a gather.

Why: PyTorch's ``group_norm`` decomposition reshapes its statistics with
``as_strided`` (GroupNorm is in ConvNeXt, BiT, Swin, wav2vec2...), and
torch-mlir lowers ``as_strided`` to a gather whose indices are a
``dense_resource`` constant, which XLA rejects ("Only dense elements attr are
supported"): every GroupNorm cut its graph into islands around an eager op.
On a contiguous input at storage offset 0, ``as_strided`` reads the flattened
tensor, so the same elements come from a ``view`` (contiguous strides) or
from a gather at ``offset + sum_k arange(size_k) * stride_k``, computed in the
graph rather than stored as a constant.

Before: ``as_strided(%x, [2, 16], [16, 1])``              (x: [2, 4, 4, 1])
After:  ``view(view(%x, [-1]), [2, 16])``
"""

from __future__ import annotations

import math
from typing import Any

import torch
import torch.fx

from tpu_inductor.passes.rewrite import GraphBuilder

aten = torch.ops.aten


def as_strided_as_gather(gm: torch.fx.GraphModule) -> torch.fx.GraphModule:
    graph, changed = gm.graph, False
    for node in list(graph.find_nodes(op="call_function", target=aten.as_strided.default)):
        source, size, stride = node.args[:3]
        offset = (node.args[3] if len(node.args) > 3 else node.kwargs.get("storage_offset")) or 0
        value = source.meta.get("val")
        if not _all_ints(size, stride, [offset]) or not isinstance(value, torch.Tensor):
            continue
        if not _all_ints(value.shape) or not value.is_contiguous() or value.storage_offset() != 0:
            continue
        builder = GraphBuilder(graph, node)
        with graph.inserting_before(node):
            flat = builder.call(aten.view.default, source, [-1])
            if list(stride) == _contiguous_strides(size):
                count = math.prod(size)
                if (offset, count) != (0, value.numel()):
                    flat = builder.call(aten.slice.Tensor, flat, 0, offset, offset + count)
                result = builder.call(aten.view.default, flat, list(size))
            else:
                result = builder.call(aten.index.Tensor, flat, [_strided_index(builder, size, stride, offset)])
        builder.replace_anchor(result)
        changed = True
    if changed:
        gm.recompile()
    return gm


def _strided_index(builder: GraphBuilder, size: list[int], stride: list[int], offset: int) -> torch.fx.Node:
    """``offset + sum_k arange(size_k) * stride_k``, broadcast to ``size``."""
    index = None
    for dim, (extent, step) in enumerate(zip(size, stride)):
        term = builder.call(aten.mul.Tensor, builder.arange(extent), step)
        shape = [1] * len(size)
        shape[dim] = extent
        term = builder.call(aten.view.default, term, shape)
        index = term if index is None else builder.call(aten.add.Tensor, index, term)
    if index is None:  # 0-d result
        index = builder.call(aten.view.default, builder.arange(1), [])
    return builder.call(aten.add.Tensor, index, offset) if offset else index



def _contiguous_strides(size: list[int]) -> list[int]:
    strides, running = [], 1
    for extent in reversed(size):
        strides.append(running)
        running *= max(extent, 1)
    return strides[::-1]


def _all_ints(*groups: Any) -> bool:
    return all(isinstance(v, int) for group in groups for v in group)
