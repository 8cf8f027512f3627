"""Adaptive max and average pools of any size as window reductions, one spatial dim at a time.

Why: torch-mlir fails on adaptive pools whose windows differ in length
(the output size does not divide the input size): ``adaptive_max_pool2d``
with "condition must be true", ``adaptive_max_pool3d`` and
``_adaptive_avg_pool3d`` with "failed to legalize torch.constant.int".
PyTorch's own decomposition covers only the 2-d pools that divide evenly
(a plain max pool) and returns ``NotImplemented`` otherwise, so 15 of
torch-mlir's own e2e tests (``AdaptiveMaxPool{1,2,3}d*``,
``AdaptiveAvgPool3dDynamic*``) ran these ops in eager.

Output position ``i`` of a dim of input size ``n`` and output size ``m``
reads input positions ``floor(i * n / m) <= p < ceil((i + 1) * n / m)``,
eager's windows for every size. Windows are gathered with ``index_select``
at ``start + k`` (``k`` below the longest window; shorter windows repeat
their last position, which changes neither a maximum nor, below, an index)
and reduced one dim at a time: a box maximum is separable, and so is the
index eager picks (the first maximum in row-major order, or the last NaN),
by taking it innermost dim first.

The backward of an adaptive average (``_adaptive_avg_pool{2,3}d_backward``),
which torch-mlir did not lower but for a global pool, is the gradient contracted with one
``[out, size]`` window-weight matrix a dim.
"""

from __future__ import annotations

from typing import Optional, Sequence

import torch

from tpu_inductor.torch_api import pytorch_decomposition

aten = torch.ops.aten

# Elements of one gathered window tensor (output positions x longest window
# along one dim, times the other dims): beyond it the op stays as it is.
_MAX_WINDOW_ELEMENTS = 1 << 28


def _static_sizes(x: torch.Tensor, output_size: Sequence[int], spatial: int) -> Optional[tuple[list[int], list[int]]]:
    """Input and output sizes of the ``spatial`` last dims, or None where a
    size is symbolic, zero, or the pool is not one eager runs."""
    if x.dim() not in (spatial + 1, spatial + 2) or len(output_size) != spatial:
        return None
    sizes = list(x.shape[-spatial:])
    outs = list(output_size)
    if not all(isinstance(v, int) and v > 0 for v in (*sizes, *outs, *x.shape)):
        return None
    return sizes, outs


