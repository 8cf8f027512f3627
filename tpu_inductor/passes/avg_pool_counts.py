"""``avg_pool2d/3d(count_include_pad=False)`` with its divisor computed on one plane.

Why: torch-mlir lowers the divisor of a pool that excludes padding as a
``reduce_window`` over a constant of ones the size of the whole input, and
XLA constant-folds it element by element: a ``[32, 384, 25, 25]``
PoolFormer pool took 90-124 s to compile (``[4, 96, 25, 25]``: 2.5 s of
folding). The count of real elements in a window depends only on the
spatial position, so it is computed here on a ``[1, 1, H, W]`` plane of
ones (folded in microseconds) and broadcast; the sum is the
zero-padded pool times the window size.

Before: ``avg_pool2d(x, 3, 1, 1, count_include_pad=False)``.
After: ``avg_pool2d(x, 3, 1, 1) * 9 / (avg_pool2d(ones[1, 1, H, W], 3, 1, 1) * 9)``.

Only for ``ceil_mode=False``: there every window lies inside the padded
input, so the zero-padded pool divides by exactly the window size.
"""

from __future__ import annotations

import math
from typing import Callable, Sequence

import torch

aten = torch.ops.aten


def _excluding_padding(pool: torch._ops.OpOverload, spatial_dims: int) -> Callable:
    def decomposition(
        x: torch.Tensor,
        kernel_size: Sequence[int],
        stride: Sequence[int] = (),
        padding: Sequence[int] = 0,
        ceil_mode: bool = False,
        count_include_pad: bool = True,
        divisor_override=None,
    ):
        padding = _per_dim(padding, spatial_dims)
        if count_include_pad or ceil_mode or divisor_override is not None or not any(padding):
            return NotImplemented  # the op itself: its divisor is a constant
        kernel = _per_dim(kernel_size, spatial_dims)
        stride = _per_dim(stride, spatial_dims) if stride else kernel
        window = math.prod(kernel)
        summed = pool(x, kernel, stride, padding, False, True) * window
        plane = torch.ones((1,) * (x.dim() - spatial_dims) + tuple(x.shape[-spatial_dims:]), dtype=x.dtype, device=x.device)
        counts = pool(plane, kernel, stride, padding, False, True) * window
        return summed / counts

    return decomposition


def _per_dim(value, dims: int) -> list[int]:
    values = [value] if isinstance(value, int) else list(value)
    return values * dims if len(values) == 1 else values


AVG_POOL_DECOMPOSITIONS: dict = {
    aten.avg_pool2d.default: _excluding_padding(aten.avg_pool2d.default, 2),
    aten.avg_pool3d.default: _excluding_padding(aten.avg_pool3d.default, 3),
}
