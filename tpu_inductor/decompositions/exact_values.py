"""Decompositions that make lowered ops compute eager's values, not nearby ones.

Why: these ops lower, run on the device and return tensors of the right
shape, but torch-mlir's lowering (or PyTorch's own decomposition) computes
something slightly different from eager's kernel: windows shifted by a
padding row, an int64 quotient taken through float64, a result dtype that
skips type promotion, a comparison folded away. Nothing fails, so no
fallback reports them; each entry here rewrites one op into ATen ops whose
lowering is exact. Every entry returns ``NotImplemented`` (the op itself) for
the inputs it does not concern. (Half-precision ops computed in their own
type are one rule for every op: lowering/half_floats_in_float32.py.)

Before: ``aten.div.Tensor_mode(x, 3, rounding_mode="floor")`` on int64
(converted to float64 by torch-mlir: wrong past 2**53); after: a truncating
integer division and a sign correction, exact for every int64.
"""

from __future__ import annotations

import torch

from tpu_inductor.half_precision import HALF_FLOATS
from tpu_inductor.torch_api import pytorch_decomposition

from tpu_inductor.decompositions.window_arguments import per_dim, pooled_size

aten = torch.ops.aten

_EIGHT_BIT_INTEGERS = (torch.uint8, torch.int8)


# -- max pooling with ceil_mode ------------------------------------------------


def _pad_dim(x, dim: int, low, high, value):
    """``x`` with ``low`` and ``high`` positions of ``value`` around ``dim``.

    Concatenated rather than ``constant_pad_nd``: the padding analysis
    (padding_safety.py) follows ``cat`` and ``full`` and keeps the other
    dims' symbols (a dynamic batch) paddable.
    """
    parts = []
    for count in (low, high):
        shape = list(x.shape)
        shape[dim] = count
        parts.append(x.new_full(shape, value) if count > 0 else None)
    pieces = [p for p in (parts[0], x, parts[1]) if p is not None]
    return torch.cat(pieces, dim) if len(pieces) > 1 else x


def _unravel(flat, sizes) -> list:
    """Coordinates of flat positions (non-negative) in a row-major ``sizes`` block."""
    coordinates = []
    for size in reversed(sizes):
        quotient = torch.div(flat, size, rounding_mode="trunc")  # non-negative: trunc is floor
        coordinates.append(flat - quotient * size)
        flat = quotient
    return coordinates[::-1]


def _input_index(coordinates, sizes, padding, dilation):
    """Eager's flat index into the unpadded input of a window tap at padded ``coordinates``.

    A tap in the padding moves forward by whole dilation steps to the
    window's first tap inside the input: the position eager's kernel starts
    from, and reports for a window holding nothing greater than ``-inf``.
    """
    index = None
    for coordinate, size, pad, step in zip(coordinates, sizes, padding, dilation):
        coordinate = coordinate - pad
        if step > 1:
            coordinate = torch.where(coordinate < 0, torch.remainder(coordinate, step), coordinate)
        coordinate = coordinate.clamp(0, size - 1)
        index = coordinate if index is None else index * size + coordinate
    return index


