"""Give StableHLO comparisons of bools and unsigned integers an unsigned compare type.

Why: torch-mlir emits every integer ``stablehlo.compare`` as ``SIGNED``,
including those on ``i1`` (torch.bool) and ``ui8`` (torch.uint8) operands.
XLA's verifier rejects them ("Expected comparison type UNSIGNED"), so a
mask test like ``attention_mask > 0`` on a bool mask ran in eager. Unsigned
order is the right one for both: ``False < True`` as in PyTorch, and 200 >
100 in uint8 where a signed compare would call 200 negative.

    before: stablehlo.compare GT, %mask, %c, SIGNED : (tensor<4xi1>, ...)
    after:  stablehlo.compare GT, %mask, %c, UNSIGNED : (tensor<4xi1>, ...)
"""

from __future__ import annotations

from typing import Any

_SIGNED = "#stablehlo<comparison_type SIGNED>"
_UNSIGNED = "#stablehlo<comparison_type UNSIGNED>"


def fix_unsigned_compares(module: Any) -> int:
    """Rewrite signed compares of unsigned operands in ``module``; how many were fixed."""
    from torch_mlir import ir

    fixed = 0

    def visit(op: Any) -> Any:
        nonlocal fixed
        if (
            op.name == "stablehlo.compare"
            and "compare_type" in op.attributes  # absent: XLA infers it from the type
            and str(op.attributes["compare_type"]) == _SIGNED
            and _is_unsigned(op.operands[0].type, ir)
        ):
            op.attributes["compare_type"] = ir.Attribute.parse(_UNSIGNED)
            fixed += 1
        return ir.WalkResult.ADVANCE

    with module.context:
        module.operation.walk(visit)
    return fixed


def _is_unsigned(value_type: Any, ir: Any) -> bool:
    element = value_type.element_type if isinstance(value_type, ir.ShapedType) else value_type
    return isinstance(element, ir.IntegerType) and (element.width == 1 or element.is_unsigned)
