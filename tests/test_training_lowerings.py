"""Training-step ops torch-mlir rejects, decomposed so they lower:
grouped (depthwise) convolution backwards (decompositions/convolution_backward.py)
and average-pooling backwards (decompositions/pooling_backward.py).

Gradients are compared with eager at the float32 defaults, except where a
test says otherwise: each sums at most a few hundred products, in another
order than oneDNN's.
"""

from __future__ import annotations

import copy

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import tpu_inductor.report as report

OPTIONS = {"cache": False, "eager_kernels": False}  # every convolution on the device, none timed


def _gradients(fn, x: torch.Tensor, wrt: list[torch.Tensor]):
    expected = torch.autograd.grad(fn(x), wrt)
    actual = torch.autograd.grad(torch.compile(fn, backend="tpu", options=OPTIONS)(x), wrt)
    return actual, expected


def _fallback_ops() -> list[str]:
    return [f.op for f in report.current().fallbacks()]


def _island_ops() -> set[str]:
    return {op for island in report.current().islands() for op in island.ops}


def _assert_training_graphs_on_device() -> None:
    assert [g.kind for g in report.current().graphs] == ["forward", "backward"]
    assert all(g.islands for g in report.current().graphs)
    assert _fallback_ops() == []


@pytest.mark.parametrize(
    "conv",
    [
        lambda: nn.Conv2d(8, 8, 3, 1, 1, groups=8),  # depthwise
        lambda: nn.Conv2d(8, 8, 3, 2, 1, groups=8),  # depthwise, strided
        lambda: nn.Conv2d(6, 12, (3, 5), (1, 2), (0, 2), (2, 1), groups=6),  # channel multiplier
        lambda: nn.Conv2d(4, 6, 3, 2, 2, 2, groups=2),  # several channels per group
        lambda: nn.Conv2d(6, 6, 2, 3, 0, groups=3, bias=False),  # stride past the kernel
        lambda: nn.Conv3d(4, 8, 3, (1, 2, 1), 1, (2, 1, 1), groups=2),
        lambda: nn.ConvTranspose2d(8, 8, 3, 2, 1, 1, groups=8),
        lambda: nn.ConvTranspose2d(4, 6, 3, 2, 1, 1, groups=2, dilation=2),
        # Ungrouped: torch-mlir's backward is 2-d and undilated only, these
        # failed to legalize (``torch.constant.int``) and ran in eager.
        lambda: nn.Conv2d(4, 2, 3, 1, 1, 2),  # dilated (torch-mlir's e2e ConvolutionBackwardModule2DDilated)
        lambda: nn.Conv2d(3, 5, (3, 2), (2, 1), (1, 0), (1, 3), bias=False),
        lambda: nn.Conv3d(6, 4, (3, 1, 3), 1, (1, 0, 1)),  # ConvolutionBackwardModule3DStatic, smaller
        lambda: nn.Conv3d(3, 4, 2, 2, 1, 2),
        # Ungrouped transposed ones failed the same way, stride 1 included.
        lambda: nn.ConvTranspose2d(3, 2, 3, stride=2, output_padding=1),  # the usual upsampling layer
        lambda: nn.ConvTranspose2d(3, 2, 3),
        lambda: nn.ConvTranspose1d(3, 2, 4, stride=2, output_padding=1),
    ],
    ids=[
        "depthwise", "depthwise-strided", "multiplier", "groups-2", "stride-gt-kernel", "3d",
        "transposed-depthwise", "transposed-grouped",
        "2d-dilated", "2d-dilated-strided", "3d-ungrouped", "3d-strided-dilated",
        "transposed-upsampling", "transposed-stride-1", "transposed-1d",
    ],
)
def test_convolution_backward_torch_mlir_rejects_lowers_by_taps(conv):
    """torch-mlir rejected these backwards ("operand and result must have the
    same size", XLA's "feature_group_count", or an unlegalized constant);
    decomposed tap by tap, the whole training graph lowers."""
    torch.manual_seed(0)
    conv = conv()
    spatial = (9, 10, 7)[: conv.weight.dim() - 2]
    x = torch.randn(2, conv.in_channels, *spatial, requires_grad=True)
    wrt = [x] + list(conv.parameters())
    actual, expected = _gradients(lambda x: (conv(x).tanh() ** 2).sum(), x, wrt)
    # rtol 1e-5: a bias or weight gradient sums up to ~700 terms of size ~1
    # (N * H_out * W_out); XLA's sequential float32 sum and oneDNN's blocked
    # one differ by a few ulps of the sum (3.6e-6 measured, transposed-grouped).
    torch.testing.assert_close(actual, expected, rtol=1e-5, atol=1e-5)
    _assert_training_graphs_on_device()
    assert "aten.convolution_backward.default" not in _island_ops()


