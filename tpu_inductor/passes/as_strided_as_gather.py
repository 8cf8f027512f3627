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
from torch._guards import detect_fake_mode

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
        builder = _Builder(graph, node)
        with graph.inserting_before(node):
            flat = builder.call(aten.view.default, source, [-1])
            if list(stride) == _contiguous_strides(size):
                count = math.prod(size)
                if (offset, count) != (0, value.numel()):
                    flat = builder.call(aten.slice.Tensor, flat, 0, offset, offset + count)
                result = builder.call(aten.view.default, flat, list(size))
            else:
                result = builder.call(aten.index.Tensor, flat, [builder.strided_index(size, stride, offset)])
        node.replace_all_uses_with(result)
        graph.erase_node(node)
        changed = True
    if changed:
        gm.recompile()
    return gm


class _Builder:
    """Inserts calls with FakeTensor values, so later passes and lowering see them."""

    def __init__(self, graph: torch.fx.Graph, anchor: torch.fx.Node) -> None:
        self.graph = graph
        self.anchor = anchor
        self.fake_mode = detect_fake_mode([anchor.meta.get("val")])

    def call(self, target: Any, *args: Any) -> torch.fx.Node:
        node = self.graph.call_function(target, args)
        fake_args = torch.fx.node.map_arg(args, lambda n: n.meta["val"])
        with self.fake_mode:
            node.meta["val"] = target(*fake_args)
        node.meta["stack_trace"] = self.anchor.meta.get("stack_trace") or ""
        return node

    def strided_index(self, size: list[int], stride: list[int], offset: int) -> torch.fx.Node:
        """``offset + sum_k arange(size_k) * stride_k``, broadcast to ``size``."""
        index = None
        for dim, (extent, step) in enumerate(zip(size, stride)):
            term = self.call(aten.mul.Tensor, self._arange(extent), step)
            shape = [1] * len(size)
            shape[dim] = extent
            term = self.call(aten.view.default, term, shape)
            index = term if index is None else self.call(aten.add.Tensor, index, term)
        if index is None:  # 0-d result
            index = self.call(aten.view.default, self._arange(1), [])
        return self.call(aten.add.Tensor, index, offset) if offset else index

    def _arange(self, extent: int) -> torch.fx.Node:
        node = self.graph.call_function(aten.arange.default, (extent,), {"dtype": torch.int64})
        with self.fake_mode:
            node.meta["val"] = torch.arange(extent, dtype=torch.int64)
        return node


def _contiguous_strides(size: list[int]) -> list[int]:
    strides, running = [], 1
    for extent in reversed(size):
        strides.append(running)
        running *= max(extent, 1)
    return strides[::-1]


def _all_ints(*groups: Any) -> bool:
    return all(isinstance(v, int) for group in groups for v in group)
