"""Run convolutions with few output positions as one matmul (CPU client).

Why: XLA:CPU's convolution is very slow when the output has few positions and
the weight is large, the last stages of a ResNet on small images. One
thread, 3x3 kernel, padding 1:

    input [N, C, H, W]      XLA conv   as a matmul   PyTorch (oneDNN)
    [1, 512, 2, 2]          22.0 ms    0.36 ms       2.94 ms
    [8, 512, 2, 2]         139.0 ms    1.95 ms       3.64 ms
    [1, 256, 4, 4]           0.60 ms   0.28 ms       0.39 ms
    [1, 512, 7, 7]           6.55 ms   4.28 ms       3.92 ms  (49 rows: left alone)
    [16, 128, 8, 8]          3.17 ms   4.65 ms       2.52 ms  (1024 rows: left alone)

With at most :data:`MAX_ROWS` output positions (batch x height x width), the
input patches ("im2col") are a small matrix, and the product with the
weight read in place is the thin-times-wide matmul XLA:CPU does well
(lowering/cpu_dot_operands.py). Static 2-D convolutions without groups only;
the values are the same sums in another order.

Before::

    y = aten.convolution(x, w, b, stride, padding, dilation, False, [0, 0], 1)

After (3x3 kernel)::

    xp = aten.constant_pad_nd(x, [pw, pw, ph, ph])
    patches = cat([unsqueeze(xp[:, :, i::s, j::s], 2) for i, j in 3x3], 2)   # [N, C, 9, Ho, Wo]
    rows = view(clone(permute(patches, [0, 3, 4, 1, 2])), [N*Ho*Wo, C*9])
    y = permute(view(mm(rows, t(view(w, [O, C*9]))), [N, Ho, Wo, O]), [0, 3, 1, 2]) + b

A patch embedding (stride = kernel, ViT's and CLIP's: windows that do not
overlap) takes its patches with one view instead of a slice per tap::

    patches = permute(view(xp[:, :, :Ho*kh, :Wo*kw], [N, C, Ho, kh, Wo, kw]), [0, 2, 4, 1, 3, 5])
    rows = view(clone(patches), [N*Ho*Wo, C*kh*kw])

A slice per tap would be 1,024 slices for CLIP's 32x32 patches, which XLA
took 12.6 s to compile (one island of a tiny CLIP, 0.77 s with the view).
Overlapping windows are rewritten only up to :data:`convolution_taps.MAX_TAPS`
taps; past that XLA's convolution is left to do it.
"""

from __future__ import annotations

import torch
import torch.fx

from tpu_inductor.passes import convolution_taps as taps
from tpu_inductor.passes.rewrite import GraphBuilder

aten = torch.ops.aten

MAX_ROWS = 32
"""Output positions (batch x height x width) up to which the matmul form is
used: up to 32 it measured faster than both XLA's convolution and oneDNN's;
at 49 ([1, 512, 7, 7]) oneDNN was faster, and at 1024 ([16, 128, 8, 8])
building the patches cost more than XLA's convolution."""


def small_convolutions_as_matmuls(gm: torch.fx.GraphModule) -> torch.fx.GraphModule:
    return taps.rewrite_convolutions(gm, _qualifies, _rewrite)


def _qualifies(convolution: taps.Convolution) -> bool:
    if convolution.groups != 1 or not convolution.weight_value.is_contiguous():
        return False
    batch, _, height, width = convolution.output_value.shape
    few_taps = convolution.has_few_taps() or _windows_are_disjoint(convolution)
    return batch * height * width <= MAX_ROWS and few_taps


def _windows_are_disjoint(convolution: taps.Convolution) -> bool:
    """Each input position feeds one output position at most (a patch embedding)."""
    return convolution.stride == convolution.kernel and convolution.dilation == [1, 1]


def _rewrite(build: GraphBuilder, convolution: taps.Convolution) -> None:
    batch, out_channels, out_height, out_width = convolution.output_value.shape
    in_channels, kernel_h, kernel_w = convolution.weight_value.shape[1:]
    padded = taps.padded_input(build, convolution.x, convolution.padding)
    if _windows_are_disjoint(convolution):
        positions_first = _disjoint_patches(build, convolution, padded)  # [N, Ho, Wo, C, kh, kw]
    else:
        slices = taps.window_taps(
            build, padded, (kernel_h, kernel_w), convolution.stride, convolution.dilation, (out_height, out_width)
        )
        unsqueezed = [build.call(aten.unsqueeze.default, tap, 2) for row in slices for tap in row]
        patches = build.call(aten.cat.default, unsqueezed, 2)  # [N, C, kh*kw, Ho, Wo]
        positions_first = build.call(aten.permute.default, patches, [0, 3, 4, 1, 2])
    dense = build.call(aten.clone.default, positions_first, memory_format=torch.contiguous_format)
    patch_size = in_channels * kernel_h * kernel_w
    rows = build.call(aten.view.default, dense, [batch * out_height * out_width, patch_size])
    weight = build.call(aten.view.default, convolution.weight, [out_channels, patch_size])
    product = convolution.product(build, aten.mm.default, rows, build.call(aten.t.default, weight))
    image = build.call(aten.view.default, product, [batch, out_height, out_width, out_channels])
    result = convolution.add_bias(build, build.call(aten.permute.default, image, [0, 3, 1, 2]))
    # The convolution's own (contiguous) layout, for any eager reader.
    build.replace_anchor(build.call(aten.clone.default, result, memory_format=torch.contiguous_format))


def _disjoint_patches(build: GraphBuilder, convolution: taps.Convolution, padded: torch.fx.Node) -> torch.fx.Node:
    """``[N, Ho, Wo, C, kh, kw]``: the windows of a convolution whose stride is
    its kernel, as a view of the input (rows and columns past the last whole
    window cut off first)."""
    batch, _, out_height, out_width = convolution.output_value.shape
    in_channels, kernel_h, kernel_w = convolution.weight_value.shape[1:]
    covered = padded
    for dim, size in ((2, out_height * kernel_h), (3, out_width * kernel_w)):
        covered = build.call(aten.slice.Tensor, covered, dim, 0, size)
    windows = build.call(aten.view.default, covered, [batch, in_channels, out_height, kernel_h, out_width, kernel_w])
    return build.call(aten.permute.default, windows, [0, 2, 4, 1, 3, 5])
