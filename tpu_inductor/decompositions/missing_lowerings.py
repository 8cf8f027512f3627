"""Ops torch-mlir has no StableHLO lowering for, as ATen ops it lowers.

Why: each ran in eager PyTorch between islands (found by torch-mlir's own
e2e suite, ``benchmarks/torch_mlir_e2e.py``):

* ``cumprod``: PyTorch's decomposition is ``prims.prod`` over growing
  prefixes, which does not lower either; here it is a scan by doubling;
* ``as_strided_scatter`` (the backward of every ``as_strided``): torch-mlir
  cannot legalize its integer arguments; here an ``index_put`` at the
  storage positions it writes;
* ``scatter_reduce`` (``sum``, ``prod``, ``mean``, ``amax``, ``amin``; 20 of
  torch-mlir's own e2e tests): torch-mlir cannot legalize its flags; here a
  reduction over a one-hot comparison of the index with every target
  position, while that comparison stays small;
* ``logcumsumexp``: torch-mlir lowers it as ``log(cumsum(exp(x)))``, which
  overflows (``[100., 50.]`` gave ``inf``), so it ran in eager; here a scan
  by doubling with eager's own stable ``log(1 + exp(min - max)) + max`` step;
* ``norm`` over every dim (``norm.Scalar``, ``norm.ScalarOpt_dim`` with
  ``dim=[]``): torch-mlir cannot legalize its ``p``; it is
  ``linalg_vector_norm`` (eager's ``norm`` calls that kernel), which lowers;
* ``upsample_nearest{1,2,3}d_backward``: torch-mlir cannot legalize its
  sizes; here an ``index_add`` of the gradient at each output position's
  source index, computed with eager's float32 arithmetic, one dim at a time;
* a handful of argument corners torch-mlir cannot legalize, each rewritten
  into the same op without it: ``erf`` of integers (computed in the float
  eager returns), ``clamp`` of integers by float bounds (promoted first, as
  eager does), ``index_select`` by a 0-d index (a 1-element one),
  ``embedding``'s backward-only flags (the forward ignores them),
  ``prims.prod`` (``prod`` one dim at a time, as its own eager kernel),
  ``conv_tbc`` (a 1-d convolution), ``trace`` of an empty matrix (zero),
  ``_trilinear`` sized to no elements (that empty tensor), integer
  ``scatter_reduce`` ``mean`` (eager floors the quotient) and ``_int_mm``
  of mixed-sign 8-bit operands (an int32 matmul);
* transposed convolutions with an ``output_padding`` above 1: torch-mlir
  inferred an output one row short and one column long ("inferred shape
  '[1, 1, 197, 227]' is incompatible with ... 198x226"); here the forward
  convolution of the stride-spread, padded input with the flipped kernel.
"""

from __future__ import annotations

import itertools
import math
from typing import Optional, Sequence

import numpy as np
import torch

from tpu_inductor.torch_api import pytorch_decomposition

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


