"""Run depthwise convolutions as a sum of shifted, scaled slices (CPU client).

Why: XLA:CPU's grouped convolution with one channel per group (MobileNet's
depthwise 3x3 and 5x5) takes milliseconds where the same sums written as
elementwise multiply-adds take microseconds. 2 CPU cores, default threads,
input [N, C, H, W], kernel k, stride s:

    input, k, s           XLA conv   as taps   PyTorch (oneDNN)
    [8, 64, 32, 32], 3, 2  6.25 ms   0.26 ms   0.18 ms
    [8, 72, 16, 16], 3, 1  5.59 ms   0.22 ms   0.17 ms
    [8, 240, 8, 8], 5, 1   5.67 ms   0.17 ms   0.12 ms
    [8, 576, 8, 8], 5, 2   5.56 ms   0.31 ms   0.13 ms

The taps form is one loop fusion, so the BatchNorm and activation around the
convolution fuse into it instead of each making a pass over memory (and
instead of kernel choice sending the convolution to oneDNN, which split a
MobileNet-style model into 14 islands). Channels-first taps measured faster
than channels-last ones (XLA:CPU vectorises along the contiguous width).

Static 2-D convolutions whose groups equal the input channels and the output
channels (multiplier 1); the sum of the same products in another order.
Half-precision inputs are summed in float32, as oneDNN accumulates. Kernels
of more than ``convolution_taps.MAX_TAPS`` taps stay convolutions: XLA's
compile time grows with the taps.

Before::

    y = aten.convolution(x, w, b, stride, padding, dilation, False, [0, 0], groups=C)  # w: [C, 1, kh, kw]

After::

    xp = aten.constant_pad_nd(x, [pw, pw, ph, ph])
    y = sum(xp[:, :, i::s, j::s] * view(w[:, 0, i, j], [1, C, 1, 1]) for i, j in kh x kw) + view(b, [1, C, 1, 1])
"""

from __future__ import annotations

import torch
import torch.fx

from tpu_inductor.passes import convolution_taps as taps
from tpu_inductor.passes.rewrite import GraphBuilder

aten = torch.ops.aten


def depthwise_convolutions_as_taps(gm: torch.fx.GraphModule) -> torch.fx.GraphModule:
    return taps.rewrite_convolutions(gm, _qualifies, _rewrite)


def _qualifies(convolution: taps.Convolution) -> bool:
    channels = convolution.input_value.shape[1]
    return (
        convolution.has_few_taps()
        and convolution.groups == channels > 1
        and tuple(convolution.weight_value.shape[:2]) == (channels, 1)
        and convolution.output_value.shape[1] == channels
    )


def _rewrite(build: GraphBuilder, convolution: taps.Convolution) -> None:
    x, w = convolution.x, convolution.weight
    output = convolution.output_value
    channels, _, kernel_h, kernel_w = convolution.weight_value.shape
    x, w = convolution.accumulating(build, x, w)  # the taps' sum in float32 for a half convolution, as eager's
    padded = taps.padded_input(build, x, convolution.padding)
    slices = taps.window_taps(
        build, padded, (kernel_h, kernel_w), convolution.stride, convolution.dilation, output.shape[2:]
    )
    scales = _scales_by_tap(build, w, channels, kernel_h * kernel_w)
    total = None
    for i in range(kernel_h):
        for j in range(kernel_w):
            scale = build.call(aten.select.int, scales, 0, i * kernel_w + j)  # [1, C, 1, 1]
            term = build.call(aten.mul.Tensor, slices[i][j], scale)
            total = term if total is None else build.call(aten.add.Tensor, total, term)
    total = convolution.add_bias(build, total)  # the bias joins in float32 too, then one rounding
    if not total.meta["val"].is_contiguous():
        # The convolution's own (contiguous) layout, for any eager reader.
        total = build.call(aten.clone.default, total, memory_format=torch.contiguous_format)
    build.replace_anchor(total)


def _scales_by_tap(build: GraphBuilder, w: torch.fx.Node, channels: int, taps: int) -> torch.fx.Node:
    """The kernel ``[C, 1, kh, kw]`` as ``[kh * kw, 1, C, 1, 1]``: tap ``t``'s
    per-channel scales are one ``select``, not a select, a select and a view
    per tap. Each node costs the passes a FakeTensor call (~0.5 ms) and every
    later stage its share: timm's CoaT (104 depthwise convolutions up to
    7x7) had 20,012 nodes in its inference graph with three, 15,540 with one."""
    by_tap = build.call(aten.clone.default, build.call(aten.permute.default, w, [2, 3, 1, 0]),
                        memory_format=torch.contiguous_format)  # [kh, kw, 1, C], contiguous
    return build.call(aten.view.default, by_tap, [taps, 1, channels, 1, 1])