def _window_positions(size: int, out: int, device) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, int]:
    """``[out, longest]`` gather positions of eager's adaptive windows, which of
    them are real (the rest repeat the window's last position), each window's
    length ``[out, 1]`` and the longest length.

    ``start_i = floor(i * n / m)`` is the count of ``p`` in ``[1, n)`` with
    ``p * m <= i * n``, and ``end_i = ceil((i + 1) * n / m)`` the count of ``p``
    in ``[0, n)`` with ``p * m < (i + 1) * n``: integer comparisons and sums in
    the graph, exact, without a division or a graph constant.
    """
    longest = max(-((-(i + 1) * size) // out) - (i * size) // out for i in range(out))
    scaled_inputs = torch.arange(size, device=device) * out  # p * m
    scaled_outputs = (torch.arange(out, device=device) * size).unsqueeze(1)  # i * n
    starts = ((scaled_inputs <= scaled_outputs) & (scaled_inputs > 0)).sum(1, keepdim=True)
    ends = (scaled_inputs < scaled_outputs + size).sum(1, keepdim=True)
    lengths = ends - starts
    offsets = torch.arange(longest, device=device).unsqueeze(0)
    real = offsets < lengths
    positions = starts + torch.minimum(offsets, lengths - 1)
    return positions, real, lengths, longest


def _gather_windows(t: torch.Tensor, dim: int, positions: torch.Tensor) -> torch.Tensor:
    """``t`` with ``dim`` replaced by ``[out, longest]`` windows, the window dim last."""
    out, longest = positions.shape
    gathered = t.index_select(dim, positions.flatten()).unflatten(dim, (out, longest))
    return gathered.movedim(dim + 1, -1)


def _windows(
    t: torch.Tensor, dim: int, size: int, out: int
) -> Optional[tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]]:
    """``t``'s windows along ``dim`` (:func:`_gather_windows`) with the positions,
    real mask and lengths of :func:`_window_positions`; None when the gathered
    windows would pass :data:`_MAX_WINDOW_ELEMENTS`."""
    positions, real, lengths, longest = _window_positions(size, out, t.device)
    if t.numel() // size * out * longest > _MAX_WINDOW_ELEMENTS:
        return None
    return _gather_windows(t, dim, positions), positions, real, lengths


def _flat_indices(sizes: list[int], device) -> torch.Tensor:
    """Row-major flat spatial index of each input position, shaped like the spatial dims."""
    total = 1
    for size in sizes:
        total *= size
    return torch.arange(total, device=device).reshape(sizes)


def _adaptive_max_pool(x: torch.Tensor, output_size: Sequence[int], spatial: int):
    """``adaptive_max_pool{spatial}d`` as separable window maxima with eager's indices.

    Per dim, innermost first: the value is the window's ``amax`` (NaN if any
    is NaN, as eager's ``val > max || isnan(val)`` loop); the index carried
    along is that of the first position holding the maximum, or of the last
    NaN. Taken innermost dim first, that is the row-major first maximum (or
    last NaN) of the whole box: eager's choice. Comparisons only, so values
    and indices are exact.
    """
    checked = _static_sizes(x, output_size, spatial)
    if checked is None or not x.is_floating_point():
        return NotImplemented
    sizes, outs = checked
    lead = x.dim() - spatial
    values = x
    indices = _flat_indices(sizes, x.device).expand(x.shape)
    for dim in reversed(range(lead, x.dim())):
        windows = _windows(values, dim, sizes[dim - lead], outs[dim - lead])
        if windows is None:
            return NotImplemented
        window, positions, _, _ = windows  # output positions at ``dim``, window last
        window_indices = _gather_windows(indices, dim, positions)
        longest = window.shape[-1]
        nan = window.isnan()
        any_nan = nan.any(-1, keepdim=True)
        # NaN put in explicitly: XLA:CPU's max reduction of a gathered window
        # dropped NaNs (1257 of 2730 windows of a [1, 2, 10, 9, 5] -> (7, 13,
        # 15) pool came back as the largest number instead).
        best = torch.where(any_nan, float("nan"), window.amax(-1, keepdim=True))
        steps = torch.arange(longest, device=x.device)
        first_max = torch.where(window == best, steps, longest).amin(-1, keepdim=True)
        last_nan = torch.where(nan, steps, -1).amax(-1, keepdim=True)
        chosen = torch.where(any_nan, last_nan, first_max)
        indices = torch.where(steps == chosen, window_indices, -1).amax(-1)
        values = best.squeeze(-1)
    return values.contiguous(), indices.contiguous()


def _adaptive_avg_pool(x: torch.Tensor, output_size: Sequence[int], spatial: int):
    """``_adaptive_avg_pool{spatial}d`` as separable window sums over each window's size.

    Only float32 and float64 (half types keep the op: eager's kernel
    accumulates them in another precision). The sums add in another order
    than eager's nested loop (a few ulps); the division is eager's,
    ``sum / kD / kH / kW``.
    """
    checked = _static_sizes(x, output_size, spatial)
    if checked is None or x.dtype not in (torch.float32, torch.float64):
        return NotImplemented
    sizes, outs = checked
    lead = x.dim() - spatial
    total = x
    divisors = []
    for dim in reversed(range(lead, x.dim())):
        windows = _windows(total, dim, sizes[dim - lead], outs[dim - lead])
        if windows is None:
            return NotImplemented
        window, _, real, lengths = windows  # output positions at ``dim``, window last
        # [out, longest] against [..., out, <dims after dim>..., longest]
        real = real.reshape(outs[dim - lead], *([1] * (window.dim() - dim - 2)), window.shape[-1])
        total = torch.where(real, window, 0).sum(-1)
        divisors.append((dim, lengths.to(x.dtype)))
    for dim, lengths in reversed(divisors):  # kD first, then kH, kW: eager's order
        total = total / lengths.reshape(outs[dim - lead], *([1] * (x.dim() - dim - 1)))
    return total.contiguous()


def _window_weights(size: int, out: int, dtype: torch.dtype, device) -> torch.Tensor:
    """``[out, size]``: ``1 / length`` where input position ``p`` is in output
    ``i``'s window, else 0: one dim of an adaptive average as a matrix."""
    positions, real, lengths, _ = _window_positions(size, out, device)
    inside = ((positions.unsqueeze(-1) == torch.arange(size, device=device)) & real.unsqueeze(-1)).any(1)
    return inside.to(dtype) / lengths.to(dtype)


def _adaptive_avg_pool_backward(grad: torch.Tensor, x: torch.Tensor, spatial: int):
    """``_adaptive_avg_pool{spatial}d_backward``: each output's gradient
    spread over its window, divided by the window's size.

    An adaptive average is linear and separable, one ``[out, size]`` weight
    matrix a dim (:func:`_window_weights`), so its gradient is the gradient
    contracted with those matrices, dim by dim. torch-mlir failed on the op
    for every output but a global pool (which PyTorch makes a ``mean``): a
    32x32 -> 3x3 pool in training ran its backward in eager, after a
    warning; an 8x8 -> 4x2 one too. float32
    and float64 only; the division by each dim's length in turn, not by the
    window's area: a few ulps.
    """
    checked = _static_sizes(x, list(grad.shape[-spatial:]), spatial)
    if checked is None or x.dtype not in (torch.float32, torch.float64) or grad.dtype != x.dtype:
        return NotImplemented
    sizes, outs = checked
    result = grad
    for axis in range(spatial):
        weights = _window_weights(sizes[axis], outs[axis], x.dtype, x.device)  # [out, size]
        dim = x.dim() - spatial + axis
        result = torch.tensordot(result.movedim(dim, -1), weights, dims=1).movedim(-1, dim)
    return result.contiguous()


def _max_pool2d(x: torch.Tensor, output_size: Sequence[int]):
    """PyTorch's decomposition where it has one (global, or evenly dividing
    windows: a plain max pool), the windowed one otherwise."""
    pytorch = pytorch_decomposition(aten.adaptive_max_pool2d.default)  # from torch 2.12 on
    result = pytorch(x, output_size) if pytorch is not None else NotImplemented
    return _adaptive_max_pool(x, output_size, 2) if result is NotImplemented else result


ADAPTIVE_POOL_DECOMPOSITIONS: dict = {
    aten.adaptive_max_pool2d.default: _max_pool2d,
    aten.adaptive_max_pool3d.default: lambda x, output_size: _adaptive_max_pool(x, output_size, 3),
    aten._adaptive_avg_pool3d.default: lambda x, output_size: _adaptive_avg_pool(x, output_size, 3),
    aten._adaptive_avg_pool2d_backward.default: lambda grad, x: _adaptive_avg_pool_backward(grad, x, 2),
    aten._adaptive_avg_pool3d_backward.default: lambda grad, x: _adaptive_avg_pool_backward(grad, x, 3),
}
