"""Ops torch-mlir has no StableHLO lowering for, as ATen ops it lowers.

Why: each ran in eager PyTorch between islands (found by torch-mlir's own
e2e suite, ``benchmarks/torch_mlir_e2e.py``):

* ``cumprod``: PyTorch's decomposition is ``prims.prod`` over growing
  prefixes, which does not lower either; here it is a scan by doubling;
* ``adaptive_max_pool2d``: torch-mlir's conversion fails ("condition must
  be true"); PyTorch's own decomposition (a max over gathered windows)
  lowers, indices included;
* ``as_strided_scatter`` (the backward of every ``as_strided``): torch-mlir
  cannot legalize its integer arguments; here an ``index_put`` at the
  storage positions it writes.
"""

from __future__ import annotations

import itertools
import math

import torch

aten = torch.ops.aten


def _cumprod_by_doubling(x: torch.Tensor, dim: int, dtype=None) -> torch.Tensor:
    """``cumprod`` as ``log2(n)`` multiplications by the running product shifted
    by 1, 2, 4, ... positions (Hillis-Steele).

    Integer products are exact in any order (int64 multiplication wraps the
    same way); floating ones associate differently from eager's running
    product, within a few ulps. Integer and bool inputs promote to int64, as
    eager's kernel does.
    """
    if dtype is None and not (x.is_floating_point() or x.is_complex()):
        dtype = torch.int64
    out = x.to(dtype) if dtype is not None else x.clone()
    if out.dim() == 0:
        return out
    dim = dim % out.dim()
    length = out.shape[dim]
    if not isinstance(length, int):
        return NotImplemented  # symbolic length: the op itself
    shift = 1
    while shift < length:
        ones_shape = list(out.shape)
        ones_shape[dim] = shift
        shifted = torch.cat([out.new_ones(ones_shape), out.narrow(dim, 0, length - shift)], dim)
        out = out * shifted
        shift *= 2
    return out


# Positions are listed and checked for overlap in Python, at trace time: a bound on that work.
_MAX_SCATTERED_POSITIONS = 1 << 16


def _as_strided_scatter_by_index_put(x: torch.Tensor, src: torch.Tensor, size, stride, storage_offset=None):
    """``as_strided_scatter`` of a contiguous tensor as an ``index_put`` of ``src``
    at storage positions ``offset + sum_k i_k * stride_k``.

    Only where no position is written twice (eager's overlapping copy has
    an order; a scatter's does not) and ``x`` is its storage laid out
    row-major, as the fresh tensors a backward scatters into are.
    """
    offset = storage_offset or 0
    if not all(isinstance(v, int) for v in (*size, *stride, offset, *x.shape)) or not x.is_contiguous():
        return NotImplemented
    if math.prod(size) > _MAX_SCATTERED_POSITIONS:
        return NotImplemented
    positions = [offset + sum(i * step for i, step in zip(index, stride)) for index in itertools.product(*map(range, size))]
    if len(set(positions)) != len(positions) or any(p < 0 or p >= x.numel() for p in positions):
        return NotImplemented
    index = torch.full((), offset, dtype=torch.int64, device=x.device)
    for extent, step in zip(size, stride):  # the same positions, built in the graph
        index = index.unsqueeze(-1) + torch.arange(extent, device=x.device) * step
    return aten.index_put.default(x.reshape(-1), [index.reshape(-1)], src.reshape(-1).to(x.dtype)).view(x.shape)


MISSING_LOWERING_DECOMPOSITIONS: dict = {
    aten.cumprod.default: _cumprod_by_doubling,
    aten.adaptive_max_pool2d.default: torch._decomp.decomposition_table[aten.adaptive_max_pool2d.default],
    aten.as_strided_scatter.default: _as_strided_scatter_by_index_put,
}
