"""An explicit symmetric zero pad before a convolution becomes its padding
(passes/pad_into_convolution.py). The same products are summed either way,
but the convolution kernel chosen for another padding may sum them in
another order: 27 products of unit-scale values, hence 1e-5."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch.fx.experimental.proxy_tensor import make_fx

import tpu_inductor.report as report
from tpu_inductor.passes.pad_into_convolution import pad_into_convolution

aten = torch.ops.aten


def _padded_conv(pads, value=0.0, padding=0):
    def fn(x, w):
        return F.conv2d(F.pad(x, pads, value=value), w, padding=padding)

    return fn


@pytest.mark.parametrize(
    "pads, value, padding, folds",
    [
        ((1, 1, 1, 1), 0.0, 0, True),
        ((2, 2, 1, 1), 0.0, 1, True),  # adds to the convolution's own padding
        ((0, 1, 0, 1), 0.0, 0, False),  # TensorFlow's stride-2 "SAME": one side only
        ((1, 1, 1, 1), 1.0, 0, False),  # not zeros
    ],
    ids=["symmetric", "adds", "one-sided", "ones"],
)
def test_symmetric_zero_pads_fold(pads, value, padding, folds):
    generator = torch.Generator().manual_seed(0)
    x, w = torch.randn(2, 3, 7, 7, generator=generator), torch.randn(4, 3, 3, 3, generator=generator)
    fn = _padded_conv(pads, value, padding)
    gm = pad_into_convolution(make_fx(fn, tracing_mode="fake")(x, w))
    assert (not gm.graph.find_nodes(op="call_function", target=aten.constant_pad_nd.default)) == folds
    torch.testing.assert_close(gm(x, w), fn(x, w), rtol=1e-5, atol=1e-5)


def test_compiled_model_pads_inside_the_convolution():
    torch.manual_seed(0)
    conv = torch.nn.Conv2d(3, 4, 3).eval()
    model = torch.nn.Sequential(torch.nn.ZeroPad2d(1), conv, torch.nn.ReLU6()).eval()
    x = torch.randn(2, 3, 9, 9)
    with torch.no_grad():
        torch.testing.assert_close(torch.compile(model, backend="tpu", options={"cache": False})(x), model(x))
    ops = {op for graph in report.current().graphs for island in graph.islands for op in island.ops}
    assert "aten.convolution.default" in ops or report.current().graphs[0].eager_kernels
    assert "aten.constant_pad_nd.default" not in ops
