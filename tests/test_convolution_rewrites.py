"""Depthwise convolutions as taps and 1x1 convolutions as batched
matmuls on the CPU client (passes/depthwise_convolutions_as_taps.py,
passes/pointwise_convolutions_as_matmuls.py).

Both run the same products summed in another order, so float32 values are
compared at torch.testing's defaults (rtol 1.3e-6, atol 1e-5), half
precision at its own (the taps accumulate in float32 as oneDNN does).
"""

from __future__ import annotations

import copy

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.fx.experimental.proxy_tensor import make_fx

import tpu_inductor.report as report
from tpu_inductor.passes.pointwise_convolutions_as_matmuls import pointwise_convolutions_as_matmuls
from tpu_inductor.passes.depthwise_convolutions_as_taps import depthwise_convolutions_as_taps

aten = torch.ops.aten


def _convolutions(gm) -> int:
    return len(gm.graph.find_nodes(op="call_function", target=aten.convolution.default))


@pytest.mark.parametrize(
    "input_shape, kernel, kwargs",
    [
        ((2, 8, 9, 9), 3, {"padding": 1}),
        ((2, 8, 9, 9), 3, {"stride": 2, "padding": 1}),
        ((1, 6, 12, 12), 5, {"stride": 2, "padding": 2}),
        ((1, 4, 11, 11), 3, {"dilation": 2, "padding": 2}),
        ((1, 4, 8, 10), (1, 3), {"padding": (0, 1)}),  # rectangular kernel
        ((1, 4, 7, 7), 3, {}),  # no padding
    ],
)
@pytest.mark.parametrize("with_bias", [False, True])
def test_depthwise_taps_match_eager(input_shape, kernel, kwargs, with_bias):
    torch.manual_seed(0)
    channels = input_shape[1]
    kh, kw = (kernel, kernel) if isinstance(kernel, int) else kernel
    args = [torch.randn(input_shape), torch.randn(channels, 1, kh, kw)]
    if with_bias:
        args.append(torch.randn(channels))

    def conv(*a):
        return F.conv2d(*a, groups=channels, **kwargs)

    gm = depthwise_convolutions_as_taps(make_fx(conv, tracing_mode="fake")(*args))
    assert _convolutions(gm) == 0
    torch.testing.assert_close(gm(*args), conv(*args))


def test_half_precision_depthwise_sums_in_float32():
    torch.manual_seed(0)
    x, w = torch.randn(2, 16, 8, 8, dtype=torch.bfloat16), torch.randn(16, 1, 5, 5, dtype=torch.bfloat16)
    traced = make_fx(lambda a, b: F.conv2d(a, b, padding=2, groups=16), tracing_mode="fake")(x, w)
    gm = depthwise_convolutions_as_taps(traced)
    converts = gm.graph.find_nodes(op="call_function", target=torch.ops.prims.convert_element_type.default)
    assert {n.args[1] for n in converts} == {torch.float32, torch.bfloat16}
    expected = F.conv2d(x.float(), w.float(), padding=2, groups=16).bfloat16()
    torch.testing.assert_close(gm(x, w), expected)


@pytest.mark.parametrize(
    "input_shape, weight_shape, kwargs",
    [
        ((2, 16, 6, 6), (32, 16, 1, 1), {}),
        ((1, 96, 4, 4), (576, 96, 1, 1), {}),
        ((3, 8, 5, 7), (4, 8, 1, 1), {"dilation": 2}),  # dilation means nothing to a 1x1 kernel
    ],
)
@pytest.mark.parametrize("with_bias", [False, True])
def test_batched_matmul_convolutions_match_eager(input_shape, weight_shape, kwargs, with_bias):
    torch.manual_seed(0)
    args = [torch.randn(input_shape), torch.randn(weight_shape)]
    if with_bias:
        args.append(torch.randn(weight_shape[0]))
    gm = pointwise_convolutions_as_matmuls(make_fx(lambda *a: F.conv2d(*a, **kwargs), tracing_mode="fake")(*args))
    assert _convolutions(gm) == 0
    assert gm.graph.find_nodes(op="call_function", target=aten.bmm.default)
    torch.testing.assert_close(gm(*args), F.conv2d(*args, **kwargs))


