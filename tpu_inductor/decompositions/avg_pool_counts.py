"""Average pools whose divisor is not the window size, as a window sum over a count.

Why: torch-mlir lowers ``avg_pool2d/3d`` well only when every window divides
by its full size. Three cases that do not:

* ``count_include_pad=False``: the divisor became a ``reduce_window`` over a
  constant of ones the size of the whole input, which XLA constant-folds
  element by element (a ``[32, 384, 25, 25]`` PoolFormer pool took 90-124 s
  to compile; ``[4, 96, 25, 25]`` 2.5 s of folding);
* ``ceil_mode=True`` with a last window past the padding: the lowering's
  shape inference disagreed with the op's (``'stablehlo.reduce_window' op
  inferred type(s) 'tensor<1x1x25x25xf32>' are incompatible with ...
  26x26``, six of torch-mlir's own e2e tests), and the pool ran eagerly;
* ``divisor_override``: rejected by torch-mlir (``avg_pool2d``) or ignored
  (``avg_pool3d``: the result silently divided by the window).

Eager's kernel sums each window over the input elements it covers and
divides by ``divisor_override``, or by the window clipped to the padded
input (``count_include_pad``), or clipped to the input. Here the input is
padded explicitly (``padding`` before, ``padding`` plus what the last ceil
window needs after), pooled with no padding and no ceil (every window full:
the window sum is the pool times its size), and divided by the same pool of
a ``[1, 1, H, W]`` plane that holds 1 where eager counts an element: folded
in microseconds, broadcast over batch and channels. Half-precision inputs
are summed in float32, as eager's kernel does. Integer inputs are summed
window by window (an integer pool truncates its mean, so the pool times its
size lost the remainder: int64 ``avg_pool1d`` returned 0 for -1 and, with
every count truncated to 0, ``INT64_MAX``) and divided truncating, as eager.

Before: ``avg_pool2d(x, 3, 1, 1, count_include_pad=False)``.
After: ``avg_pool2d(pad(x, 1), 3) * 9 / (avg_pool2d(pad(ones[1, 1, H, W], 1), 3) * 9)``.
"""

from __future__ import annotations

import math
from typing import Callable, Optional, Sequence

import torch

from tpu_inductor.decompositions.convolution_backward import pad_spatial
from tpu_inductor.decompositions.window_arguments import per_dim, pooled_size
from tpu_inductor.half_precision import HALF_FLOATS

aten = torch.ops.aten


def _as_window_sums(pool: torch._ops.OpOverload, spatial_dims: int) -> Callable:
    def decomposition(
        x: torch.Tensor,
        kernel_size: Sequence[int],
        stride: Sequence[int] = (),
        padding: Sequence[int] = 0,
        ceil_mode: bool = False,
        count_include_pad: bool = True,
        divisor_override: Optional[int] = None,
    ):
        kernel = per_dim(kernel_size, spatial_dims)
        strides = per_dim(stride, spatial_dims) if stride else kernel
        pads = per_dim(padding, spatial_dims)
        sizes = list(x.shape[-spatial_dims:])
        if not all(isinstance(v, int) for v in sizes):
            return NotImplemented  # symbolic sizes: the op itself
        outputs = [pooled_size(n, k, s, p, ceil_mode=ceil_mode) for n, k, s, p in zip(sizes, kernel, strides, pads)]
        extra = [max(0, (o - 1) * s + k - (n + 2 * p)) for o, n, k, s, p in zip(outputs, sizes, kernel, strides, pads)]
        excludes_padding = not count_include_pad and any(pads)
        if divisor_override is None and not excludes_padding and not any(extra):
            return NotImplemented  # every window divides by its full size: the op itself
        window = math.prod(kernel)
        compute = torch.float32 if x.dtype in HALF_FLOATS else x.dtype

        def window_sums(t: torch.Tensor) -> torch.Tensor:
            if not compute.is_floating_point:  # an integer pool truncates each mean: sum the windows
                return _integer_window_sums(t, kernel, strides)
            return pool(t, kernel, strides, [0] * spatial_dims, False, True) * window

        def divide(sums: torch.Tensor, divisor) -> torch.Tensor:
            if not compute.is_floating_point:  # eager's integer pools truncate toward zero
                return torch.div(sums, divisor, rounding_mode="trunc").to(x.dtype)
            return (sums / divisor).to(x.dtype)

        sums = window_sums(pad_spatial(x.to(compute), pads, [p + e for p, e in zip(pads, extra)]))
        if divisor_override is not None:
            return divide(sums, divisor_override)
        plane = torch.ones((1,) * (x.dim() - spatial_dims) + tuple(sizes), dtype=compute, device=x.device)
        if count_include_pad:  # the padding counts, what the last ceil window adds past it does not
            counted = pad_spatial(pad_spatial(plane, pads, pads, value=1.0), [0] * spatial_dims, extra)
        else:
            counted = pad_spatial(plane, pads, [p + e for p, e in zip(pads, extra)])
        return divide(sums, window_sums(counted))

    return decomposition


def _integer_window_sums(x: torch.Tensor, kernel: Sequence[int], strides: Sequence[int]) -> torch.Tensor:
    """Each window's exact sum over ``x``'s last ``len(kernel)`` dims (no padding):
    every spatial dim unfolded into windows, then the window dims summed."""
    first = x.dim() - len(kernel)  # unfold appends each window dim last: the spatial dims stay put
    for index, (size, step) in enumerate(zip(kernel, strides)):
        x = x.unfold(first + index, size, step)
    return x.sum(dim=tuple(range(-len(kernel), 0)))


AVG_POOL_DECOMPOSITIONS: dict = {
    aten.avg_pool2d.default: _as_window_sums(aten.avg_pool2d.default, 2),
    aten.avg_pool3d.default: _as_window_sums(aten.avg_pool3d.default, 3),
}
