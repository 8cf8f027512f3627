"""torch's float32 matmul and convolution precision, written on modules for PJRT plugins
(lowering/matmul_precision.py): XLA's DEFAULT is TF32 on a GPU and one bfloat16
pass on a TPU, torch's default is exact float32."""

from __future__ import annotations

import pytest
import torch
from torch.fx.experimental.proxy_tensor import make_fx

from tpu_inductor.lowering.matmul_precision import torch_precisions, with_torch_precision
from tpu_inductor.lowering.stablehlo import lower_to_stablehlo


def _module_text(fn, *args) -> str:
    from jaxlib.mlir import ir

    from tpu_inductor.runtime.jaxlib_api import mlir_context

    module = with_torch_precision(lower_to_stablehlo(make_fx(fn)(*args)).module, torch_precisions())
    with mlir_context():
        return str(ir.Module.parse(module))


def _dot_and_convolution(a, b, w):
    return torch.mm(a, b), torch.nn.functional.conv2d(a[None, None], w)


FLOAT32 = (torch.randn(4, 4), torch.randn(4, 4), torch.randn(2, 1, 3, 3))


@pytest.fixture
def restore_matmul_precision():
    matmul = torch.get_float32_matmul_precision()
    yield
    torch.set_float32_matmul_precision(matmul)


def _convolution_tf32(allowed: bool):
    # flags(), not assignment: PyTorch's OpInfo tests disable setting the cudnn flags globally.
    cudnn = torch.backends.cudnn
    return cudnn.flags(enabled=cudnn.enabled, benchmark=cudnn.benchmark, deterministic=cudnn.deterministic,
                       allow_tf32=allowed)


@pytest.mark.parametrize("matmul, convolution_tf32, dot, convolution", [
    ("highest", True, "HIGHEST", "HIGH"),  # torch's defaults: exact matmuls, cuDNN's TF32 convolutions
    ("medium", False, "DEFAULT", "HIGHEST"),
])
def test_the_torch_settings_are_followed(restore_matmul_precision, matmul, convolution_tf32, dot, convolution):
    torch.set_float32_matmul_precision(matmul)
    with _convolution_tf32(convolution_tf32):
        text = _module_text(_dot_and_convolution, *FLOAT32)
    assert f"precision = [{dot}, {dot}]" in text
    assert f"precision_config = [#stablehlo<precision {convolution}>, #stablehlo<precision {convolution}>]" in text


def test_bfloat16_matmuls_are_left_alone():
    a = torch.randn(4, 4, dtype=torch.bfloat16)
    assert "precision" not in _module_text(torch.mm, a, a)
