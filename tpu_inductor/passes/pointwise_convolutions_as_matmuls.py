"""Run 1x1 convolutions as a batched matmul in channels-first layout (CPU client).

Why: XLA:CPU runs a convolution channels-last, so a channels-first graph
pays a transpose on each side of every 1x1 convolution, where the same
product as ``weight @ x[n]`` per image reads the layout it has. 2 CPU
cores, default threads, input [N, Cin, H, W] -> Cout:

    input -> Cout            XLA conv   as bmm    PyTorch (oneDNN)
    [8, 16, 32, 32] -> 64    1.48 ms    0.27 ms   1.88 ms
    [8, 64, 16, 16] -> 24    0.31 ms    0.12 ms   0.11 ms
    [8, 240, 8, 8] -> 40     0.27 ms    0.17 ms   0.20 ms
    [8, 96, 4, 4] -> 576     0.31 ms    0.32 ms   0.17 ms

MobileNet's expand and project convolutions are 1x1; with the depthwise
ones as taps (depthwise_convolutions_as_taps.py) only its stem is left
for kernel choice (placement/kernel_choice.py) to time against oneDNN, and
the blocks are one island. The matmul is a float32 dot, which XLA does as
well as oneDNN. Tried and not kept: stems and strided 1x1 convolutions as
a matmul over their patches (windows of up to 32 values): MobileNet's
stem ran better on oneDNN (1.09x and 1.47x eager against 0.98x and 1.02x,
perf.py at default threads) and perf.py's ResNet-style CNN at one thread
went 1.11x/1.08x -> 0.95x/0.99x eager, building the patches.

Static 2-D convolutions with a 1x1 kernel, stride 1, no padding and no
groups; the same sums.

Before::

    y = aten.convolution(x, w, b, [1, 1], [0, 0], dilation, False, [0, 0], 1)   # w: [O, C, 1, 1]

After::

    y = view(bmm(expand(view(w, [1, O, C]), [N, O, C]), view(x, [N, C, H*W])), [N, O, H, W]) + view(b, [1, O, 1, 1])
"""

from __future__ import annotations

import torch
import torch.fx

from tpu_inductor.passes import convolution_taps as taps
from tpu_inductor.passes.rewrite import GraphBuilder

aten = torch.ops.aten


def pointwise_convolutions_as_matmuls(gm: torch.fx.GraphModule) -> torch.fx.GraphModule:
    return taps.rewrite_convolutions(gm, _qualifies, _rewrite)


def _qualifies(convolution: taps.Convolution) -> bool:
    return (
        convolution.groups == 1
        and convolution.kernel == [1, 1]
        and convolution.stride == [1, 1]
        and not any(convolution.padding)
    )


def _rewrite(build: GraphBuilder, convolution: taps.Convolution) -> None:
    x, w = convolution.x, convolution.weight
    batch, out_channels, height, width = convolution.output_value.shape
    in_channels = convolution.weight_value.shape[1]
    if not convolution.weight_value.is_contiguous():
        w = build.call(aten.clone.default, w, memory_format=torch.contiguous_format)
    if not convolution.input_value.is_contiguous():
        x = build.call(aten.clone.default, x, memory_format=torch.contiguous_format)
    weights = build.call(aten.view.default, w, [1, out_channels, in_channels])
    weights = build.call(aten.expand.default, weights, [batch, out_channels, in_channels])
    pixels = build.call(aten.view.default, x, [batch, in_channels, height * width])
    product = convolution.product(build, aten.bmm.default, weights, pixels)
    result = build.call(aten.view.default, product, [batch, out_channels, height, width])
    build.replace_anchor(convolution.add_bias(build, result))
