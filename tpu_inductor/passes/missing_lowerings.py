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
  storage positions it writes;
* ``scatter_reduce`` (``sum``, ``prod``, ``mean``, ``amax``, ``amin``; 20 of
  torch-mlir's own e2e tests): torch-mlir cannot legalize its flags; here a
  reduction over a one-hot comparison of the index with every target
  position, while that comparison stays small.
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


# A one-hot scatter compares every index with every target position along the dim.
_MAX_ONE_HOT_ELEMENTS = 1 << 22


def _scatter_reduce_by_one_hot(x, dim: int, index, src, reduce: str, *, include_self: bool = True):
    """``scatter_reduce`` as a masked reduction: along ``dim`` (moved last), target
    ``d`` takes the reduction of the ``src`` values whose index is ``d``.

    Only the block of ``x`` the index spans is touched (its other dims may
    be smaller than ``x``'s). ``mean`` counts ``x``'s own value when
    ``include_self``, as eager does; integer ``mean`` (eager floors) stays the op.
    """
    dim = dim % max(x.dim(), 1)
    if x.dim() == 0 or index.dim() != x.dim() or (reduce == "mean" and not x.is_floating_point()):
        return NotImplemented
    shapes = (*x.shape, *index.shape)
    targets = x.shape[dim]
    if not all(isinstance(v, int) for v in shapes) or index.numel() * targets > _MAX_ONE_HOT_ELEMENTS:
        return NotImplemented
    block = [slice(0, n) if d != dim else slice(None) for d, n in enumerate(index.shape)]
    region = x[tuple(block)].movedim(dim, -1)  # [..., D]
    idx = index.movedim(dim, -1)  # [..., J]
    values = src[tuple(slice(0, n) for n in index.shape)].movedim(dim, -1).to(x.dtype)
    hits = idx.unsqueeze(-1) == torch.arange(targets, device=x.device)  # [..., J, D]
    count = hits.sum(-2)
    spread = values.unsqueeze(-1)
    if reduce in ("sum", "mean"):
        reduced = torch.where(hits, spread, 0).sum(-2).to(x.dtype)
    elif reduce == "prod":
        reduced = torch.where(hits, spread, 1).prod(-2).to(x.dtype)
    elif reduce in ("amax", "amin"):
        extreme = _lowest(x.dtype) if reduce == "amax" else _highest(x.dtype)
        masked = torch.where(hits, spread, extreme)
        reduced = masked.amax(-2) if reduce == "amax" else masked.amin(-2)
    else:
        return NotImplemented
    if include_self:
        combined = {
            "sum": lambda: region + reduced,
            "prod": lambda: region * reduced,
            "mean": lambda: (region + reduced) / (count + 1).to(x.dtype),
            "amax": lambda: torch.maximum(region, reduced),
            "amin": lambda: torch.minimum(region, reduced),
        }[reduce]()
    else:
        if reduce == "mean":
            reduced = reduced / count.clamp_min(1).to(x.dtype)
        combined = torch.where(count > 0, reduced, region)
    out = combined.movedim(-1, dim)
    if tuple(index.shape[d] for d in range(x.dim()) if d != dim) == tuple(x.shape[d] for d in range(x.dim()) if d != dim):
        return out
    return x.clone().index_put(_block_indices(index.shape, dim, targets, x.device), out)


def _block_indices(shape, dim: int, targets: int, device) -> list[torch.Tensor]:
    """Broadcast aranges that address the block ``x[:shape[0], ..., :, ...]``."""
    sizes = [targets if d == dim else n for d, n in enumerate(shape)]
    indices = []
    for d, n in enumerate(sizes):
        view = [1] * len(sizes)
        view[d] = n
        indices.append(torch.arange(n, device=device).view(view))
    return indices


def _lowest(dtype: torch.dtype):
    return float("-inf") if dtype.is_floating_point else (False if dtype == torch.bool else torch.iinfo(dtype).min)


def _highest(dtype: torch.dtype):
    return float("inf") if dtype.is_floating_point else (True if dtype == torch.bool else torch.iinfo(dtype).max)


MISSING_LOWERING_DECOMPOSITIONS: dict = {
    aten.cumprod.default: _cumprod_by_doubling,
    aten.adaptive_max_pool2d.default: torch._decomp.decomposition_table[aten.adaptive_max_pool2d.default],
    aten.as_strided_scatter.default: _as_strided_scatter_by_index_put,
    aten.scatter_reduce.two: _scatter_reduce_by_one_hot,
}
