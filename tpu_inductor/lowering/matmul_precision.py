"""The precision torch asks of float32 matmuls and convolutions, written on the module.

Why: a StableHLO ``dot_general`` or ``convolution`` without a
``precision_config`` is DEFAULT precision, which XLA reads per platform:
exact float32 on XLA:CPU, TensorFloat-32 on an NVIDIA GPU, one bfloat16 pass
on a TPU. torch's float32 is exact unless the user opts out
(``torch.set_float32_matmul_precision``, ``torch.backends.cudnn.allow_tf32``),
so on the H200 the model suite's islands came out up to 5e-4 from eager's
(TF32's 10-bit mantissa), where Inductor's were within 1e-6. Each float32
dot and convolution gets the precision torch's setting for it stands for:

- matmuls, ``torch.get_float32_matmul_precision()``: ``highest`` (torch's
  default) -> HIGHEST, ``high`` (TF32 or three bfloat16 passes) -> HIGH,
  ``medium`` (bfloat16) -> DEFAULT;
- convolutions, ``torch.backends.cudnn.allow_tf32`` (True by default in
  torch, as cuDNN's TF32): True -> HIGH, False -> HIGHEST.

Only for PJRT plugins (CUDA, TPU): XLA:CPU computes float32 exactly at every
precision, and its modules stay as they are. The precisions are part of
the executable's cache key (runtime/executable.py), and are written on the
module only when XLA compiles it.
"""

from __future__ import annotations

from typing import Any, Union

import torch

from tpu_inductor.lowering.mlir_ops import ops_where
from tpu_inductor.lowering.pipeline_worker import bytecode_of

_MATMUL = {"highest": "HIGHEST", "high": "HIGH", "medium": "DEFAULT"}
_OPS = ("stablehlo.dot_general", "stablehlo.dot", "stablehlo.convolution")


def torch_precisions() -> dict[str, str]:
    """StableHLO precision per op kind, from torch's settings now."""
    matmul = _MATMUL.get(torch.get_float32_matmul_precision(), "HIGHEST")
    convolution = "HIGH" if torch.backends.cudnn.allow_tf32 else "HIGHEST"
    return {"stablehlo.dot_general": matmul, "stablehlo.dot": matmul, "stablehlo.convolution": convolution}


def with_torch_precision(module: Union[bytes, str], precisions: dict[str, str]) -> Union[bytes, str]:
    """``module`` (StableHLO bytecode or text) with ``precisions`` on every float32
    dot and convolution that states none."""
    from jaxlib.mlir import ir

    from tpu_inductor.runtime.jaxlib_api import mlir_context

    def float32_without_precision(op: Any) -> bool:
        return op.name in _OPS and "precision_config" not in op.attributes and all(
            str(ir.ShapedType(operand.type).element_type) == "f32" for operand in op.operands
        )

    with mlir_context(), ir.Location.unknown():
        parsed = ir.Module.parse(module)
        found = ops_where(parsed, ir, float32_without_precision)
        for op in found:
            precision = ir.Attribute.parse(f"#stablehlo<precision {precisions[op.name]}>")
            op.attributes["precision_config"] = ir.ArrayAttr.get([precision] * 2)
        return bytecode_of(parsed) if found else module
