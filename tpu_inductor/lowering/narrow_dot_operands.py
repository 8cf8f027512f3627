"""Give a float32 dot or convolution of upcast half-precision operands its half operands back (PJRT plugins).

Why: a bfloat16/float16 matmul or convolution that adds a bias computes in
float32 and rounds once (``half_floats_in_float32.py``, eager's arithmetic),
so its operands reach StableHLO as ``convert``s of half values to float32.
A GPU's tensor cores and a TPU's MXU take the half operands and accumulate
in float32; a float32 dot is several passes on them (matmul_precision.py
asks for HIGHEST on float32). Converting a half value to float32 is exact,
so the dot of the two half values with a float32 result is the same
product: the ``convert``s are folded into the dot, its result stays float32,
and the bias is still added to it before the one rounding.

Before::

    %a32 = stablehlo.convert %a : (tensor<4x8xbf16>) -> tensor<4x8xf32>
    %b32 = stablehlo.convert %b : (tensor<8x16xbf16>) -> tensor<8x16xf32>
    %y = stablehlo.dot_general %a32, %b32, contracting_dims = [1] x [0] : (...) -> tensor<4x16xf32>

After::

    %y = stablehlo.dot_general %a, %b, contracting_dims = [1] x [0] : (tensor<4x8xbf16>, tensor<8x16xbf16>) -> tensor<4x16xf32>

Not on the CPU client, whose float32 dot is exact at every precision and
whose half dots are no faster (it converts them itself). Both operands must
come from the same half type; a dot with one float32 operand is left alone.
"""

from __future__ import annotations

from typing import Any

from tpu_inductor.lowering.mlir_ops import erase_unused, ops_where, producer

_PRODUCTS = ("stablehlo.dot_general", "stablehlo.convolution")
_HALF_TYPES = ("bf16", "f16")


def narrow_dot_operands(module: Any) -> int:
    """Fold upcasts of half operands into float32 products, in place; how many products."""
    from torch_mlir import ir

    products = ops_where(module, ir, lambda op: op.name in _PRODUCTS and _upcast_from_one_half_type(op, ir))
    with module.context, ir.Location.unknown():
        for product in products:
            for index in range(2):
                product.operands[index] = product.operands[index].owner.operands[0]
        erase_unused(module, ir)
    return len(products)


def _upcast_from_one_half_type(product: Any, ir: Any) -> bool:
    """Whether ``product`` is float32 and both its operands are converted to float32 from the same half type."""
    if str(ir.ShapedType(product.result.type).element_type) != "f32":
        return False
    sources = set()
    for operand in list(product.operands)[:2]:
        upcast = producer(operand)
        if upcast is None or upcast.name != "stablehlo.convert":
            return False
        sources.add(str(ir.ShapedType(upcast.operands[0].type).element_type))
    return len(sources) == 1 and sources <= set(_HALF_TYPES)