def _log_add_exp(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """Eager's ``_log_add_exp_helper`` (``ReduceOpsKernel.cpp``), elementwise.

    ``log1p(exp(min - max)) + max`` never exponentiates a positive number, so
    it cannot overflow; NaN in either propagates (``minimum``/``maximum`` do,
    as its ``isnan(y) ? y : std::min(x, y)`` does), and two equal infinities
    give ``x``, where the formula would give NaN.
    """
    low, high = torch.minimum(x, y), torch.maximum(x, y)
    combined = torch.log1p(torch.exp(low - high)) + high
    return torch.where((low != high) | torch.isfinite(low), combined, x)


def _logcumsumexp_by_doubling(x: torch.Tensor, dim: int) -> torch.Tensor:
    """``logcumsumexp`` as ``log2(n)`` log-add-exps with the running result
    shifted by 1, 2, 4, ... positions (Hillis-Steele, as :func:`_cumprod_by_doubling`).

    The shifted-in positions are ``-inf``, which the step maps to the other
    operand exactly. Eager adds in sequence; this adds in a tree: a few ulps
    apart. Half-precision inputs are scanned in float32 and rounded once, as
    eager's kernel accumulates them in float32. Only real floating inputs
    with a static length (eager rejects integers).
    """
    if not x.is_floating_point() or x.dim() == 0:
        return NotImplemented
    dim = dim % x.dim()
    length = x.shape[dim]
    if not isinstance(length, int):
        return NotImplemented  # symbolic length: the op itself (runs eagerly)
    out = x.to(torch.promote_types(x.dtype, torch.float32))
    shift = 1
    while shift < length:
        pad_shape = list(out.shape)
        pad_shape[dim] = shift
        shifted = torch.cat([out.new_full(pad_shape, float("-inf")), out.narrow(dim, 0, length - shift)], dim)
        out = _log_add_exp(shifted, out)
        shift *= 2
    return out.to(x.dtype)


def _norm_as_vector_norm(x: torch.Tensor, p=2, dim=None, keepdim: bool = False):
    """``norm(x, p)`` over every dim as ``linalg_vector_norm(x, p)``, eager's own kernel for it.

    Real floating inputs only (complex ones have no device path anyway);
    ``norm`` over named dims already lowers and keeps the op.
    """
    if not x.is_floating_point() or (dim is not None and len(dim) > 0):
        return NotImplemented
    return aten.linalg_vector_norm.default(x, 2 if p is None else p, None, keepdim)


def _nearest_sources(in_size: int, out_size: int, scale: Optional[float], device) -> torch.Tensor:
    """Eager's ``nearest_idx`` (``UpSample.h``) for output positions ``0..out-1``.

    Equal sizes map one to one and doubled sizes by ``j >> 1`` (whatever the
    scale); otherwise ``min(floorf(j * s), in - 1)`` with ``s`` the float32
    ``1 / scale`` (or ``in / out`` without one) and the product in float32,
    as eager computes it: the same rounding, so the same source indices.
    """
    positions = torch.arange(out_size, device=device)
    if out_size == in_size:
        return positions
    if out_size == 2 * in_size:
        return positions // 2
    if scale is not None and scale > 0:
        factor = float(np.float32(1.0 / scale))
    else:
        factor = float(np.float32(in_size) / np.float32(out_size))
    product = positions.to(torch.float32) * factor  # the float32 factor is exact as a Python float
    return product.floor().to(torch.int64).clamp_max(in_size - 1)


# floorf(j * s) in float32 is exact for integer j below 2^24.
_MAX_NEAREST_POSITIONS = 1 << 24


def _upsample_nearest_backward(spatial: int):
    """``upsample_nearest{spatial}d_backward`` as one ``index_add`` per spatial dim.

    The gradient of input position ``i`` is the sum of the output gradients
    whose source index is ``i``; summed one dim at a time (the sum is
    separable), in another order than eager's loop: a few ulps. Half types
    accumulate in float32 and round once, as eager's kernel does.
    """

    def decomposition(grad_output: torch.Tensor, output_size: Sequence[int], input_size: Sequence[int], *scales):
        sizes = [*output_size, *input_size, *grad_output.shape]
        if not grad_output.is_floating_point() or not all(isinstance(v, int) for v in sizes):
            return NotImplemented
        if len(output_size) != spatial or len(input_size) != spatial + 2 or max(output_size) >= _MAX_NEAREST_POSITIONS:
            return NotImplemented
        scales = list(scales) + [None] * (spatial - len(scales))
        grad = grad_output.to(torch.promote_types(grad_output.dtype, torch.float32))
        for j in range(spatial):
            dim = 2 + j
            sources = _nearest_sources(input_size[dim], output_size[j], scales[j], grad.device)
            shape = list(grad.shape)
            shape[dim] = input_size[dim]
            grad = grad.new_zeros(shape).index_add(dim, sources, grad)
        return grad.to(grad_output.dtype)

    return decomposition


def _integer_erf(x: torch.Tensor) -> torch.Tensor:
    """``erf`` of an integer or bool tensor: eager promotes it to the default float first."""
    if x.is_floating_point() or x.is_complex():
        return NotImplemented
    return aten.erf.default(x.to(torch.get_default_dtype()))


def _clamp_integers_by_floats(x: torch.Tensor, min=None, max=None) -> torch.Tensor:
    """``clamp(int_tensor, -2.5, 2.5)``: eager's result is float (type promotion), so
    clamp the promoted tensor; torch-mlir rejected the mixed operands."""
    if x.is_floating_point() or x.is_complex() or x.dtype == torch.bool:
        return NotImplemented
    dtype = x.dtype
    for bound in (min, max):
        if bound is not None:
            dtype = torch.promote_types(dtype, torch.result_type(x, bound))
    if dtype == x.dtype:
        return NotImplemented
    return aten.clamp.default(x.to(dtype), min, max)


def _index_select_by_scalar(x: torch.Tensor, dim: int, index: torch.Tensor) -> torch.Tensor:
    """A 0-d index selects as a 1-element one (eager keeps the dim, of size 1)."""
    if index.dim() != 0:
        return NotImplemented
    return aten.index_select.default(x, dim, index.reshape(1))


def _embedding_without_backward_flags(weight, indices, padding_idx=-1, scale_grad_by_freq=False, sparse=False):
    """``scale_grad_by_freq`` and ``sparse`` change only the gradient (autograd
    reads them from the op it differentiates, above this table); the forward
    is the plain lookup."""
    if not (scale_grad_by_freq or sparse):
        return NotImplemented
    return aten.embedding.default(weight, indices, padding_idx)


def _prims_prod(x: torch.Tensor, dims, *, output_dtype=None) -> torch.Tensor:
    """``prims.prod`` as its eager implementation (``torch._prims._prod_aten``):
    ``prod`` over one dim at a time, last first. Within a dim the device
    multiplies in its own order: an ulp or two from eager."""
    if dims is None:
        return torch.prod(x, dtype=output_dtype)
    if len(dims) == 0:
        return x.clone()
    for d in sorted(dims, reverse=True):
        x = torch.prod(x, d, dtype=output_dtype)
    return x


def _conv_tbc_as_convolution(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor, pad: int = 0):
    """``conv_tbc`` (time, batch, channel) as a 1-d convolution of ``[B, C, T]``.

    Eager sums ``bias + sum_k x[t + k - pad] @ w[k]`` (one matmul per tap);
    the convolution sums the same products in another order: a few ulps.
    """
    out = aten.convolution.default(
        x.permute(1, 2, 0), weight.permute(2, 1, 0), bias, [1], [pad], [1], False, [0], 1
    )
    return out.permute(2, 0, 1)


def _empty_trace(x: torch.Tensor) -> torch.Tensor:
    """``trace`` of a matrix with no diagonal: zero, in the dtype eager sums into
    (torch-mlir could not gather by the empty index of the diagonal). Any
    other matrix keeps PyTorch's decomposition (the sum of the diagonal),
    which this entry replaces in the table."""
    if x.dim() != 2 or not all(isinstance(n, int) for n in x.shape) or min(x.shape) != 0:
        return pytorch_decomposition(aten.trace.default)(x)
    dtype = x.dtype if x.is_floating_point() or x.is_complex() else torch.int64
    return x.new_zeros((), dtype=dtype)


def _mixed_sign_int_mm(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """``_int_mm`` of a uint8 and an int8 operand as an int32 matmul of both widened.

    torch-mlir's matmul rejects operands of different element types. Eager
    reads each operand with its own signedness and accumulates in int32;
    widening first is exactly that (integer sums are exact in any order).
    Same-dtype operands keep the op, which lowers.
    """
    if a.dtype == b.dtype or {a.dtype, b.dtype} != {torch.int8, torch.uint8}:
        return NotImplemented
    return torch.mm(a.to(torch.int32), b.to(torch.int32))


def _transposed_convolution_as_forward(x, weight, bias, stride, padding, dilation, transposed: bool,
                                       output_padding, groups: int):
    """A transposed convolution as the convolution eager's own math is equivalent to.

    ``conv_transpose(x, w)`` along a dim of input length ``L`` is the forward
    convolution (stride 1, same dilation ``d``) of ``x`` spread by the stride
    (``s - 1`` zeros between elements: length ``(L - 1) * s + 1``), padded by
    ``d * (k - 1) - p`` in front and that plus ``output_padding`` behind
    (negative amounts crop), with the kernel flipped and its channel dims
    swapped. Only ungrouped calls with an ``output_padding`` above 1, the
    ones torch-mlir sized wrongly; the products are summed in another order
    than oneDNN's: a few ulps.
    """
    if not transposed or groups != 1 or max(output_padding, default=0) <= 1 or x.dim() < 3:
        return NotImplemented
    if not all(isinstance(n, int) for n in (*x.shape, *weight.shape)):
        return NotImplemented
    spatial = x.dim() - 2
    spread = x
    for j in range(spatial):
        dim, every = 2 + j, stride[j]
        if every > 1:  # s - 1 zeros after each element, then drop the trailing ones
            zeros = [0, 0] * (spatial - j - 1) + [0, every - 1]
            spread = torch.nn.functional.pad(spread.unsqueeze(dim + 1), zeros).flatten(dim, dim + 1)
            spread = spread.narrow(dim, 0, (x.shape[dim] - 1) * every + 1)
    pads: list[int] = []
    for j in reversed(range(spatial)):
        dim = 2 + j
        front = dilation[j] * (weight.shape[dim] - 1) - padding[j]
        back = front + output_padding[j]
        if front < 0 or back < 0:  # crop first: pad amounts stay non-negative
            length = spread.shape[dim] - max(-front, 0) - max(-back, 0)
            spread = spread.narrow(dim, max(-front, 0), length)
        pads += [max(front, 0), max(back, 0)]
    spread = torch.nn.functional.pad(spread, pads)
    kernel = weight.flip(list(range(2, weight.dim()))).transpose(0, 1)
    return aten.convolution.default(
        spread, kernel, bias, [1] * spatial, [0] * spatial, list(dilation), False, [0] * spatial, 1
    )


def _empty_trilinear(i1, i2, i3, expand1, expand2, expand3, sumdim, unroll_dim: int = 1):
    """``_trilinear`` whose output eager sizes to zero elements: that empty tensor.

    Eager takes each output dim's size from the last input that is not
    expanded there, so a dim all three expand is 0 (torch-mlir's e2e
    ``Aten_TrilinearModuleZerodDimBug``; torch-mlir refuses it on purpose).
    Any other call keeps the op, which lowers.
    """
    total = i1.dim() + len(expand1)
    expands = [set(d % total for d in e) for e in (expand1, expand2, expand3)]
    summed = set(d % total for d in sumdim)
    inputs = [i1, i2, i3]
    for k, t in enumerate(inputs):
        for d in sorted(expands[k]):
            t = t.unsqueeze(d)
        inputs[k] = t
    sizes = []
    for d in range(total):
        size = 0
        for k in range(3):
            if d not in expands[k]:
                size = inputs[k].shape[d]
        sizes.append(1 if d in summed else size)
    if not all(isinstance(n, int) for n in sizes) or 0 not in sizes:
        return NotImplemented
    return i1.new_zeros([n for d, n in enumerate(sizes) if d not in summed])


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
    ``include_self``, as eager does; integer ``mean`` floors the quotient, as
    eager's ``div_(count, "floor")``.
    """
    dim = dim % max(x.dim(), 1)
    if x.dim() == 0 or index.dim() != x.dim() or (reduce == "mean" and (x.is_complex() or x.dtype == torch.bool)):
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
            "mean": lambda: _mean_quotient(region + reduced, count + 1),
            "amax": lambda: torch.maximum(region, reduced),
            "amin": lambda: torch.minimum(region, reduced),
        }[reduce]()
    else:
        if reduce == "mean":
            reduced = _mean_quotient(reduced, count.clamp_min(1))
        combined = torch.where(count > 0, reduced, region)
    out = combined.movedim(-1, dim)
    if tuple(index.shape[d] for d in range(x.dim()) if d != dim) == tuple(x.shape[d] for d in range(x.dim()) if d != dim):
        return out
    return x.clone().index_put(_block_indices(index.shape, dim, targets, x.device), out)


def _mean_quotient(total: torch.Tensor, count: torch.Tensor) -> torch.Tensor:
    """``total / count`` in ``total``'s dtype: true division for floats, floor
    division for integers (eager's ``scatter_reduce`` mean)."""
    if total.is_floating_point():
        return total / count.to(total.dtype)
    return torch.div(total, count.to(total.dtype), rounding_mode="floor")


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
    aten.as_strided_scatter.default: _as_strided_scatter_by_index_put,
    aten.scatter_reduce.two: _scatter_reduce_by_one_hot,
    aten.logcumsumexp.default: _logcumsumexp_by_doubling,
    aten.norm.Scalar: _norm_as_vector_norm,
    aten.norm.ScalarOpt_dim: _norm_as_vector_norm,
    aten.upsample_nearest1d_backward.default: _upsample_nearest_backward(1),
    aten.upsample_nearest2d_backward.default: _upsample_nearest_backward(2),
    aten.upsample_nearest3d_backward.default: _upsample_nearest_backward(3),
    aten.erf.default: _integer_erf,
    aten.clamp.default: _clamp_integers_by_floats,
    aten.index_select.default: _index_select_by_scalar,
    aten.embedding.default: _embedding_without_backward_flags,
    torch.ops.prims.prod.default: _prims_prod,
    aten.conv_tbc.default: _conv_tbc_as_convolution,
    aten.trace.default: _empty_trace,
    aten._int_mm.default: _mixed_sign_int_mm,
    aten.convolution.default: _transposed_convolution_as_forward,
    aten._trilinear.default: _empty_trilinear,
}
