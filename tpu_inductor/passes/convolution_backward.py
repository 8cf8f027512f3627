"""Decompositions of ``convolution_backward`` that torch-mlir cannot lower as one op.

Why: torch-mlir lowers the plain 2-d convolution backward, but not the 1-d
one, and rejects grouped (depthwise) backwards. Each entry here rewrites one
such case into convolutions and contractions that lower; every other case
returns ``NotImplemented`` and stays the op itself.
"""

from __future__ import annotations

import torch

aten = torch.ops.aten


def window_positions(windows: int, step: int, taps: int, spacing: int, device) -> torch.Tensor:
    """Positions ``w * step + k * spacing`` of sliding windows, window-major, flattened."""
    starts = torch.arange(windows, device=device) * step
    offsets = torch.arange(taps, device=device) * spacing
    return (starts.unsqueeze(1) + offsets).flatten()


def _conv1d_backward_as_2d(
    grad_output, input, weight, bias_sizes, stride, padding, dilation,
    transposed, output_padding, groups, output_mask,
):
    """1-d ``convolution_backward`` as the 2-d one on a unit height.

    torch-mlir lowers the 2-d backward but not the 1-d one; a ``[N, C, W]``
    convolution is exactly a ``[N, C, 1, W]`` one with a ``1 x k`` kernel.
    Grouped ones (depthwise, as in Mamba's and gated delta nets' short
    convolutions) it rejects in either form: see :func:`_grouped_conv1d_backward`.
    """
    if input.dim() != 3:
        return NotImplemented
    if groups > 1 and not transposed:
        return _grouped_conv1d_backward(
            grad_output, input, weight, stride[0], padding[0], dilation[0], groups, output_mask
        )
    grad_input, grad_weight, grad_bias = aten.convolution_backward.default(
        grad_output.unsqueeze(2), input.unsqueeze(2), weight.unsqueeze(2), bias_sizes,
        [1, *stride], [0, *padding], [1, *dilation], transposed, [0, *output_padding],
        groups, output_mask,
    )
    return (
        None if grad_input is None else grad_input.squeeze(2),
        None if grad_weight is None else grad_weight.squeeze(2),
        grad_bias,
    )


def _grouped_conv1d_backward(grad_output, input, weight, stride, padding, dilation, groups, output_mask):
    """Gradients of a grouped 1-d convolution as a transposed convolution and a contraction.

    The input gradient is the transposed convolution of ``grad_output`` with
    the same weight (output padding restores the input length). The weight
    gradient sums, over batch and positions, ``grad_output[n, o, t] *
    x[n, i, t * stride + k * dilation]`` within each group: the input's
    windows gathered by position, then one einsum.
    """
    batch, in_channels, length = input.shape
    out_channels, group_in, kernel = weight.shape
    out_length = grad_output.shape[-1]
    grad_input = grad_weight = grad_bias = None
    if output_mask[0]:
        natural = (out_length - 1) * stride - 2 * padding + dilation * (kernel - 1) + 1
        grad_input = aten.convolution.default(
            grad_output, weight, None, [stride], [padding], [dilation], True, [length - natural], groups
        )
    if output_mask[1]:
        padded = torch.nn.functional.pad(input, (padding, padding))
        windows = padded.index_select(2, window_positions(out_length, stride, kernel, dilation, input.device))
        windows = windows.view(batch, groups, group_in, out_length, kernel)
        per_group = grad_output.view(batch, groups, out_channels // groups, out_length)
        grad_weight = torch.einsum("ngot,ngitk->goik", per_group, windows).reshape(out_channels, group_in, kernel)
    if output_mask[2]:
        grad_bias = grad_output.sum((0, 2))
    return grad_input, grad_weight, grad_bias


CONVOLUTION_BACKWARD_DECOMPOSITIONS: dict = {
    aten.convolution_backward.default: _conv1d_backward_as_2d,
}
