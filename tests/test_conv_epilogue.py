"""BatchNorm's affine, a residual add and ReLU fold into oneDNN's fused
convolution (passes/conv_epilogue.py).

Folding the BatchNorm scale into the weight reassociates one multiply per
product (``conv(x, w) * s`` -> ``conv(x, w * s)``), so each result may move
by about float32's epsilon times the sum of its products' magnitudes: 72
products (3x3x8) of values up to ~10 after the first block give ~1e-4 where
the output cancels to near zero. Hence atol 1e-4, rtol 1e-5.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch.fx.experimental.proxy_tensor import make_fx

import tpu_inductor.report as report
from tpu_inductor.passes.channels_last import run_channels_last
from tpu_inductor.passes.conv_epilogue import (
    available,
    convolution_pointwise_channels_last,
    fuse_convolution_epilogues,
)

aten = torch.ops.aten
TOLERANCE = {"rtol": 1e-5, "atol": 1e-4}

pytestmark = pytest.mark.skipif(not available(), reason="this PyTorch build has no oneDNN fused convolution")


def block(x, w1, w2, scale, shift, bias):
    y = F.relu(F.conv2d(x, w1, padding=1) * scale + shift)  # eval BatchNorm, then ReLU
    return F.relu(F.conv2d(y, w2, bias, padding=1) * scale + shift + y)  # ... and a residual add


def _inputs(dtype=torch.float32):
    generator = torch.Generator().manual_seed(0)
    return tuple(
        t.to(dtype)
        for t in (
            torch.randn(2, 8, 6, 6, generator=generator),
            torch.randn(8, 8, 3, 3, generator=generator),
            torch.randn(8, 8, 3, 3, generator=generator),
            torch.rand(8, 1, 1, generator=generator) + 0.5,
            torch.randn(8, 1, 1, generator=generator),
            torch.randn(8, generator=generator),
        )
    )


def _fused(fn, inputs):
    gm = make_fx(fn, tracing_mode="fake")(*inputs)
    convolutions = list(gm.graph.find_nodes(op="call_function", target=aten.convolution.default))
    chosen = fuse_convolution_epilogues(gm, run_channels_last(gm, {node: "faster" for node in convolutions}))
    return gm, chosen


def test_affine_residual_and_relu_fold_into_the_convolutions():
    inputs = _inputs()
    gm, chosen = _fused(block, inputs)

    fused = list(gm.graph.find_nodes(op="call_function", target=convolution_pointwise_channels_last))
    assert len(fused) == 2 and set(chosen) == set(fused)
    assert [n.args[8] for n in fused] == ["relu", "relu"]
    assert fused[0].args[3] is None and fused[1].args[3] is not None  # the second adds the residual
    assert "per-channel affine + add + relu" in chosen[fused[1]]
    # Nothing of the epilogues is left on the activations (NCHW or NHWC).
    for node in gm.graph.nodes:
        if node.target in (aten.relu.default, aten.add.Tensor, aten.mul.Tensor):
            assert tuple(node.meta["val"].shape) not in {(2, 8, 6, 6), (2, 6, 6, 8)}, node.format_node()
    torch.testing.assert_close(gm(*inputs), block(*inputs), **TOLERANCE)


def test_relu6_folds_as_hardtanh_with_and_without_a_residual():
    """MobileNets: conv + BatchNorm + ReLU6 (``hardtanh(0, 6)``) folds. After
    a residual add it stays unfused (oneDNN's binary variant takes ReLU
    alone). The inputs are scaled so that many outputs clamp at 6."""

    def block6(x, w1, w2, scale, shift, bias):
        y = F.relu6(F.conv2d(x, w1, padding=1) * scale + shift)
        return F.hardtanh(F.conv2d(y, w2, bias, padding=1) * scale + shift + y, -2.0, 6.0)

    x, w1, w2, scale, shift, bias = _inputs()
    inputs = (x * 3, w1, w2, scale, shift, bias)
    gm, _ = _fused(block6, inputs)
    fused = list(gm.graph.find_nodes(op="call_function", target=convolution_pointwise_channels_last))
    assert [(n.args[8], n.args[9]) for n in fused] == [("hardtanh", [0.0, 6.0]), ("none", [])]
    (unfused,) = gm.graph.find_nodes(op="call_function", target=aten.hardtanh.default)
    assert unfused.args[1:] == (-2.0, 6.0)
    expected = block6(*inputs)
    assert (expected == 6).float().mean() > 0.1
    torch.testing.assert_close(gm(*inputs), expected, **TOLERANCE)


def test_a_value_read_elsewhere_stays_unfused():
    """The convolution's own output is also returned: folding the scale into
    the weight would change it."""

    def conv_also_returned(x, w, scale, shift):
        y = F.conv2d(x, w, padding=1)
        return F.relu(y * scale + shift), y

    x, w1, _, scale, shift, _ = _inputs()
    gm, chosen = _fused(conv_also_returned, (x, w1, scale, shift))
    assert not list(gm.graph.find_nodes(op="call_function", target=convolution_pointwise_channels_last))
    assert all("fused" not in why for why in chosen.values())
    for actual, expected in zip(gm(x, w1, scale, shift), conv_also_returned(x, w1, scale, shift)):
        torch.testing.assert_close(actual, expected)


def test_bfloat16_is_not_folded():
    """A folded bfloat16 weight would be rounded once more than eager's."""
    gm, _ = _fused(block, _inputs(torch.bfloat16))
    assert not list(gm.graph.find_nodes(op="call_function", target=convolution_pointwise_channels_last))


