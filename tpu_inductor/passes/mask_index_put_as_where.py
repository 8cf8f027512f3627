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

:data:`MASK_INDEX_PUT_DECOMPOSITIONS` (in the decomposition table) covers
the rest of one-mask ``index_put``: one value per selected row, or
``accumulate=True`` (torch-mlir's e2e ``IndexPutBoolMask*``: "The size of
tensor a (3) must match the size of tensor b (-9223372036854775808)", the
data-dependent count of selected rows). Selected row ``r`` takes value
``cumsum(mask)[r] - 1``, the order eager's ``nonzero`` lists them in: a
gather and a ``where``, static shapes.
"""

from __future__ import annotations

import torch
import torch.fx

from tpu_inductor.passes.rewrite import GraphBuilder

aten = torch.ops.aten

_INDEX_PUT = (aten.index_put.default, aten._unsafe_index_put.default)


def _mask_index_put_by_gather(x: torch.Tensor, indices, values: torch.Tensor, accumulate: bool = False):
    """``index_put(x, [mask], values, accumulate)`` with a boolean ``mask`` over
    ``x``'s leading dims, as ``where(mask, values[cumsum(mask) - 1], x)``.

    ``values`` either broadcasts to every selected row (no leading dim, or a
    leading dim of 1) or has one row per selected element (floating dtypes
    only: eager raises unless exactly as many are selected, and here such a
    call returns all NaN, which an integer result could not). Each position is
    written at most once, so ``accumulate`` is one add, as in eager. The
    single-value assignment is left to :func:`mask_index_put_as_where`.
    """
    if len(indices) != 1 or not isinstance(indices[0], torch.Tensor):
        return NotImplemented
    mask = indices[0]
    if mask.dtype != torch.bool or mask.dim() == 0 or tuple(mask.shape) != tuple(x.shape[: mask.dim()]):
        return NotImplemented
    if (values.numel() == 1 and not accumulate) or values.dtype.is_complex:
        return NotImplemented
    rest = list(x.shape[mask.dim():])
    if not all(isinstance(n, int) for n in (*x.shape, *values.shape)):
        return NotImplemented
    flat_x = x.reshape(-1, *rest)
    flat_mask = mask.reshape(-1, *([1] * len(rest)))
    values = values.to(x.dtype)
    if values.dim() <= len(rest) or values.shape[0] == 1:
        if values.dim() > len(rest):
            values = values[0]
        row = values.expand(rest)  # one value row for every selected position
        placed = row.unsqueeze(0)
    else:
        if values.dim() != len(rest) + 1 or not x.dtype.is_floating_point:
            return NotImplemented  # an integer result could not show a miscount
        if mask.numel() == 0:
            return NotImplemented
        selected = mask.reshape(-1).cumsum(0)
        if values.shape[0] == 0:
            # No row to gather (eager's index_select raises on an empty source):
            # a mask that selects anything is a miscount, NaN below.
            placed = torch.full((1, *rest), float("nan"), dtype=x.dtype, device=x.device)
        else:
            rows = values.expand(values.shape[0], *rest)
            placed = rows.index_select(0, (selected - 1).clamp(0, values.shape[0] - 1))
        # Eager raises when the mask selects another number of rows than
        # values has; an executable cannot raise, so the result is all NaN
        # rather than plausible numbers.
        miscounted = selected[-1] != values.shape[0]
        flat_x = torch.where(miscounted, torch.full_like(flat_x, float("nan")), flat_x)
        placed = torch.where(miscounted, torch.full_like(placed, float("nan")), placed)
    if accumulate:
        placed = flat_x + placed
    return torch.where(flat_mask, placed, flat_x).reshape(x.shape)


MASK_INDEX_PUT_DECOMPOSITIONS: dict = {aten.index_put.default: _mask_index_put_by_gather}


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