def test_depthwise_weight_gradient_only():
    """A first layer: the input needs no gradient, only the weight's is built."""
    torch.manual_seed(0)
    conv = nn.Conv2d(4, 4, 3, 1, 1, groups=4)
    x = torch.randn(2, 4, 8, 8)
    wrt = list(conv.parameters())
    actual, expected = _gradients(lambda x: conv(x).square().sum(), x, wrt)
    torch.testing.assert_close(actual, expected)
    _assert_training_graphs_on_device()


def test_ungrouped_convolution_backward_stays_one_op():
    torch.manual_seed(0)
    conv = nn.Conv2d(3, 4, 3, 2, 1)
    x = torch.randn(2, 3, 9, 9, requires_grad=True)
    actual, expected = _gradients(lambda x: conv(x).square().sum(), x, [x, conv.weight])
    torch.testing.assert_close(actual, expected)
    _assert_training_graphs_on_device()
    assert "aten.convolution_backward.default" in _island_ops()


@pytest.mark.parametrize(
    "pool",
    [
        {"kernel_size": 2},
        {"kernel_size": 3, "stride": 2, "padding": 1},
        {"kernel_size": 3, "stride": 2, "padding": 1, "count_include_pad": False},
        {"kernel_size": 3, "stride": 2, "padding": 1, "ceil_mode": True},
        {"kernel_size": 3, "stride": 2, "padding": 1, "ceil_mode": True, "count_include_pad": False},
        {"kernel_size": 2, "stride": 3, "ceil_mode": True},
        {"kernel_size": (3, 2), "stride": (1, 2), "padding": (1, 0), "divisor_override": 4},
    ],
    ids=["plain", "padded", "exclude-pad", "ceil", "ceil-exclude-pad", "stride-gt-kernel", "divisor-override"],
)
@pytest.mark.parametrize("shape", [(2, 3, 9, 10), (3, 7, 8)], ids=["batched", "unbatched"])
def test_avg_pool2d_backward_lowers(pool, shape):
    """torch-mlir rejected the backward for its ``torch.constant.int``s. Only
    the backward graph is asserted on: torch-mlir 20261001 also rejected the
    ceil_mode and divisor_override forwards, which is not this test's matter."""
    torch.manual_seed(0)
    x = torch.randn(*shape, requires_grad=True)
    actual, expected = _gradients(lambda x: (F.avg_pool2d(x, **pool).sin() ** 2).sum(), x, [x])
    torch.testing.assert_close(actual, expected)
    assert "aten.avg_pool2d_backward.default" not in _fallback_ops()
    backward = [g for g in report.current().graphs if g.kind == "backward"]
    assert backward and backward[0].islands and backward[0].fallbacks == []


def test_avg_pool3d_backward_lowers():
    torch.manual_seed(0)
    x = torch.randn(2, 3, 6, 7, 8, requires_grad=True)
    actual, expected = _gradients(
        lambda x: F.avg_pool3d(x, 3, 2, 1, count_include_pad=False).sin().square().sum(), x, [x]
    )
    torch.testing.assert_close(actual, expected)
    _assert_training_graphs_on_device()


