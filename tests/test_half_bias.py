"""A bfloat16/float16 matmul or convolution adds its bias before its one
rounding, as eager does (lowering/half_floats_in_float32.py's BIAS_ARGUMENT,
passes/convolution_taps.py's ``product``), and a PJRT plugin gets the half
operands with a float32 result (lowering/narrow_dot_operands.py).

The verdict: the result may be at most one ulp (of its type, at its
magnitude) from the same op computed in float32 and rounded once: one ulp,
not zero, since float32 sums in another order can land on the other side of
a rounding boundary. Rounding the product first, as before, is off by up to
half an ulp of the product: 10.6 ulps of the result on OpInfo's float16
``linear``, where the bias cancelled the product. The biases here cancel
nine tenths of the first output row's products on purpose, which puts the
product's rounding at up to five ulps of the result. (Eager's own float16
``addmm`` on this CPU rounds twice: 5.4 ulps on these inputs.)
"""

from __future__ import annotations

import re

import pytest
import torch
from torch.fx.experimental.proxy_tensor import make_fx

import tpu_inductor.report as report
from tpu_inductor.lowering.stablehlo import graph_specs, lower_to_stablehlo
from tpu_inductor.reporting.files import stablehlo_text
from tpu_inductor.runtime import get_platform
from tpu_inductor.runtime.executable import DeviceExecutable, compile_stablehlo

F = torch.nn.functional
HALF = [torch.bfloat16, torch.float16]
MANTISSA_BITS = {torch.bfloat16: 7, torch.float16: 10}


def _linear(x, w, b):
    return F.linear(x, w, b)


def _addmm(x, w, b):
    return torch.addmm(b, x, w.t())


def _convolution(stride, padding, groups=1):
    return lambda x, w, b: F.conv2d(x, w, b, stride=stride, padding=padding, groups=groups)


# name: (fn, input shape, weight shape); each convolution is one the CPU rewrites take, or XLA's own.
CASES = {
    "linear": (_linear, (64, 96), (48, 96)),
    "addmm": (_addmm, (64, 96), (48, 96)),
    "conv2d (XLA's convolution)": (_convolution(1, 1), (2, 8, 12, 12), (16, 8, 3, 3)),
    "conv2d few positions (as a matmul)": (_convolution(2, 2), (1, 8, 4, 4), (16, 8, 3, 3)),
    "conv2d 1x1 (as a batched matmul)": (_convolution(1, 0), (2, 8, 6, 6), (16, 8, 1, 1)),
    "conv2d depthwise (as taps)": (_convolution(1, 1, groups=8), (2, 8, 12, 12), (8, 1, 3, 3)),
}


def _inputs(fn, x_shape, w_shape, dtype):
    generator = torch.Generator().manual_seed(0)
    x = torch.randn(x_shape, generator=generator).to(dtype)
    w = torch.randn(w_shape, generator=generator).to(dtype)
    product = fn(x.float(), w.float(), torch.zeros(w_shape[0]))
    # Each output channel's bias cancels nine tenths of its first output's product.
    first = product.reshape(product.shape[0], product.shape[1], -1)[0, :, 0] if product.dim() == 4 else product[0]
    b = (-first * 0.9).to(dtype)
    return x, w, b


def _ulps(got: torch.Tensor, expected: torch.Tensor) -> float:
    """The largest distance of ``got`` from ``expected`` in ulps of their type at ``expected``'s magnitude."""
    bits = MANTISSA_BITS[got.dtype]
    smallest_normal = torch.finfo(got.dtype).tiny
    ulp = torch.exp2(torch.floor(torch.log2(expected.float().abs().clamp(min=smallest_normal))) - bits)
    return ((got.float() - expected.float()) / ulp).abs().max().item()


@pytest.mark.parametrize("dtype", HALF, ids=str)
@pytest.mark.parametrize("name", sorted(CASES))
def test_the_bias_is_added_before_the_one_rounding(name, dtype):
    fn, x_shape, w_shape = CASES[name]
    x, w, b = _inputs(fn, x_shape, w_shape, dtype)
    rounded_once = fn(x.float(), w.float(), b.float()).to(dtype)
    # Kernel choice off: it may time a convolution faster on oneDNN and run it there.
    options = {"cache": False, "strict": True, "eager_kernels": False}
    got = torch.compile(fn, backend="tpu", options=options)(x, w, b)
    assert got.dtype == dtype
    assert report.current().islands() and report.current().fallbacks() == []
    assert _ulps(got, rounded_once) <= 1


def _lowered_for_a_plugin(fn, *args):
    gm = make_fx(fn, tracing_mode="fake")(*args)
    return lower_to_stablehlo(gm, for_cpu=False, isolate=False), gm


@pytest.mark.parametrize("name", ["linear", "conv2d (XLA's convolution)"])
def test_a_plugin_gets_half_operands_and_a_float32_result(name):
    fn, x_shape, w_shape = CASES[name]
    x, w, b = _inputs(fn, x_shape, w_shape, torch.bfloat16)
    lowered, gm = _lowered_for_a_plugin(fn, x, w, b)
    text = stablehlo_text(lowered.module)
    (product,) = re.findall(r"stablehlo\.(?:dot_general|convolution).*", text)
    operand_types, result_type = re.search(r": \((.*)\) -> (tensor<[^>]*>)", product).groups()
    assert operand_types.count("bf16") == 2 and result_type.endswith("xf32>")
    # The module runs (on the CPU client here) with the one rounding kept.
    platform = get_platform("cpu")
    input_specs, output_specs = graph_specs(gm)
    loaded, _ = compile_stablehlo(lowered.module, platform, None, input_specs=input_specs)
    (got,) = DeviceExecutable(loaded, platform, output_specs, "plugin_module", input_specs)(x, w, b)
    assert _ulps(got, fn(x.float(), w.float(), b.float()).to(torch.bfloat16)) <= 1


def test_float32_and_mixed_products_are_left_alone():
    x, w, b = torch.randn(8, 16), torch.randn(4, 16), torch.randn(4)
    text = stablehlo_text(_lowered_for_a_plugin(_linear, x, w, b)[0].module)
    assert "bf16" not in text and "f16" not in text
    # One operand upcast from bfloat16, the other float32 from the start: nothing to narrow.
    text = stablehlo_text(_lowered_for_a_plugin(lambda x, w: x @ w.float().t(), x, w.to(torch.bfloat16))[0].module)
    (product,) = re.findall(r"stablehlo\.dot_general.*", text)
    assert "bf16" not in product
