"""Decompositions of ``convolution_backward`` that torch-mlir cannot lower as one op.

Why: torch-mlir lowers the plain 2-d convolution backward, but not the 1-d
one, and rejects grouped (depthwise) backwards of any rank: the training step
of a MobileNet/EfficientNet-style CNN (``nn.Conv2d(C, C, 3, groups=C)``) ran
its convolution backwards in eager. Each entry here rewrites one such case
into ops that lower; every other case returns ``NotImplemented`` and stays
the op itself.

Grouped gradients are built one kernel tap at a time (:func:`_grouped_backward`):
for each tap, a strided slice of the padded input (the weight gradient) or of
the stride-spread, padded output gradient (the input gradient), multiplied
and summed. That is ``taps`` elementwise passes over ``[N, C, H, W]``, no
gathered windows and no grouped convolution. On the CPU client, for a
``[8, 64, 56, 56]`` depthwise 3x3 (stride 1): input gradient ~1 ms (XLA's
grouped transposed convolution: 78-118 ms), weight gradient 20-35 ms (XLA
copies each tap's shifted slice before YNNPACK reduces it; the swapped-axes
grouped convolution took 84 ms, gathered windows and an einsum 73 ms);
oneDNN's whole backward took 6-30 ms on the same, shared, machine.
"""

from __future__ import annotations

import itertools
from typing import Iterator, Optional, Sequence

import torch

aten = torch.ops.aten

Gradients = tuple[Optional[torch.Tensor], Optional[torch.Tensor], Optional[torch.Tensor]]


def window_positions(windows: int, step: int, taps: int, spacing: int, device) -> torch.Tensor:
    """Positions ``w * step + k * spacing`` of sliding windows, window-major, flattened."""
    starts = torch.arange(windows, device=device) * step
    offsets = torch.arange(taps, device=device) * spacing
    return (starts.unsqueeze(1) + offsets).flatten()


def _convolution_backward(
    grad_output: torch.Tensor, input: torch.Tensor, weight: torch.Tensor, bias_sizes,
    stride: Sequence[int], padding: Sequence[int], dilation: Sequence[int], transposed: bool,
    output_padding: Sequence[int], groups: int, output_mask: Sequence[bool],
) -> Gradients:
    """Grouped backwards (any rank) by kernel taps; ungrouped 1-d ones as 2-d.

    torch-mlir lowers the ungrouped, undilated, not transposed 2-d backward with static shapes (left as
    it is: that returns ``NotImplemented``; with dynamic ones, 3-d ones,
    dilated or transposed ones it fails to legalize, so those go by taps too) but rejects grouped ones ("operand and result must have
    the same size", or XLA's "input feature dimension ... multiple of
    feature_group_count") and has no 1-d backward at all.
    """
    dynamic = any(isinstance(size, torch.SymInt) for size in (*input.shape, *grad_output.shape))
    # torch-mlir's own ungrouped backward covers 2-d undilated convolutions
    # only: a 3-d one, or a dilated 2-d one, failed to legalize its
    # ``torch.constant.int`` sizes (torch-mlir's e2e
    # ConvolutionBackwardModule3DStatic / 2DDilated), so those go by taps too.
    beyond_torch_mlir = not transposed and (input.dim() > 4 or (input.dim() == 4 and any(d != 1 for d in dilation)))
    # Every transposed one failed the same way (the usual upsampling layer,
    # ``nn.ConvTranspose2d(..., stride=2)``, stride 1 and output_padding too).
    beyond_torch_mlir = beyond_torch_mlir or transposed
    if (groups > 1 or (dynamic and not transposed) or beyond_torch_mlir) and input.dim() >= 3:
        if transposed:
            return _grouped_transposed_backward(
                grad_output, input, weight, stride, padding, dilation, groups, output_mask
            )
        return _grouped_backward(grad_output, input, weight, stride, padding, dilation, groups, output_mask)
    if input.dim() != 3:
        return NotImplemented
    return _conv1d_backward_as_2d(
        grad_output, input, weight, bias_sizes, stride, padding, dilation,
        transposed, output_padding, groups, output_mask,
    )


def _conv1d_backward_as_2d(
    grad_output: torch.Tensor, input: torch.Tensor, weight: torch.Tensor, bias_sizes,
    stride: Sequence[int], padding: Sequence[int], dilation: Sequence[int], transposed: bool,
    output_padding: Sequence[int], groups: int, output_mask: Sequence[bool],
) -> Gradients:
    """1-d ``convolution_backward`` as the 2-d one on a unit height.

    torch-mlir lowers the 2-d backward but not the 1-d one; a ``[N, C, W]``
    convolution is exactly a ``[N, C, 1, W]`` one with a ``1 x k`` kernel.
    """
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


