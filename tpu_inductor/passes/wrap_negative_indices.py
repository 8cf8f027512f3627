"""Wrap negative index tensors before ``index`` and ``index_put``.

Why: PyTorch counts negative indices from the end (``x[tensor([-1])]`` is the
last row); torch-mlir's StableHLO gather/scatter took them as out of range and
returned zeros (``arange(5)[tensor([-1, -2, 0])]`` gave ``[0, 0, 0]``), a
silent wrong number. We add ``size`` to negative entries first, which is
what eager does; XLA fuses the three elementwise ops into the gather.

Before: ``aten.index(%x, [%i])``
After:  ``%w = aten.where(aten.lt(%i, 0), aten.add(%i, x.size(0)), %i)``;
        ``aten.index(%x, [%w])``
"""

from __future__ import annotations

from typing import Union

import torch
import torch.fx
from tpu_inductor.torch_api import detect_fake_mode

aten = torch.ops.aten

# Ops whose second argument is a list of optional index tensors, one per leading dim.
_INDEXING_OPS = (aten.index.Tensor, aten.index_put.default, aten._unsafe_index_put.default)


def wrap_negative_indices(gm: torch.fx.GraphModule) -> torch.fx.GraphModule:
    graph, changed = gm.graph, False
    for node in list(graph.nodes):
        if node.op != "call_function" or node.target not in _INDEXING_OPS:
            continue
        source, indices = node.args[0], node.args[1]
        shape = source.meta["val"].shape
        wrapped = list(indices)
        for dim, index in enumerate(indices):
            value = index.meta.get("val") if isinstance(index, torch.fx.Node) else None
            if value is None or value.dtype == torch.bool or value.dtype.is_floating_point:
                continue
            with graph.inserting_before(node):
                wrapped[dim] = wrapped_index(graph, source, dim, shape[dim], index, value)
            changed = True
        node.args = (source, wrapped, *node.args[2:])
    if changed:
        gm.recompile()
    return gm


def wrapped_index(
    graph: torch.fx.Graph,
    source: torch.fx.Node,
    dim: int,
    size: Union[int, torch.SymInt],
    index: torch.fx.Node,
    value: torch.Tensor,
) -> torch.fx.Node:
    """``where(index < 0, index + size, index)``, with FakeTensor metadata."""
    if isinstance(size, torch.SymInt):
        size_node = graph.call_function(aten.sym_size.int, (source, dim))
        size_node.meta["val"] = size
    else:
        size_node = size
    negative = graph.call_function(aten.lt.Scalar, (index, 0))
    shifted = graph.call_function(aten.add.Tensor, (index, size_node))
    result = graph.call_function(aten.where.self, (negative, shifted, index))
    fake_mode = detect_fake_mode([value])
    with fake_mode:
        negative.meta["val"] = value < 0
        shifted.meta["val"] = value + size
        result.meta["val"] = torch.where(negative.meta["val"], shifted.meta["val"], value)
    for new in (negative, shifted, result):
        new.meta["stack_trace"] = index.meta.get("stack_trace") or ""
    return result