def _max_pool_exact_windows(op, dims: int, lowering=None):
    """``max_pool{dims}d_with_indices`` with the windows eager uses.

    torch-mlir lowers ``ceil_mode=True`` by padding *both* sides of each
    spatial dim with the extra positions the last window needs, which shifts
    every window left (``max_pool2d(x, 2, 2, ceil_mode=True)`` on a 7 x 7
    ``randn`` was off by up to 3.8; torch-mlir's own
    ``MaxPool2dCeilModeTrueModule`` by up to 1.27). With indices (training)
    the lowering failed XLA's shape check instead, and the pool ran in eager. Here the padding eager implies (``padding``
    before, ``padding`` plus the extra after) is spelled out with ``-inf``
    (an integer dtype's minimum) and the pool runs unpadded with
    ``ceil_mode=False``; its indices are translated back to the unpadded
    input. Where ceil mode adds no window beyond the padding the plain op
    is the same computation and is kept.

    ``max_pool2d(x, 2)`` also records ``stride=[]`` (meaning: the kernel
    size), which torch-mlir reads as 1 when the indices output is used: the
    stride is spelled out too. And torch-mlir crashes the process
    (segmentation fault) converting a uint8 or int8 max pool: those pool in
    int32, where the maximum is the same value. ``lowering``: what the plain
    op becomes where torch-mlir cannot lower it at all (3-d pools with
    indices: PyTorch's own decomposition, a max over gathered windows).
    """

    def decomposition(x, kernel_size, stride=(), padding=0, dilation=1, ceil_mode=False):
        if x.dtype in _EIGHT_BIT_INTEGERS:
            values, indices = op(x.to(torch.int32), kernel_size, stride, padding, dilation, ceil_mode)
            return values.to(x.dtype), indices
        kernel = per_dim(kernel_size, dims)
        strides = per_dim(stride, dims) if stride else kernel
        pads, dilations = per_dim(padding, dims), per_dim(dilation, dims)
        sizes = list(x.shape[-dims:])
        if ceil_mode:
            outs = [pooled_size(*args, ceil_mode=True) for args in zip(sizes, kernel, strides, pads, dilations)]
            highs = [
                (o - 1) * s + d * (k - 1) + 1 - n - p
                for o, s, d, k, n, p in zip(outs, strides, dilations, kernel, sizes, pads)
            ]
            if any(h > p for h, p in zip(highs, pads)):
                return _pool_padded(x, kernel, strides, pads, dilations, highs)
        if stride and not ceil_mode:
            if lowering is not None:
                return lowering(x, kernel, strides, pads, dilations, False)
            return NotImplemented  # the op as eager states it: torch-mlir lowers it right
        return op(x, kernel, strides, pads, dilations, False)

    def _pool_padded(x, kernel, strides, pads, dilations, highs):
        fill = float("-inf") if x.is_floating_point() else torch.iinfo(x.dtype).min
        padded = x
        for i, (low, high) in enumerate(zip(pads, highs)):
            padded = _pad_dim(padded, x.dim() - dims + i, low, max(high, 0), fill)
        values, flat = op(padded, kernel, strides, [0] * dims, dilations, False)
        sizes = list(x.shape[-dims:])
        picked = _input_index(_unravel(flat, list(padded.shape[-dims:])), sizes, pads, dilations)
        # A window of nothing but the fill: torch-mlir's reducer starts from
        # (fill, index 0), which ties and wins; eager reports the first tap.
        outs = values.shape[-dims:]
        starts = [
            (torch.arange(o, device=x.device) * s).view([o] + [1] * (dims - 1 - i))
            for i, (o, s) in enumerate(zip(outs, strides))
        ]
        first = _input_index(starts, sizes, pads, dilations)
        return values, torch.where(values == fill, first, picked)

    return decomposition


# -- integer division ----------------------------------------------------------


def _integer_floor_division(a, b, rounding_mode=None):
    """Integer ``div(a, b, rounding_mode="floor")`` (and ``//``) in integers.

    torch-mlir converts both operands to float64, divides and floors. Past
    2**53 the operand itself rounds, and XLA turns a division by a constant
    into a multiplication by its reciprocal, so ``x // 3`` was already off
    by one from about 2**51 (``-6755399441055745 // 3``). Its truncating
    division is an integer divide; the floor is that quotient minus one
    where a nonzero remainder's sign differs from the divisor's: exact for
    every value, as eager's kernel computes it.
    """
    if rounding_mode != "floor":
        return NotImplemented
    dtype = torch.result_type(a, b)
    if dtype.is_floating_point or dtype.is_complex or dtype == torch.bool:
        return NotImplemented
    a = a.to(dtype)
    if isinstance(b, torch.Tensor):
        b = b.to(dtype)
    quotient = torch.div(a, b, rounding_mode="trunc")
    if not dtype.is_signed:
        return quotient  # nothing negative: trunc is floor
    remainder = a - quotient * b
    if isinstance(b, torch.Tensor):
        # Signs differ exactly where their XOR is negative (no comparison
        # with a 0-d divisor, which torch-mlir may fold wrongly).
        adjust = (remainder != 0) & ((remainder ^ b) < 0)
    else:
        adjust = remainder < 0 if b > 0 else remainder > 0
    return quotient - adjust.to(dtype)


# -- comparisons ---------------------------------------------------------------