def _compute_dtype(dtype: torch.dtype) -> torch.dtype:
    """Sums over batch and positions run in float32 at least, as eager's kernels accumulate."""
    return torch.promote_types(dtype, torch.float32)


def tap_slice(x: torch.Tensor, starts: Sequence[int], lengths: Sequence[int], step: Sequence[int]) -> torch.Tensor:
    """``x[:, :, s0 : s0 + step0 * (l0 - 1) + 1 : step0, ...]`` over the spatial dims."""
    return x[(slice(None), slice(None)) + tuple(
        slice(start, start + every * (length - 1) + 1, every) for start, length, every in zip(starts, lengths, step)
    )]


def pad_spatial(x: torch.Tensor, before: Sequence[int], after: Sequence[int], value: float = 0.0) -> torch.Tensor:
    """Pad the spatial dims of ``[N, C, *spatial]`` with ``value`` (``F.pad`` counts from the last dim)."""
    pads: list[int] = []
    for low, high in reversed(list(zip(before, after))):
        pads += [low, high]
    return torch.nn.functional.pad(x, pads, value=value) if any(pads) else x


def _dilate_spatial(x: torch.Tensor, stride: Sequence[int]) -> torch.Tensor:
    """``stride - 1`` zeros after every element along each spatial dim (``[.., L] -> [.., L * s]``)."""
    for dim, every in enumerate(stride, start=2):
        if every == 1:
            continue
        spread = x.unsqueeze(dim + 1)
        zeros = [0, 0] * (spread.dim() - dim - 2) + [0, every - 1]
        x = torch.nn.functional.pad(spread, zeros).flatten(dim, dim + 1)
    return x


def output_gradient_windows(
    grad_output: torch.Tensor, in_size: Sequence[int], kernel: Sequence[int],
    stride: Sequence[int], padding: Sequence[int], dilation: Sequence[int],
) -> Iterator[torch.Tensor]:
    """Per kernel tap (row-major), the ``grad_output`` entries that reach each input position.

    A sliding-window op reads input position ``o * s + t * d - p`` at output
    position ``o`` and tap ``t``. Spread ``grad_output`` by the stride (zeros
    between entries) and zero-pad it by ``(k - 1) * d`` in front: then tap
    ``t``'s contributions to input positions ``[0, H)`` are one slice starting
    at ``(k - 1 - t) * d + p``, of the input's size. Weighted by the tap and
    summed over taps, these are a convolution's (or pooling's) input gradient.
    """
    dilated = _dilate_spatial(grad_output, stride)
    front = [(k - 1) * d for k, d in zip(kernel, dilation)]
    # The last slice ends at (k - 1) * d + p + H; the spread gradient's length
    # H_out * s is at least H + 2p - (k - 1) * d (floor or ceil output sizes),
    # so this much behind is always enough. A constant: an exact, symbolic
    # pad amount does not lower with dynamic shapes.
    back = [max(0, (k - 1) * d - p) for k, d, p in zip(kernel, dilation, padding)]
    padded = pad_spatial(dilated, front, back)
    for tap in itertools.product(*(range(k) for k in kernel)):
        starts = [(k - 1 - t) * d + p for k, t, d, p in zip(kernel, tap, dilation, padding)]
        yield tap_slice(padded, starts, in_size, [1] * len(in_size))