# --------------------------------------------------------------------------- through torch.compile


class BasicBlock(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv1, self.conv2 = (torch.nn.Conv2d(8, 8, 3, padding=1, bias=False) for _ in range(2))
        self.bn1, self.bn2 = torch.nn.BatchNorm2d(8), torch.nn.BatchNorm2d(8)

    def forward(self, x):
        return F.relu(self.bn2(self.conv2(F.relu(self.bn1(self.conv1(x))))) + x)


def _block() -> BasicBlock:
    torch.manual_seed(0)
    model = BasicBlock().eval()
    with torch.no_grad():
        for norm in (model.bn1, model.bn2):
            norm.running_mean.uniform_(-0.5, 0.5)
            norm.running_var.uniform_(0.5, 2.0)
            norm.weight.uniform_(0.5, 1.5)
    return model


def test_compiled_block_runs_fused_convolutions(eager_convolutions, tmp_path):
    model = _block()
    x = torch.randn(2, 8, 6, 6)
    compiled = torch.compile(model, backend="tpu", options={"cache_dir": str(tmp_path)})
    with torch.no_grad():
        torch.testing.assert_close(compiled(x), model(x), **TOLERANCE)
    (graph,) = report.current().graphs
    convolutions = [k for k in graph.eager_kernels if "convolution" in k.op]
    assert [k.op for k in convolutions] == ["convolution_pointwise_channels_last"] * 2
    assert "fused with per-channel affine + add + relu" in convolutions[1].reason


def test_training_keeps_batch_norm_unfolded(eager_convolutions, tmp_path):
    """In training BatchNorm normalises with the batch's statistics, which read
    the convolution's output: nothing folds, and gradients are eager's."""
    model, compiled_model = _block().train(), _block().train()
    x = torch.randn(2, 8, 6, 6)
    model(x).square().mean().backward()
    compiled = torch.compile(compiled_model, backend="tpu", options={"cache_dir": str(tmp_path)})
    compiled(x).square().mean().backward()
    for (name, p), q in zip(model.named_parameters(), compiled_model.parameters()):
        torch.testing.assert_close(q.grad, p.grad, msg=name, **TOLERANCE)
    kernels = [k for g in report.current().graphs for k in g.eager_kernels]
    assert kernels and all("affine" not in k.reason for k in kernels)


def test_frozen_parameters_fold_batch_norm_once(eager_convolutions, tmp_path):
    """With ``freeze_parameters`` the folded weights are computed once and
    recomputed after BatchNorm's statistics change."""
    model = _block()
    x = torch.randn(2, 8, 6, 6)
    compiled = torch.compile(
        model, backend="tpu", options={"cache_dir": str(tmp_path), "freeze_parameters": True}
    )
    with torch.no_grad():
        for _ in range(3):
            torch.testing.assert_close(compiled(x), model(x), **TOLERANCE)
        model.bn2.running_var.mul_(2)
        torch.testing.assert_close(compiled(x), model(x), **TOLERANCE)
    (graph,) = report.current().graphs
    (kept,) = [i for i in graph.islands if i.results_kept]
    assert kept.executions == 2
    assert graph.islands == [kept]  # nothing else is left on the device
