"""Flat writes, sorted lookups and scatters with a reduce, as ops torch-mlir lowers.

Why: each ran in eager PyTorch between islands (found compiling small
programs as users write them, 2026-12-08), some only after a failed
lowering and a warning:

* ``put`` (``Tensor.put``, ``put_``): no StableHLO lowering; it is an
  ``index_put`` into the flattened tensor, negative indices counted from the
  end as eager counts them;
* ``searchsorted``: no lowering; against a 1-d sequence it is ``bucketize``
  (PyTorch's decomposition, a binary search, lowers), against a batch of
  sequences (or an empty one) a count of the elements before each value (``< v`` for the left
  side, ``<= v`` for the right, as eager's binary search finds), ``sorter``
  applied first;
* ``embedding_renorm`` (``nn.Embedding(..., max_norm=...)`` rescales the
  rows it looks up, in place): torch-mlir cannot legalize it; it is the
  looked-up rows' norms and an ``index_put`` of the rescaled rows;
* ``scatter`` with ``reduce="add"``/``"multiply"`` (its ``value`` and ``src``
  forms): torch-mlir cannot legalize the reduce argument; it is
  ``scatter_reduce`` with ``sum``/``prod`` over the tensor's own values.
"""

from __future__ import annotations

from typing import Optional

import torch

aten = torch.ops.aten


def _put_by_index_put(self: torch.Tensor, index: torch.Tensor, source: torch.Tensor, accumulate: bool = False):
    flat_index = index.flatten()
    flat_index = torch.where(flat_index < 0, flat_index + self.numel(), flat_index)
    flat = self.flatten().index_put((flat_index,), source.flatten(), accumulate)
    return flat.view(self.shape)


def _searchsorted_by_counting(
    sorted_sequence: torch.Tensor,
    values: torch.Tensor,
    *,
    out_int32: bool = False,
    right: bool = False,
    side: Optional[str] = None,
    sorter: Optional[torch.Tensor] = None,
):
    if sorter is not None:
        sorted_sequence = sorted_sequence.gather(-1, sorter)
    right = right or side == "right"
    if sorted_sequence.dim() == 1 and sorted_sequence.numel() > 0:  # bucketize cannot search nothing
        return aten.bucketize.Tensor(values, sorted_sequence, out_int32=out_int32, right=right)
    # A batch: sequences [..., N] against values [..., M].
    before = sorted_sequence.unsqueeze(-2) <= values.unsqueeze(-1) if right else (
        sorted_sequence.unsqueeze(-2) < values.unsqueeze(-1)
    )
    return before.sum(-1, dtype=torch.int32 if out_int32 else torch.int64)


def _searchsorted_scalar(sorted_sequence: torch.Tensor, value, **kwargs):
    scalar = torch.scalar_tensor(value, dtype=sorted_sequence.dtype)
    return _searchsorted_by_counting(sorted_sequence, scalar, **kwargs)


_REDUCTIONS = {"add": "sum", "multiply": "prod"}


def _scatter_src_with_reduce(self: torch.Tensor, dim: int, index: torch.Tensor, src: torch.Tensor, reduce: str):
    return aten.scatter_reduce.two(self, dim, index, src, _REDUCTIONS[reduce], include_self=True)


def _scatter_value_with_reduce(self: torch.Tensor, dim: int, index: torch.Tensor, value, reduce: str):
    source = torch.full(index.shape, value, dtype=self.dtype, device=self.device)
    return _scatter_src_with_reduce(self, dim, index, source, reduce)


def _embedding_renorm_by_index_put(self: torch.Tensor, indices: torch.Tensor, max_norm: float, norm_type: float):
    rows_read = indices.flatten()
    rows = self.index_select(0, rows_read)
    norms = torch.linalg.vector_norm(rows, norm_type, dim=-1, keepdim=True)
    # eager's kernel: scaled by max_norm / (norm + 1e-7) where the norm is over max_norm
    scale = torch.where(norms > max_norm, max_norm / (norms + 1e-7), 1.0)
    return self.index_put((rows_read,), rows * scale)  # a repeated row writes the same value


LOOKUP_DECOMPOSITIONS: dict = {
    aten.embedding_renorm.default: _embedding_renorm_by_index_put,
    aten.put.default: _put_by_index_put,
    aten.searchsorted.Tensor: _searchsorted_by_counting,
    aten.searchsorted.Scalar: _searchsorted_scalar,
    aten.scatter.value_reduce: _scatter_value_with_reduce,
    aten.scatter.reduce: _scatter_src_with_reduce,
}
