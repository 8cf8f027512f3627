"""Give StableHLO of bools and unsigned integers unsigned semantics.

Why: torch-mlir treats every integer as signed, including ``i1``
(torch.bool) and ``ui8`` (torch.uint8). Two places show it:

**Compares** are emitted ``SIGNED``. XLA's verifier rejects them ("Expected
comparison type UNSIGNED"), so a mask test like ``attention_mask > 0`` on a
bool mask ran in eager. Unsigned order is the right one for both: ``False <
True`` as in PyTorch, and 200 > 100 in uint8 where a signed compare would
call 200 negative.

    before: stablehlo.compare GT, %mask, %c, SIGNED : (tensor<4xi1>, ...)
    after:  stablehlo.compare GT, %mask, %c, UNSIGNED : (tensor<4xi1>, ...)

**Max/min reductions start from the signed extremes**: a uint8 ``amax``
starts from 128 (int8's minimum) and an ``amin`` from 127, so a uint8 row
of values below 128 had max 128 and one above 127 had min 127; ``max.dim``
also pointed its index at position 0. A bool ``max.dim`` starts from
``true`` (i1's signed minimum is -1). The unsigned identities are all zeros
for a max and all ones for a min.

    before: %c = stablehlo.constant dense<128> : tensor<ui8>
            stablehlo.reduce(%x init: %c) applies stablehlo.maximum ...
    after:  %c = stablehlo.constant dense<0> : tensor<ui8>
"""

from __future__ import annotations

from typing import Any, Optional

from tpu_inductor.lowering.mlir_ops import producer

_SIGNED = "#stablehlo<comparison_type SIGNED>"
_UNSIGNED = "#stablehlo<comparison_type UNSIGNED>"
_REDUCTIONS = ("stablehlo.reduce", "stablehlo.reduce_window")
_CONSTANTS = ("stablehlo.constant", "arith.constant")
_LARGEST = {"GE", "GT"}
_SMALLEST = {"LE", "LT"}


def fix_unsigned_compares(module: Any) -> int:
    """Give ``module``'s compares of unsigned operands an unsigned compare type and
    its unsigned max/min reductions unsigned identities; how many were fixed."""
    from torch_mlir import ir

    fixed = 0
    reductions = []

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
        elif op.name in _REDUCTIONS:
            reductions.append(op)
        return ir.WalkResult.ADVANCE

    with module.context, ir.Location.unknown():
        module.operation.walk(visit)
        fixed += sum(_fix_reduction_init(op, ir) for op in reductions)
    return fixed


def _element_type(value_type: Any, ir: Any) -> Any:
    return value_type.element_type if isinstance(value_type, ir.ShapedType) else value_type


def _is_unsigned(value_type: Any, ir: Any) -> bool:
    element = _element_type(value_type, ir)
    return isinstance(element, ir.IntegerType) and (element.width == 1 or element.is_unsigned)


def _fix_reduction_init(op: Any, ir: Any) -> int:
    """Replace the signed-extreme init of an unsigned max/min ``op``; 1 if replaced.

    Only an init that is a splat constant equal to the signed extreme
    torch-mlir uses is replaced, so a reduction whose init means something
    else (a user's value, an identity already unsigned) is left alone.
    """
    count = len(op.operands) // 2
    unsigned = [i for i in range(count) if _is_unsigned(op.operands[i].type, ir)]
    if len(unsigned) != 1:
        return 0
    position = unsigned[0]
    element = _element_type(op.operands[position].type, ir)
    kind = _extreme_kind(op, element, ir)
    init = op.operands[count + position]
    current = _splat_value(init, ir)
    if kind is None or current is None:
        return 0
    width = ir.IntegerType(element).width
    signed_extreme = (1 << (width - 1)) if kind == "max" else (1 << (width - 1)) - 1
    if current != signed_extreme:
        return 0
    identity = 0 if kind == "max" else (1 << width) - 1
    text = ("true" if identity else "false") if width == 1 else str(identity)
    value = ir.Attribute.parse(f"dense<{text}> : {init.type}")
    with ir.InsertionPoint(op):
        constant = ir.Operation.create("stablehlo.constant", results=[init.type], attributes={"value": value})
    op.operands[count + position] = constant.result
    return 1


def _extreme_kind(op: Any, element: Any, ir: Any) -> Optional[str]:
    """``"max"`` or ``"min"``: what the reducer body computes on ``element`` values.

    torch-mlir's reducers are ``maximum``/``minimum``, or (with an index
    operand) a ``compare GE``/``LE`` feeding a select; ops on other types
    (the index's ``minimum`` that breaks ties) do not count.
    """
    kinds = set()
    for block in op.regions[0].blocks:
        for inner in block.operations:
            name = inner.operation.name
            operands = inner.operation.operands
            if not operands or _element_type(operands[0].type, ir) != element:
                continue
            if name == "stablehlo.maximum":
                kinds.add("max")
            elif name == "stablehlo.minimum":
                kinds.add("min")
            elif name == "stablehlo.compare":
                direction = str(inner.operation.attributes["comparison_direction"]).split()[-1].rstrip(">")
                if direction in _LARGEST:
                    kinds.add("max")
                elif direction in _SMALLEST:
                    kinds.add("min")
    return kinds.pop() if len(kinds) == 1 else None


def _splat_value(value: Any, ir: Any) -> Optional[int]:
    """The integer every element of constant ``value`` holds (unsigned reading), or None."""
    constant = producer(value)
    if constant is None or constant.name not in _CONSTANTS or "value" not in constant.attributes:
        return None
    try:
        attribute = ir.DenseIntElementsAttr(constant.attributes["value"])
    except (TypeError, ValueError):
        return None
    return int(attribute[0]) if attribute.is_splat else None
