"""Run 1x1 convolutions, and ones with few inputs per output (a stem's),
as a batched matmul in channels-first layout (CPU client).

Why: XLA:CPU runs a convolution channels-last, so a channels-first graph
pays a transpose on each side of it, where the same product as
``weight @ patches[n]`` per image reads the layout it has. 2 CPU cores,
default threads, 1x1 kernel, input [N, Cin, H, W] -> Cout:

    input -> Cout            XLA conv   as bmm    PyTorch (oneDNN)
    [8, 16, 32, 32] -> 64    1.48 ms    0.27 ms   1.88 ms
    [8, 64, 16, 16] -> 24    0.31 ms    0.12 ms   0.11 ms
    [8, 240, 8, 8] -> 40     0.27 ms    0.17 ms   0.20 ms
    [8, 96, 4, 4] -> 576     0.31 ms    0.32 ms   0.17 ms

MobileNet's expand and project convolutions are 1x1 and its stem reads 3
channels; with the depthwise ones as taps (depthwise_convolutions_as_taps.py)
no convolution is left to be timed against oneDNN (passes/kernel_choice.py)
and split off, and the model is one island. A stem on oneDNN in front of
that island cost more than it saved: its channels-last result is copied
for the island and OpenMP's workers spin beside XLA's (runtime/threads.py).

For a kernel larger than 1x1 the patches (the window taps stacked on the
channel dim, convolution_taps.py) are built first; only where a window
holds at most :data:`MAX_WINDOW` values, so that they stay small. Static
2-D convolutions without groups; the same sums.

Before::

    y = aten.convolution(x, w, b, stride, padding, dilation, False, [0, 0], 1)   # w: [O, C, kh, kw]

After (1x1, stride 1, no padding: the patches are x itself)::

    patches = cat([xp[:, :, i::s, j::s] for i, j in kh x kw], 1)                  # [N, kh*kw*C, Ho, Wo]
    rows = view(permute(w, [0, 2, 3, 1]), [1, O, kh*kw*C])                         # the same order
    y = view(bmm(expand(rows, [N, O, kh*kw*C]), view(patches, [N, kh*kw*C, Ho*Wo])), [N, O, Ho, Wo]) + b
"""

from __future__ import annotations

import torch
import torch.fx

from tpu_inductor.passes import convolution_taps as taps
from tpu_inductor.passes.rewrite import GraphBuilder

aten = torch.ops.aten

MAX_WINDOW = 32
"""Values a window may hold (input channels x kernel height x width) for a
convolution larger than 1x1: a 3-channel 3x3 stem (27) qualifies; past it,
the patches are a tensor several times the input's size."""


def convolutions_as_batched_matmuls(gm: torch.fx.GraphModule) -> torch.fx.GraphModule:
    return taps.rewrite_convolutions(gm, _qualifies, _rewrite)


def _qualifies(node: torch.fx.Node) -> bool:
    values = taps.static_convolution(node)
    if values is None or node.args[8] != 1:
        return False
    in_channels, kernel_h, kernel_w = values[1].shape[1:]
    stride, padding = node.args[3:5]
    if (kernel_h, kernel_w) == (1, 1) and taps.pair(stride) == [1, 1] and not any(taps.pair(padding)):
        return True
    return in_channels * kernel_h * kernel_w <= MAX_WINDOW


def _rewrite(build: GraphBuilder) -> None:
    node = build.anchor
    x, w, bias = node.args[:3]
    stride, padding, dilation = (taps.pair(v) for v in node.args[3:6])
    batch, out_channels, out_height, out_width = node.meta["val"].shape
    in_channels, kernel_h, kernel_w = w.meta["val"].shape[1:]
    window = in_channels * kernel_h * kernel_w
    if (kernel_h, kernel_w) == (1, 1) and stride == [1, 1] and not any(padding):
        patches, rows = x, w
    else:
        padded = taps.padded_input(build, x, padding)
        slices = taps.window_taps(build, padded, (kernel_h, kernel_w), stride, dilation, (out_height, out_width))
        patches = build.call(aten.cat.default, [tap for row in slices for tap in row], 1)  # tap-major, then channel
        rows = build.call(aten.permute.default, w, [0, 2, 3, 1])
    if not patches.meta["val"].is_contiguous():
        patches = build.call(aten.clone.default, patches, memory_format=torch.contiguous_format)
    if not rows.meta["val"].is_contiguous():
        rows = build.call(aten.clone.default, rows, memory_format=torch.contiguous_format)
    weights = build.call(aten.view.default, rows, [1, out_channels, window])
    weights = build.call(aten.expand.default, weights, [batch, out_channels, window])
    columns = build.call(aten.view.default, patches, [batch, window, out_height * out_width])
    product = build.call(aten.bmm.default, weights, columns)
    result = build.call(aten.view.default, product, [batch, out_channels, out_height, out_width])
    if bias is not None:
        result = build.call(aten.add.Tensor, result, build.call(aten.view.default, bias, [1, out_channels, 1, 1]))
    build.replace_anchor(result)