@pytest.mark.parametrize(
    "rewrite, input_shape, weight_shape, kwargs",
    [
        # Depthwise with a channel multiplier: each input channel feeds two outputs.
        (depthwise_convolutions_as_taps, (1, 4, 6, 6), (8, 1, 3, 3), {"padding": 1, "groups": 4}),
        # Grouped, not depthwise.
        (depthwise_convolutions_as_taps, (1, 8, 6, 6), (8, 2, 3, 3), {"padding": 1, "groups": 4}),
        # 81 taps, more than MAX_TAPS: XLA's compile time grows with them.
        (depthwise_convolutions_as_taps, (1, 4, 12, 12), (4, 1, 9, 9), {"padding": 4, "groups": 4}),
        (pointwise_convolutions_as_matmuls, (1, 8, 6, 6), (8, 8, 3, 3), {"padding": 1}),  # not 1x1
        (pointwise_convolutions_as_matmuls, (1, 8, 6, 6), (8, 8, 1, 1), {"stride": 2}),
        (pointwise_convolutions_as_matmuls, (1, 8, 6, 6), (8, 8, 1, 1), {"padding": 1}),
        (pointwise_convolutions_as_matmuls, (1, 8, 6, 6), (8, 4, 1, 1), {"groups": 2}),
    ],
)
def test_other_convolutions_are_left_alone(rewrite, input_shape, weight_shape, kwargs):
    args = torch.randn(input_shape), torch.randn(weight_shape)
    gm = rewrite(make_fx(lambda x, w: F.conv2d(x, w, **kwargs), tracing_mode="fake")(*args))
    assert _convolutions(gm) == 1


class InvertedResidual(nn.Module):
    """MobileNetV3's block: expand 1x1, depthwise, project 1x1, residual."""

    def __init__(self, channels: int, hidden: int, kernel: int) -> None:
        super().__init__()
        self.expand = nn.Sequential(nn.Conv2d(channels, hidden, 1, bias=False), nn.BatchNorm2d(hidden), nn.Hardswish())
        self.depthwise = nn.Sequential(
            nn.Conv2d(hidden, hidden, kernel, 1, kernel // 2, groups=hidden, bias=False),
            nn.BatchNorm2d(hidden),
            nn.Hardswish(),
        )
        self.project = nn.Sequential(nn.Conv2d(hidden, channels, 1, bias=False), nn.BatchNorm2d(channels))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.project(self.depthwise(self.expand(x)))


def _mobilenet() -> nn.Module:
    torch.manual_seed(0)
    model = nn.Sequential(
        nn.Conv2d(3, 16, 3, 2, 1, bias=False),
        nn.BatchNorm2d(16),
        nn.Hardswish(),
        InvertedResidual(16, 48, 3),
        InvertedResidual(16, 64, 5),
        nn.AdaptiveAvgPool2d(1),
        nn.Flatten(),
        nn.Linear(16, 10),
    )
    for module in model.modules():  # running statistics other than 0 and 1
        if isinstance(module, nn.BatchNorm2d):
            module.running_mean.uniform_(-0.5, 0.5)
            module.running_var.uniform_(0.5, 2.0)
    return model.eval()


def test_mobilenet_style_inference_keeps_only_the_stem_a_convolution():
    """The depthwise and 1x1 convolutions are rewritten; the stem is left
    for kernel choice, which is off here (its verdict is this machine's)."""
    model = _mobilenet()
    x = torch.randn(4, 3, 32, 32)
    compiled = torch.compile(model, backend="tpu", options={"cache": False, "eager_kernels": False})
    with torch.no_grad():
        torch.testing.assert_close(compiled(x), model(x))
    (graph,) = report.current().graphs
    assert len(graph.islands) == 1 and not graph.fallbacks
    assert graph.islands[0].ops["aten.convolution.default"] == 1
    assert graph.islands[0].ops["aten.bmm.default"] == 4  # two 1x1 convolutions a block


def test_mobilenet_style_training_gradients_match_eager():
    """The forward's convolutions are rewritten; the backward's
    convolution_backward must still see the same values."""
    model = _mobilenet().train()
    compiled_model = copy.deepcopy(model)
    x = torch.randn(2, 3, 16, 16)
    model(x).square().mean().backward()
    torch.compile(compiled_model, backend="tpu", options={"cache": False})(x).square().mean().backward()
    for (name, p), q in zip(model.named_parameters(), compiled_model.parameters()):
        torch.testing.assert_close(q.grad, p.grad, msg=lambda m: f"{name}: {m}")
