"""What the passes that rebuild a 2-D convolution from simpler ops share
(small_convolutions_as_matmuls.py, depthwise_convolutions_as_taps.py,
pointwise_convolutions_as_matmuls.py): which convolutions they may take, the
loop that rewrites them, and the window taps as strided slices.

Tap ``(i, j)`` is the input, padded, sliced so that output position
``(y, x)`` reads input position ``(y * stride + i * dilation, x * stride +
j * dilation)``: the convolution is ``sum over taps of tap * weight[..., i, j]``.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, Optional, Sequence

import torch
import torch.fx

from tpu_inductor.half_precision import HALF_FLOATS
from tpu_inductor.passes.rewrite import GraphBuilder

aten = torch.ops.aten
prims = torch.ops.prims

MAX_TAPS = 64
"""Kernel taps (``kh * kw``) up to which a convolution is rebuilt from one
slice per tap. Each tap is a few graph nodes, and XLA's compile time grows
with them: 1,024 taps (CLIP's 32x32 patch embedding) took 12.6 s to
compile. The rewrites were timed at 3x3 and 5x5 kernels (9 and 25 taps);
ConvNeXt's 7x7 depthwise convolutions (49) go through them in the tests."""


@dataclasses.dataclass(frozen=True)
class Convolution:
    """A forward 2-D float convolution whose every size is known, as the rewrites read it."""

    x: torch.fx.Node
    weight: torch.fx.Node
    bias: Optional[torch.fx.Node]
    stride: list[int]
    padding: list[int]
    dilation: list[int]
    groups: int
    input_value: torch.Tensor
    weight_value: torch.Tensor
    output_value: torch.Tensor

    @property
    def kernel(self) -> list[int]:
        """The kernel's spatial size, ``[kh, kw]``."""
        return list(self.weight_value.shape[2:])

    def has_few_taps(self) -> bool:
        """Whether one slice per kernel tap makes a graph XLA compiles quickly (:data:`MAX_TAPS`)."""
        kernel_h, kernel_w = self.kernel
        return kernel_h * kernel_w <= MAX_TAPS

    def product(self, build: GraphBuilder, matmul: Any, lhs: torch.fx.Node, rhs: torch.fx.Node) -> torch.fx.Node:
        """``matmul(lhs, rhs)``, in float32 where a half-precision convolution
        adds a bias to it: eager adds the bias to its float32 accumulator and
        rounds once, and a half product would round before the bias (0.9 ulp
        against eager's 0.5 on OpInfo's float16 ``conv2d``). :meth:`add_bias`
        rounds the sum."""
        if self.bias is not None:
            lhs, rhs = self.accumulating(build, lhs, rhs)
        return build.call(matmul, lhs, rhs)

    def accumulating(self, build: GraphBuilder, *values: torch.fx.Node) -> tuple[torch.fx.Node, ...]:
        """``values`` in the dtype this convolution accumulates in: float32 for
        a half-precision convolution (eager's kernels sum in float32 and round
        once), their own dtype otherwise. Converting half to float32 is exact."""
        if self.output_value.dtype not in HALF_FLOATS:
            return values
        return tuple(build.call(prims.convert_element_type.default, value, torch.float32) for value in values)

    def add_bias(self, build: GraphBuilder, result: torch.fx.Node) -> torch.fx.Node:
        """``result`` ``[N, O, H, W]`` plus the bias per output channel, if there
        is one, rounded once to the convolution's dtype (a half-precision
        convolution's ``result`` may be its float32 sum)."""
        dtype = self.output_value.dtype
        wide = result.meta["val"].dtype
        if self.bias is not None:
            channels = self.output_value.shape[1]
            bias = build.call(aten.view.default, self.bias, [1, channels, 1, 1])
            if wide != dtype:
                bias = build.call(prims.convert_element_type.default, bias, wide)
            result = build.call(aten.add.Tensor, result, bias)
        if wide != dtype:
            result = build.call(prims.convert_element_type.default, result, dtype)
        return result


def static_convolution(node: torch.fx.Node) -> Optional[Convolution]:
    """``node`` read as a :class:`Convolution`; None unless it is a forward 2-D
    float convolution whose every size is known."""
    x, w, bias, stride, padding, dilation, transposed, _output_padding, groups = node.args
    output = node.meta.get("val")
    if transposed or not isinstance(output, torch.Tensor) or output.dim() != 4:
        return None
    if not (isinstance(x, torch.fx.Node) and isinstance(w, torch.fx.Node)):
        return None
    values = (x.meta.get("val"), w.meta.get("val"))
    if not all(isinstance(v, torch.Tensor) and v.dtype.is_floating_point for v in values):
        return None
    if not all(isinstance(s, int) for s in [*output.shape, *values[0].shape, *values[1].shape]):
        return None
    return Convolution(x, w, bias, pair(stride), pair(padding), pair(dilation), groups, *values, output)


def rewrite_convolutions(
    gm: torch.fx.GraphModule,
    qualifies: Callable[[Convolution], bool],
    rewrite: Callable[[GraphBuilder, Convolution], None],
) -> torch.fx.GraphModule:
    """``rewrite`` every static ``aten.convolution`` node that ``qualifies``, in place of it."""
    convolutions = [
        (node, convolution)
        for node in gm.graph.find_nodes(op="call_function", target=aten.convolution.default)
        if (convolution := static_convolution(node)) is not None and qualifies(convolution)
    ]
    for node, convolution in convolutions:
        with gm.graph.inserting_before(node):
            rewrite(GraphBuilder(gm.graph, node), convolution)
    if convolutions:
        gm.recompile()
    return gm


def pair(values: Sequence[int]) -> list[int]:
    """aten.convolution takes one value for both spatial dims too ("valid" padding: [0])."""
    return list(values) * 2 if len(values) == 1 else list(values)


def padded_input(build: GraphBuilder, x: torch.fx.Node, padding: Sequence[int]) -> torch.fx.Node:
    """``x`` with the convolution's zero padding on both spatial dims."""
    if not any(padding):
        return x
    return build.call(aten.constant_pad_nd.default, x, [padding[1], padding[1], padding[0], padding[0]], 0.0)


def window_taps(
    build: GraphBuilder,
    padded: torch.fx.Node,
    kernel: Sequence[int],
    stride: Sequence[int],
    dilation: Sequence[int],
    output_size: Sequence[int],
) -> list[list[torch.fx.Node]]:
    """``taps[i][j]``: the ``[N, C, Ho, Wo]`` slice of ``padded`` that kernel tap ``(i, j)`` reads."""
    out_height, out_width = output_size
    taps = []
    for i in range(kernel[0]):
        start = i * dilation[0]
        rows = build.call(aten.slice.Tensor, padded, 2, start, start + stride[0] * (out_height - 1) + 1, stride[0])
        row_taps = []
        for j in range(kernel[1]):
            start = j * dilation[1]
            row_taps.append(
                build.call(aten.slice.Tensor, rows, 3, start, start + stride[1] * (out_width - 1) + 1, stride[1])
            )
        taps.append(row_taps)
    return taps
