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
"""

from __future__ import annotations

import torch
import torch.fx

from tpu_inductor.passes.rewrite import GraphBuilder

aten = torch.ops.aten

MAX_ROWS = 32
"""Output positions (batch x height x width) up to which the matmul form is
used: up to 32 it measured faster than both XLA's convolution and oneDNN's;
at 49 ([1, 512, 7, 7]) oneDNN was faster, and at 1024 ([16, 128, 8, 8])
building the patches cost more than XLA's convolution."""


def small_convolutions_as_matmuls(gm: torch.fx.GraphModule) -> torch.fx.GraphModule:
    convolutions = [n for n in gm.graph.find_nodes(op="call_function", target=aten.convolution.default) if _qualifies(n)]
    for node in convolutions:
        with gm.graph.inserting_before(node):
            _rewrite(GraphBuilder(gm.graph, node))
    if convolutions:
        gm.recompile()
    return gm


def _qualifies(node: torch.fx.Node) -> bool:
    x, w, bias, _stride, _padding, _dilation, transposed, _output_padding, groups = node.args
    output = node.meta.get("val")
    values = [a.meta.get("val") for a in (x, w)]
    if transposed or groups != 1 or not isinstance(output, torch.Tensor) or output.dim() != 4:
        return False
    if not all(isinstance(v, torch.Tensor) and v.dtype.is_floating_point for v in values):
        return False
    shapes = [*output.shape, *values[0].shape, *values[1].shape]
    if not all(isinstance(s, int) for s in shapes) or not values[1].is_contiguous():
        return False
    batch, _, height, width = output.shape
    return batch * height * width <= MAX_ROWS


def _pair(values: list[int]) -> list[int]:
    """aten.convolution takes one value for both spatial dims too ("valid" padding: [0])."""
    return list(values) * 2 if len(values) == 1 else list(values)


def _rewrite(build: GraphBuilder) -> None:
    node = build.anchor
    x, w, bias = node.args[:3]
    stride, padding, dilation = (_pair(v) for v in node.args[3:6])
    batch, out_channels, out_height, out_width = node.meta["val"].shape
    in_channels, kernel_h, kernel_w = w.meta["val"].shape[1:]
    padded = build.call(aten.constant_pad_nd.default, x, [padding[1], padding[1], padding[0], padding[0]], 0.0)
    taps = []
    for i in range(kernel_h):
        for j in range(kernel_w):
            rows = build.call(
                aten.slice.Tensor, padded, 2, i * dilation[0], i * dilation[0] + stride[0] * (out_height - 1) + 1, stride[0]
            )
            tap = build.call(
                aten.slice.Tensor, rows, 3, j * dilation[1], j * dilation[1] + stride[1] * (out_width - 1) + 1, stride[1]
            )
            taps.append(build.call(aten.unsqueeze.default, tap, 2))
    patches = build.call(aten.cat.default, taps, 2)  # [N, C, kh*kw, Ho, Wo]
    positions_first = build.call(aten.permute.default, patches, [0, 3, 4, 1, 2])
    dense = build.call(aten.clone.default, positions_first, memory_format=torch.contiguous_format)
    patch_size = in_channels * kernel_h * kernel_w
    rows = build.call(aten.view.default, dense, [batch * out_height * out_width, patch_size])
    weight = build.call(aten.view.default, w, [out_channels, patch_size])
    product = build.call(aten.mm.default, rows, build.call(aten.t.default, weight))
    image = build.call(aten.view.default, product, [batch, out_height, out_width, out_channels])
    result = build.call(aten.permute.default, image, [0, 3, 1, 2])
    if bias is not None:
        result = build.call(aten.add.Tensor, result, build.call(aten.view.default, bias, [1, out_channels, 1, 1]))
    # The convolution's own (contiguous) layout, for any eager reader.
    build.replace_anchor(build.call(aten.clone.default, result, memory_format=torch.contiguous_format))
