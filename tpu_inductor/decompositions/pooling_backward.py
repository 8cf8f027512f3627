"""Decompositions of pooling backwards that torch-mlir cannot lower as one op.

Why: torch-mlir rejects ``aten.avg_pool2d_backward`` and
``aten.avg_pool3d_backward`` (it cannot legalize their ``torch.constant.int``
operands), so every CNN with average pooling
(squeeze-excite blocks, ResNet-D shortcuts, Inception) ran its pooling
backward in eager between device islands. Here it becomes a scale by each
window's divisor and a sum of shifted slices, which lower.

The same holds for ``aten.max_pool2d_with_indices_backward``: it becomes a
``scatter_add`` of the gradients at the indices the forward chose, as in
PyTorch's own decomposition from 2.12 on, here for every torch version
(2.11 has none, and every CNN with a max pool trained with it in eager).
"""

from __future__ import annotations

import itertools
import math
from typing import Callable, Optional, Sequence

import torch

from tpu_inductor.decompositions.convolution_backward import output_gradient_windows, pad_spatial, tap_slice
from tpu_inductor.decompositions.window_arguments import per_dim
from tpu_inductor.half_precision import HALF_FLOATS

aten = torch.ops.aten


def _window_counts(
    input: torch.Tensor, out_size: Sequence[int], kernel: Sequence[int], stride: Sequence[int],
    padding: Sequence[int], ceil_mode: bool, count_include_pad: bool,
) -> torch.Tensor:
    """``[1, 1, *out_size]``: how many positions each window averages over, as eager counts them.

    Eager divides window ``o`` (spanning ``[o * s - p, o * s - p + k)``) by
    the size of its part inside ``[-p, size + p)`` with ``count_include_pad``,
    else inside ``[0, size)``. Summing one plane that is 1 exactly there
    over the window's taps counts it. The plane is ``ones_like`` a slice of
    the input, so its shape follows the input's even when that is symbolic
    (an ``arange`` of a symbolic length left StableHLO a dynamic shape).
    """
    plane = torch.ones_like(input[:1, :1], dtype=torch.float32)
    plane = pad_spatial(plane, padding, padding, value=1.0 if count_include_pad else 0.0)
    # ceil_mode's last window may run up to s - 1 past the padded end, where
    # nothing counts (a constant bound: symbolic pad amounts do not lower)
    past = [s - 1 if ceil_mode else 0 for s in stride]
    plane = pad_spatial(plane, [0] * len(past), past)
    counts = None
    for tap in itertools.product(*(range(k) for k in kernel)):
        window = tap_slice(plane, tap, out_size, stride)
        counts = window if counts is None else counts + window
    return counts


def _avg_pool_backward(spatial_dims: int) -> Callable:
    """``avg_pool2d_backward`` / ``avg_pool3d_backward`` as a divisor scale and a sum of shifted slices.

    torch-mlir cannot lower either op. Each output position's gradient,
    divided by its window's divisor (``divisor_override``, else the window's
    size with or without the padding, clipped as eager clips it: a constant
    unless padding is excluded or ``ceil_mode`` adds partial windows), goes
    back to every input position of its window: the input gradient of a
    depthwise convolution with an all-ones kernel, built tap by tap
    (:func:`output_gradient_windows`), whose slices keep only positions
    inside the input.
    """

    def decomposition(
        grad_output: torch.Tensor, input: torch.Tensor, kernel_size: Sequence[int], stride: Sequence[int],
        padding: Sequence[int], ceil_mode: bool, count_include_pad: bool, divisor_override: Optional[int],
    ) -> torch.Tensor:
        unbatched = input.dim() == spatial_dims + 1
        if unbatched:
            grad_output, input = grad_output.unsqueeze(0), input.unsqueeze(0)
        kernel = per_dim(kernel_size, spatial_dims, ())
        step = per_dim(stride, spatial_dims, kernel)
        pad = per_dim(padding, spatial_dims, [0] * spatial_dims)
        in_size, out_size = list(input.shape[2:]), list(grad_output.shape[2:])
        dtype = torch.promote_types(grad_output.dtype, torch.float32)
        if divisor_override:
            divisor = divisor_override
        elif not ceil_mode and (count_include_pad or not any(pad)):
            divisor = math.prod(kernel)  # every window lies inside the padded input
        else:
            divisor = _window_counts(input, out_size, kernel, step, pad, ceil_mode, count_include_pad).to(dtype)
        scaled = grad_output.to(dtype) / divisor
        grad_input = None
        for window in output_gradient_windows(scaled, in_size, kernel, step, pad, [1] * spatial_dims):
            grad_input = window if grad_input is None else grad_input + window
        grad_input = grad_input.to(input.dtype)
        return grad_input.squeeze(0) if unbatched else grad_input

    return decomposition


def _max_pool_backward(dims: int) -> Callable:
    def decomposition(grad_output, input, kernel_size, stride, padding, dilation, ceil_mode, indices):
        # The indices are positions within each input plane (eager's): add each
        # output's gradient there, summing where windows overlap; float16 and
        # bfloat16 sum in float32, as PyTorch's decomposition does.
        wide = grad_output.dtype in HALF_FLOATS
        planes = input.shape[:-dims]
        flat = torch.zeros(
            (*planes, math.prod(input.shape[-dims:])),
            dtype=torch.float32 if wide else grad_output.dtype,
            device=grad_output.device,
        )
        source = grad_output.flatten(-dims).to(flat.dtype)
        grad_input = flat.scatter_add(-1, indices.flatten(-dims), source)
        return grad_input.reshape(input.shape).to(grad_output.dtype)

    return decomposition


POOLING_BACKWARD_DECOMPOSITIONS: dict = {
    aten.avg_pool2d_backward.default: _avg_pool_backward(2),
    aten.avg_pool3d_backward.default: _avg_pool_backward(3),
    aten.max_pool2d_with_indices_backward.default: _max_pool_backward(2),
}
