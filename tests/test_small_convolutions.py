"""Convolutions with few output positions run as one matmul on the CPU client
(passes/small_convolutions_as_matmuls.py).

The rewritten graph runs the same products summed in another order, so values
are compared at torch.testing's float32 defaults.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch.fx.experimental.proxy_tensor import make_fx

import tpu_inductor.report as report
from tpu_inductor.passes.small_convolutions_as_matmuls import small_convolutions_as_matmuls

aten = torch.ops.aten


def _rewritten(fn, *args):
    gm = make_fx(fn, tracing_mode="fake")(*args)
    return small_convolutions_as_matmuls(gm)


def _convolutions(gm) -> int:
    return len(gm.graph.find_nodes(op="call_function", target=aten.convolution.default))


@pytest.mark.parametrize(
    "input_shape, weight_shape, kwargs",
    [
        ((1, 16, 4, 4), (32, 16, 3, 3), {"padding": 1}),
        ((2, 8, 5, 5), (12, 8, 3, 3), {"stride": 2, "padding": 1}),
        ((1, 8, 5, 5), (4, 8, 3, 3), {"dilation": 2, "padding": 2}),
        ((1, 8, 4, 6), (4, 8, 1, 3), {"padding": (0, 1)}),  # rectangular kernel
        ((3, 8, 2, 2), (16, 8, 1, 1), {}),
    ],
)
@pytest.mark.parametrize("with_bias", [False, True])
def test_rewritten_convolution_matches_eager(input_shape, weight_shape, kwargs, with_bias):
    torch.manual_seed(0)
    args = [torch.randn(input_shape), torch.randn(weight_shape)]
    if with_bias:
        args.append(torch.randn(weight_shape[0]))
    gm = _rewritten(lambda *a: F.conv2d(*a, **kwargs), *args)
    assert _convolutions(gm) == 0
    torch.testing.assert_close(gm(*args), F.conv2d(*args, **kwargs))


def test_one_value_for_both_spatial_dims():
    """``padding="valid"`` reaches aten.convolution as ``[0]`` (SigLIP's patch embedding)."""
    args = torch.randn(1, 3, 8, 8), torch.randn(16, 3, 4, 4)
    gm = _rewritten(lambda x, w: aten.convolution.default(x, w, None, [4], [0], [1], False, [0], 1), *args)
    assert _convolutions(gm) == 0
    torch.testing.assert_close(gm(*args), F.conv2d(*args, stride=4))


@pytest.mark.parametrize(
    "input_shape, weight_shape, kwargs",
    [
        ((2, 3, 64, 64), (16, 3, 32, 32), {"stride": 32}),  # CLIP's patch embedding: 1,024 taps
        ((1, 3, 20, 18), (8, 3, 8, 8), {"stride": 8}),  # rows and columns past the last window
        ((1, 3, 14, 14), (8, 3, 8, 8), {"stride": 8, "padding": 1}),
        ((1, 4, 6, 9), (8, 4, 2, 3), {"stride": (2, 3)}),  # rectangular patches
    ],
)
@pytest.mark.parametrize("with_bias", [False, True])
def test_patch_embeddings_take_their_patches_as_one_view(input_shape, weight_shape, kwargs, with_bias):
    """Windows that do not overlap (stride = kernel) need no slice per tap:
    CLIP's 1,024 of them made one island that XLA took 12.6 s to compile.
    Weights scaled by 1/sqrt(fan-in), as nn.Conv2d initialises them, keep
    the 3,072-term sums of order 1, where the default float32 tolerances
    cover a different summation order."""
    torch.manual_seed(0)
    fan_in = weight_shape[1] * weight_shape[2] * weight_shape[3]
    args = [torch.randn(input_shape), torch.randn(weight_shape) / fan_in**0.5]
    if with_bias:
        args.append(torch.randn(weight_shape[0]))
    gm = _rewritten(lambda *a: F.conv2d(*a, **kwargs), *args)
    assert _convolutions(gm) == 0
    assert len(gm.graph.find_nodes(op="call_function", target=aten.slice.Tensor)) <= 2
    torch.testing.assert_close(gm(*args), F.conv2d(*args, **kwargs))


@pytest.mark.parametrize(
    "input_shape, weight_shape, kwargs",
    [
        ((1, 8, 16, 16), (8, 8, 3, 3), {"padding": 1}),  # 256 output positions: XLA's convolution is fine
        ((1, 8, 4, 4), (8, 4, 3, 3), {"padding": 1, "groups": 2}),  # grouped
        ((1, 3, 20, 20), (8, 3, 9, 9), {"stride": 4}),  # 81 overlapping taps: more than MAX_TAPS
    ],
)
def test_other_convolutions_are_left_alone(input_shape, weight_shape, kwargs):
    gm = _rewritten(lambda x, w: F.conv2d(x, w, **kwargs), torch.randn(input_shape), torch.randn(weight_shape))
    assert _convolutions(gm) == 1


def test_compiled_network_on_a_small_image_matches_eager():
    torch.manual_seed(0)
    model = torch.nn.Sequential(
        torch.nn.Conv2d(3, 32, 3, stride=2, padding=1),
        torch.nn.BatchNorm2d(32),
        torch.nn.ReLU(),
        torch.nn.Conv2d(32, 64, 3, stride=2, padding=1),
        torch.nn.ReLU(),
        torch.nn.AdaptiveAvgPool2d(1),
        torch.nn.Flatten(),
        torch.nn.Linear(64, 10),
    ).eval()
    x = torch.randn(2, 3, 8, 8)
    compiled = torch.compile(model, backend="tpu", options={"cache": False})
    with torch.no_grad():
        torch.testing.assert_close(compiled(x), model(x))
    ops = [op for graph in report.current().graphs for island in graph.islands for op in island.ops]
    assert "aten.mm.default" in ops and "aten.convolution.default" not in ops


def test_training_gradients_match_eager():
    """The forward's convolution becomes a matmul; the backward keeps
    PyTorch's convolution_backward, which must still see the same values."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Conv2d(8, 16, 3, padding=1), torch.nn.ReLU(), torch.nn.Conv2d(16, 4, 3, padding=1))
    compiled_model = torch.nn.Sequential(torch.nn.Conv2d(8, 16, 3, padding=1), torch.nn.ReLU(), torch.nn.Conv2d(16, 4, 3, padding=1))
    compiled_model.load_state_dict(model.state_dict())
    x = torch.randn(2, 8, 4, 4)
    model(x).square().mean().backward()
    compiled = torch.compile(compiled_model, backend="tpu", options={"cache": False})
    compiled(x).square().mean().backward()
    for p, q in zip(model.parameters(), compiled_model.parameters()):
        torch.testing.assert_close(q.grad, p.grad)