def _float_eq_kept(a, b):
    """Floating ``a == b`` as ``not (a != b)``, which torch-mlir does not fold.

    torch-mlir folds ``aten.eq.Tensor(x, x)`` to ``True``, which is wrong for
    NaN. ``isfinite`` is ``(x == x) & (|x| != inf)``, so torch-mlir's
    ``IsInfiniteModule`` (``isfinite([-inf, inf, nan, ...])``) called NaN
    finite; ``isclose`` and ``equal`` likewise, also when the two operands
    only become one value inside torch-mlir (``x.clone() == x``). IEEE
    ``!=`` is exactly the negation of ``==``, NaN included.
    """
    floating = a.is_floating_point() or (isinstance(b, torch.Tensor) and b.is_floating_point())
    if not floating:
        return NotImplemented
    return torch.logical_not(torch.ne(a, b))


def _threshold_backward_promoted(grad_output, self, threshold):
    """``threshold_backward`` in the promoted dtype of both inputs, as eager.

    PyTorch's decomposition, ``where(self <= threshold, 0, grad_output)``,
    returns ``grad_output``'s dtype: an int64 gradient against a float32
    input came back int64 (eager: float32), and the comparison ran in
    ``self``'s dtype. Eager compares and selects in the promoted dtype, with
    the threshold converted to it (truncated for integers) and float32 for
    bfloat16 and float16.
    """
    dtype = torch.result_type(grad_output, self)
    if dtype == torch.bool or dtype.is_complex:
        return NotImplemented
    compute = torch.float32 if dtype in HALF_FLOATS else dtype
    if not compute.is_floating_point:
        threshold = int(threshold)
    return torch.where(self.to(compute) <= threshold, 0, grad_output.to(dtype))


# -- multilabel margin loss -----------------------------------------------------


def _multilabel_margin_loss_forward(input, target, reduction: int):
    """PyTorch's decomposition of ``multilabel_margin_loss`` with the targets
    after the first ``-1`` left out of the sum, as eager's kernel leaves them.

    PyTorch's (torch 2.13; Inductor computes the same) masks those targets
    out of ``is_target`` but still sums a margin for each of them, read at
    class 0: ``target = [1, 2, -1, 0, ...]`` gave 9.68 where eager gives 2.66.
    """
    shape = input.shape
    input, target = torch.atleast_2d(input), torch.atleast_2d(target)
    classes = input.shape[1]
    position = torch.arange(classes, device=target.device)
    end = torch.amin(torch.where(target == -1, position, classes), dim=-1, keepdim=True)
    listed = position < end  # [batch, j]: the j-th target is one of the sample's
    target_score = torch.gather(input, -1, torch.where(listed, target, 0))
    is_target = torch.any(position == torch.where(listed, target, -1).unsqueeze(-1), dim=1)
    # margins[j, batch, i] for target j against class i
    margins = (1.0 - target_score.T.unsqueeze(-1) + input).clamp_min(0) / classes
    margins = torch.where(is_target | ~listed.T.unsqueeze(-1), 0, margins)
    per_sample = margins.sum(dim=(0, -1))
    if reduction == _MEAN:
        loss = per_sample.mean()
    elif reduction == _SUM:
        loss = per_sample.sum()
    else:
        loss = per_sample.reshape(shape[:-1])  # a 1-d input's loss is 0-d, as eager's
    return loss, is_target.to(input.dtype).reshape(shape)


_MEAN, _SUM = 1, 2
"""ATen's ``reduction`` codes (``at::Reduction``); 0 is none."""


ABOVE_AUTOGRAD_EXACT_VALUES: dict = {aten.multilabel_margin_loss_forward.default: _multilabel_margin_loss_forward}
"""PyTorch decomposes this op at its autograd key, before any table is read:
ours replaces that kernel (``torch_api.above_autograd``), and the backward
is that of the ops it becomes."""


EXACT_VALUE_DECOMPOSITIONS: dict = {
    aten.max_pool2d_with_indices.default: _max_pool_exact_windows(aten.max_pool2d_with_indices.default, 2),
    aten.max_pool3d_with_indices.default: _max_pool_exact_windows(
        aten.max_pool3d_with_indices.default, 3, pytorch_decomposition(aten.max_pool3d_with_indices.default)
    ),
    aten.div.Tensor_mode: _integer_floor_division,
    aten.div.Scalar_mode: _integer_floor_division,
    aten.eq.Tensor: _float_eq_kept,
    aten.threshold_backward.default: _threshold_backward_promoted,
}
