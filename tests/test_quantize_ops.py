"""PT2E quantize/dequantize ops run on the device with eager's exact values.

Quantized values are integers and dequantized ones a product of an integer
and a scale, both computed by PyTorch's own reference arithmetic: exact
equality is the bar.
"""

from __future__ import annotations

import torch

import tpu_inductor.report as report

from torch.ao.quantization.fx import _decomposed  # noqa: F401  (registers quantized_decomposed)

q = torch.ops.quantized_decomposed


def per_tensor(x):
    qx = q.quantize_per_tensor.default(x, 0.05, 3, -128, 127, torch.int8)
    return qx, q.dequantize_per_tensor.default(qx, 0.05, 3, -128, 127, torch.int8) * 2


def per_channel(x, scales, zero_points):
    qx = q.quantize_per_channel.default(x, scales, zero_points, 1, 0, 255, torch.uint8)
    return qx, q.dequantize_per_channel.default(qx, scales, zero_points, 1, 0, 255, torch.uint8)


def _check(fn, *inputs):
    for out, expected in zip(torch.compile(fn, backend="tpu", options={"cache": False})(*inputs), fn(*inputs)):
        torch.testing.assert_close(out, expected, rtol=0, atol=0)
    assert report.current().fallbacks() == [] and report.current().islands()


def test_per_tensor_quantize_and_dequantize_run_on_the_device():
    _check(per_tensor, torch.randn(4, 6) * 4)  # some values clamp at both ends


def test_per_channel_quantize_and_dequantize_run_on_the_device():
    _check(per_channel, torch.randn(4, 6) * 4, torch.rand(6) * 0.1 + 0.01, torch.randint(0, 9, (6,)))
