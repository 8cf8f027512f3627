"""Rewrite ``as_strided`` of a dense tensor as a view or a gather.

Why: PyTorch's ``group_norm`` decomposition reshapes its statistics with
``as_strided`` (GroupNorm is in ConvNeXt, BiT, Swin, wav2vec2...), and
Longformer builds its overlapping attention chunks with it. torch-mlir
lowers ``as_strided`` to a gather whose indices are a ``dense_resource``
constant, which XLA rejects ("Only dense elements attr are supported"), so
the op ran in eager. Worse, in eager it read the layout of an island's
output (XLA returns row-major tensors) where the traced program had a
transposed one: the wrong elements, silently.

``as_strided`` reads its input's storage, which belongs to the tensor its
input views (itself, unless it is a slice, transpose...). When that tensor is
dense (no gaps, no overlap; any dim order) the storage is it flattened in memory
order: ``permute`` its dims by decreasing stride, flatten, and the element
at storage position ``input.storage_offset() + j`` is ``flat[j]``. The
result is then a ``view`` (contiguous strides) or a gather at ``offset +
sum_k arange(size_k) * stride_k``, computed in the graph rather than stored
as a constant. An ``as_strided`` that reads outside that tensor's elements
(storage of a graph input the graph does not see) is left alone.

Before: ``as_strided(%x, [8, 2, 768, 16], [16384, 4096, 16, 1])``   (x: [8, 1024, 16])
After:  ``index(view(%x, [-1]), [<offset + strided aranges>])``
"""

from __future__ import annotations

import math
from typing import Any, Optional

import torch
import torch.fx
from torch.multiprocessing.reductions import StorageWeakRef

from tpu_inductor.passes.rewrite import GraphBuilder

aten = torch.ops.aten


def as_strided_as_gather(gm: torch.fx.GraphModule) -> torch.fx.GraphModule:
    graph, changed = gm.graph, False
    # Readers first: an as_strided of an as_strided reads the storage the inner one
    # views, which the inner one no longer does once it is a gather.
    for node in reversed(list(graph.find_nodes(op="call_function", target=aten.as_strided.default))):
        view, size, stride = node.args[:3]
        offset = (node.args[3] if len(node.args) > 3 else node.kwargs.get("storage_offset")) or 0
        source = _storage_owner(view)
        value = source.meta.get("val")
        if not _all_ints(size, stride, [offset]) or not isinstance(value, torch.Tensor):
            continue
        if not _all_ints(value.shape, value.stride(), [value.storage_offset()]):
            continue
        order = _memory_order(value)
        start = offset - value.storage_offset()
        if order is None or not _reads_within(size, stride, start, value.numel()):
            continue
        builder = GraphBuilder(graph, node)
        with graph.inserting_before(node):
            flat = _flatten_in_memory_order(builder, source, order)
            if list(stride) == _contiguous_strides(size):
                count = math.prod(size)
                if (start, count) != (0, value.numel()):
                    flat = builder.call(aten.slice.Tensor, flat, 0, start, start + count)
                result = builder.call(aten.view.default, flat, list(size))
            else:
                result = builder.call(aten.index.Tensor, flat, [_strided_index(builder, size, stride, start)])
        builder.replace_anchor(result)
        changed = True
    if changed:
        gm.recompile()
    return gm


LEFT_IN_EAGER = (
    "as_strided reads storage beyond a dense tensor of the graph; it runs eagerly, "
    "with the views it reads through, on the real storage"
)


def eager_storage_reads(gm: torch.fx.GraphModule) -> dict[torch.fx.Node, str]:
    """The ``as_strided`` calls this pass left, and the views between each and
    its storage owner: they must run eagerly.

    An island returns fresh row-major tensors, so an ``as_strided`` running
    eagerly on an island's output would read another layout than the traced
    one: wrong elements, silently. Keeping its view chain in eager makes it
    read the storage the program meant.
    """
    keep: dict[torch.fx.Node, str] = {}
    for node in gm.graph.find_nodes(op="call_function", target=aten.as_strided.default):
        keep[node] = LEFT_IN_EAGER
        owner, view = _storage_owner(node.args[0]), node.args[0]
        while view is not owner:
            keep[view] = LEFT_IN_EAGER
            view = view.args[0]
    return keep


def _storage_owner(node: torch.fx.Node) -> torch.fx.Node:
    """The furthest producer up ``node``'s first-argument chain that shares its storage.

    ``as_strided`` of a slice or transpose reads the storage of the tensor it
    views, including elements outside the view; that tensor is the one to
    flatten.
    """
    storage = _storage(node)
    while storage is not None and node.op == "call_function" and node.args:
        parent = node.args[0]
        if not isinstance(parent, torch.fx.Node) or _storage(parent) != storage:
            break
        node = parent
    return node


def _storage(node: torch.fx.Node) -> Optional[StorageWeakRef]:
    value = node.meta.get("val")
    return StorageWeakRef(value.untyped_storage()) if isinstance(value, torch.Tensor) else None


def _memory_order(value: torch.Tensor) -> Optional[list[int]]:
    """The dims from outermost to innermost in memory, if ``value`` is dense."""
    order = sorted(range(value.dim()), key=lambda d: (-value.stride(d) if value.shape[d] > 1 else 0))
    order = [d for d in order if value.shape[d] > 1] + [d for d in order if value.shape[d] <= 1]
    expected = 1
    for dim in reversed(order):
        if value.shape[dim] > 1 and value.stride(dim) != expected:
            return None
        expected *= value.shape[dim]
    return order


def _reads_within(size: list[int], stride: list[int], start: int, numel: int) -> bool:
    """Whether every position the view reads lies in ``[0, numel)`` of the flattened input."""
    if any(extent == 0 for extent in size):
        return 0 <= start <= numel
    lowest = start + sum((extent - 1) * step for extent, step in zip(size, stride) if step < 0)
    highest = start + sum((extent - 1) * step for extent, step in zip(size, stride) if step > 0)
    return 0 <= lowest and highest < numel


def _flatten_in_memory_order(builder: GraphBuilder, source: torch.fx.Node, order: list[int]) -> torch.fx.Node:
    if order != sorted(order):
        # A real copy in memory order, so the graph stays valid if this runs eagerly.
        permuted = builder.call(aten.permute.default, source, order)
        source = builder.call(aten.clone.default, permuted, memory_format=torch.contiguous_format)
    return builder.call(aten.view.default, source, [-1])


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