@pytest.mark.parametrize("groups", [8, 1], ids=["depthwise", "dense"])
def test_convolution_and_pool_backward_lower_with_dynamic_shapes(groups):
    """Pad amounts stay constants (an exact one would be symbolic, and
    torch-mlir's dynamic lowering rejects a symbolic ``constant_pad_nd``).
    Dense ones go by taps too: torch-mlir's own dynamic backward failed to
    legalize its transposed convolution."""
    torch.manual_seed(0)
    conv = nn.Conv2d(8, 8, 3, 2, 1, groups=groups)

    def loss(x):
        return (conv(x).tanh() ** 2).sum() + F.avg_pool2d(x, 3, 2, 1, count_include_pad=False).square().sum()

    compiled = torch.compile(loss, backend="tpu", dynamic=True, options=OPTIONS)
    for size in (10, 13):
        x = torch.randn(2, 8, size, size + 1, requires_grad=True)
        expected = torch.autograd.grad(loss(x), [x, conv.weight])
        actual = torch.autograd.grad(compiled(x), [x, conv.weight])
        torch.testing.assert_close(actual, expected)
    assert {g.kind for g in report.current().graphs} == {"forward", "backward"}
    assert all(g.islands for g in report.current().graphs)
    assert _fallback_ops() == []


class SqueezeExcite(nn.Module):
    def __init__(self, channels: int) -> None:
        super().__init__()
        self.reduce, self.expand = nn.Conv2d(channels, channels // 4, 1), nn.Conv2d(channels // 4, channels, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * F.hardsigmoid(self.expand(F.relu(self.reduce(F.adaptive_avg_pool2d(x, 1)))))


class InvertedResidual(nn.Module):
    """MobileNetV3's block: expand 1x1, depthwise kxk, squeeze-excite, project 1x1."""

    def __init__(self, cin: int, hidden: int, cout: int, stride: int, kernel: int = 3) -> None:
        super().__init__()
        self.expand = nn.Sequential(nn.Conv2d(cin, hidden, 1, bias=False), nn.BatchNorm2d(hidden), nn.Hardswish())
        self.depthwise = nn.Sequential(
            nn.Conv2d(hidden, hidden, kernel, stride, kernel // 2, groups=hidden, bias=False),
            nn.BatchNorm2d(hidden),
            nn.Hardswish(),
        )
        self.excite = SqueezeExcite(hidden)
        self.project = nn.Sequential(nn.Conv2d(hidden, cout, 1, bias=False), nn.BatchNorm2d(cout))
        self.residual = stride == 1 and cin == cout

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.project(self.excite(self.depthwise(self.expand(x))))
        return x + y if self.residual else y


class TinyMobileNet(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, 16, 3, 2, 1, bias=False), nn.BatchNorm2d(16), nn.Hardswish())
        self.blocks = nn.Sequential(
            InvertedResidual(16, 32, 16, 1), InvertedResidual(16, 48, 24, 2, 5), InvertedResidual(24, 72, 24, 1)
        )
        self.pool = nn.AvgPool2d(2)
        self.head = nn.Linear(24, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.pool(self.blocks(self.stem(x))).mean((2, 3)))


def test_mobilenet_style_training_step_runs_fully_lowered():
    """Forward and backward of conv-bn-hardswish, depthwise 3x3/5x5,
    squeeze-excite and average pooling: no node runs eagerly, and every
    parameter's gradient (and BatchNorm's running statistics) match eager's."""
    torch.manual_seed(0)
    model = TinyMobileNet().train()
    reference = copy.deepcopy(model)
    x, labels = torch.randn(4, 3, 32, 32), torch.randint(0, 10, (4,))
    expected = F.cross_entropy(reference(x), labels)
    expected.backward()
    actual = F.cross_entropy(torch.compile(model, backend="tpu", options=OPTIONS)(x), labels)
    actual.backward()
    torch.testing.assert_close(actual, expected)
    for (name, param), ref in zip(model.named_parameters(), reference.parameters()):
        torch.testing.assert_close(param.grad, ref.grad, msg=lambda m: f"{name}: {m}")
    for buffer, ref in zip(model.buffers(), reference.buffers()):
        torch.testing.assert_close(buffer, ref)
    _assert_training_graphs_on_device()
