"""Python numbers in float32 and half-precision graphs as constants of that type, not float64.

Why: torch-mlir imports a Python float (``addcdiv``'s ``value``, a clamp
bound, ``x * 0.5``) as a float64 constant converted to the tensor's type.
XLA:CPU folds the pair, but a TPU has no float64, so every such module
would carry float64 onto a TPU (lowering/tpu_readiness.py finds it). Each
``convert`` of a float64 splat constant (through float64 converts, reshapes
and broadcasts) to float32, float16, bfloat16, an integer or bool becomes a
constant of that type (integers toward zero, as ``convert``, when in range), rounded as ``convert`` rounds (to nearest even,
once: numpy's ``astype`` from float64 for float32 and float16, exact
arithmetic for bfloat16, which numpy lacks and which rounding through
float32 could round twice).

Before: ``%c = arith.constant dense<5.000000e-01> : tensor<1xf64>;
%v = stablehlo.convert %c : (tensor<1xf64>) -> tensor<1xf32>``
After:  ``%v = stablehlo.constant dense<0x3F000000> : tensor<1xf32>``
"""

from __future__ import annotations

import math
from fractions import Fraction
from typing import Any, Callable, Optional

from tpu_inductor.lowering.mlir_ops import erase_unused, ops_where

_CONSTANTS = ("arith.constant", "stablehlo.constant")


def _numpy_bits(float_type: str, bits_type: str) -> Callable[[float], Optional[str]]:
    """A float64 -> ``float_type`` convert's result as hexadecimal bits (numpy rounds it once, to nearest even)."""

    def bits(number: float) -> Optional[str]:
        import numpy as np

        digits = np.dtype(bits_type).itemsize * 2
        return f"0x{int(np.array(number, dtype=np.float64).astype(float_type).view(bits_type)):0{digits}X}"

    return bits


def _bfloat16_bits(number: float) -> Optional[str]:
    """``number`` rounded to the nearest bfloat16 (ties to even); None for a
    subnormal or overflowing result (the convert is then left as it is)."""
    if number == 0:
        return "0x8000" if math.copysign(1.0, number) < 0 else "0x0000"
    if math.isnan(number):
        return "0x7FC0"
    if math.isinf(number):
        return "0xFF80" if number < 0 else "0x7F80"
    exponent = math.frexp(abs(number))[1]  # |number| = m * 2**exponent, 0.5 <= m < 1
    significand = round(Fraction(abs(number)) * 2 ** (8 - exponent))  # 8 bits, half to even
    if significand == 256:
        significand, exponent = 128, exponent + 1
    biased = exponent - 1 + 127
    if not 1 <= biased <= 254:
        return None  # subnormal or overflowing: rare for a Python number, left to XLA
    return f"0x{(number < 0) << 15 | biased << 7 | (significand - 128):04X}"


def _integer(width: int, signed: bool):
    """A float64 -> integer convert's value (toward zero, as ``convert`` rounds), when in range."""
    low, high = (-(1 << (width - 1)), (1 << (width - 1)) - 1) if signed else (0, (1 << width) - 1)

    def bits(number: float) -> Optional[str]:
        if not math.isfinite(number) or not low <= math.trunc(number) <= high:
            return None  # implementation-defined in StableHLO: left as it is
        return str(math.trunc(number))

    return bits


_TARGETS = {
    "f32": _numpy_bits("float32", "uint32"), "f16": _numpy_bits("float16", "uint16"), "bf16": _bfloat16_bits,
    "i1": lambda number: "true" if number != 0 else "false",
    **{f"i{w}": _integer(w, True) for w in (8, 16, 32, 64)},
    **{f"ui{w}": _integer(w, False) for w in (8, 16, 32, 64)},
}


def fold_float64_constants(module: Any) -> int:
    """Fold each convert of a float64 splat to a narrower float; how many were folded."""
    from torch_mlir import ir

    converts = ops_where(module, ir, lambda op: op.name == "stablehlo.convert")
    folded = 0
    with module.context, ir.Location.unknown():
        for convert in converts:
            result_type = ir.RankedTensorType(convert.results[0].type)
            target = _TARGETS.get(str(result_type.element_type))
            number = _float64_splat(convert.operands[0], ir) if target is not None else None
            bits = target(number) if number is not None else None
            if bits is None:
                continue
            attribute = ir.Attribute.parse(f"dense<{bits}> : {result_type}")
            with ir.InsertionPoint(convert):
                constant = ir.Operation.create("stablehlo.constant", results=[result_type],
                                               attributes={"value": attribute})
            convert.results[0].replace_all_uses_with(constant.results[0])
            folded += 1
        if folded:
            erase_unused(module, ir)
    return folded


_SAME_VALUES = ("stablehlo.convert", "stablehlo.reshape", "stablehlo.broadcast_in_dim")
"""Ops that keep a float64 splat the same number (a convert to float64 itself included)."""


def _float64_splat(value: Any, ir: Any) -> Optional[float]:
    """The number every element of float64 ``value`` holds, when it comes from
    a splat constant through :data:`_SAME_VALUES` ops only; else None."""
    while True:
        if str(ir.RankedTensorType(value.type).element_type) != "f64":
            return None
        producer = value.owner
        name = getattr(producer, "name", None)
        if name in _SAME_VALUES:
            value = producer.operands[0]
            continue
        if name not in _CONSTANTS:
            return None
        attribute = producer.attributes["value"]
        if not (isinstance(attribute, ir.DenseElementsAttr) and attribute.is_splat):
            return None
        return float(ir.FloatAttr(attribute.get_splat_value()).value)