def _grouped_backward(
    grad_output: torch.Tensor, input: torch.Tensor, weight: torch.Tensor, stride: Sequence[int],
    padding: Sequence[int], dilation: Sequence[int], groups: int, output_mask: Sequence[bool],
) -> Gradients:
    """Gradients of a grouped (depthwise) N-d convolution, one kernel tap at a time.

    torch-mlir rejects grouped backwards. With ``xp`` the padded input, the
    forward sums ``xp[n, g, i, o * s + t * d] * w[g, o', i, t]`` over taps
    ``t``. So the weight gradient at tap ``t`` is ``grad_output`` times the
    input slice starting at ``t * d`` with step ``s``, summed over batch and
    positions (within each group: over the group's channels as well). The
    input gradient is each tap's window of ``grad_output``
    (:func:`output_gradient_windows`) times the tap's weight, summed over
    taps. No gathered windows, no grouped convolution: ``taps`` elementwise
    passes (small batched matmuls where groups have several channels on
    both sides).
    """
    batch, in_channels, *in_size = input.shape
    out_channels, group_in, *kernel = weight.shape
    out_size = list(grad_output.shape[2:])
    group_out = out_channels // groups
    dtype = _compute_dtype(input.dtype)
    unit = [1] * len(in_size)
    grad_input = grad_weight = grad_bias = None
    if output_mask[0]:
        # [taps, G, O', I, 1...]: one select per tap
        w = weight.to(dtype).view(groups, group_out, group_in, -1).permute(3, 0, 1, 2)
        w = w.reshape(-1, groups, group_out, group_in, *unit)
        windows = output_gradient_windows(grad_output.to(dtype), in_size, kernel, stride, padding, dilation)
        for index, window in enumerate(windows):
            window = window.view(batch, groups, group_out, *in_size)
            if group_out == 1:  # [N, G, 1, *S] * [G, 1, I]: a broadcast, nothing to sum
                term = window * w[index].view(1, groups, group_in, *unit)
            elif group_in == 1:
                term = (window * w[index].view(1, groups, group_out, *unit)).sum(2, keepdim=True)
            else:
                term = torch.einsum("ngo...,goi->ngi...", window, w[index].view(groups, group_out, group_in))
            grad_input = term if grad_input is None else grad_input + term
        grad_input = grad_input.reshape(batch, in_channels, *in_size).to(input.dtype)
    if output_mask[1]:
        padded = pad_spatial(input.to(dtype), padding, padding)
        grouped_go = grad_output.to(dtype).view(batch, groups, group_out, 1, *out_size)
        columns = []
        for tap in itertools.product(*(range(k) for k in kernel)):
            starts = [t * d for t, d in zip(tap, dilation)]
            window = tap_slice(padded, starts, out_size, stride).view(batch, groups, 1, group_in, *out_size)
            if group_out == 1 or group_in == 1:  # a broadcast product: no matmul with a unit dim
                columns.append((grouped_go * window).sum((0, *range(4, 4 + len(out_size)))))
            else:
                columns.append(torch.einsum("ngo...,ngi...->goi", grouped_go.squeeze(3), window.squeeze(2)))
        grad_weight = torch.stack(columns, -1).reshape(weight.shape).to(weight.dtype)
    if output_mask[2]:
        grad_bias = grad_output.to(dtype).sum((0, *range(2, grad_output.dim()))).to(grad_output.dtype)
    return grad_input, grad_weight, grad_bias


def _grouped_transposed_backward(
    grad_output: torch.Tensor, input: torch.Tensor, weight: torch.Tensor, stride: Sequence[int],
    padding: Sequence[int], dilation: Sequence[int], groups: int, output_mask: Sequence[bool],
) -> Gradients:
    """Gradients of a grouped transposed convolution through the forward convolution's.

    torch-mlir rejects these backwards too. ``y = conv_transpose(x, w)`` is the input gradient of ``conv(., w)`` at
    ``x``, so ``dL/dx = conv(dL/dy, w)`` (a grouped forward convolution,
    which lowers) and ``dL/dw`` is the forward convolution's weight gradient
    with ``dL/dy`` as its input and ``x`` as its output gradient: the same
    weight shape, ``[C_in, C_out / groups, *k]``.
    """
    grad_input = grad_weight = grad_bias = None
    if output_mask[0]:
        grad_input = aten.convolution.default(
            grad_output, weight, None, stride, padding, dilation, False, [0] * len(stride), groups
        )
        # output_padding may reach max(stride, dilation) - 1; past the stride,
        # the convolution sees extra rows at the end that ``x`` does not have
        for dim, size in enumerate(input.shape[2:], start=2):
            grad_input = grad_input.narrow(dim, 0, size)
    if output_mask[1]:
        _, grad_weight, _ = _grouped_backward(
            input, grad_output, weight, stride, padding, dilation, groups, (False, True, False)
        )
    if output_mask[2]:
        dtype = _compute_dtype(grad_output.dtype)
        grad_bias = grad_output.to(dtype).sum((0, *range(2, grad_output.dim()))).to(grad_output.dtype)
    return grad_input, grad_weight, grad_bias


CONVOLUTION_BACKWARD_DECOMPOSITIONS: dict = {
    aten.convolution_backward.default: _convolution_backward,
}
