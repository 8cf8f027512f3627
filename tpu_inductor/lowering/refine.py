"""Specialise a StableHLO module with dynamic dims to one set of static shapes.

Why: a graph with symbolic shapes is lowered by torch-mlir once
(:mod:`tpu_inductor.lowering.symbolic`); XLA compiles static shapes. Each
bucket's module is derived from that one symbolic module by StableHLO's own
shape refinement, never by tracing or lowering again:

1. scalar (SymInt) arguments become constants and leave the signature, and
   torch-mlir's shape arithmetic is rewritten as StableHLO
   (:mod:`tpu_inductor.lowering.shape_legalize`);
2. ``stablehlo-refine-arguments`` gives the tensor arguments their static
   types; ``stablehlo-refine-shapes`` propagates them and folds the shape
   arithmetic to constants; ``stablehlo-canonicalize-dynamism`` turns the
   dynamic ops (``dynamic_broadcast_in_dim``, ``dynamic_reshape``,
   ``dynamic_iota``, ``real_dynamic_slice``...) into their static forms.

Before: ``func @main(%arg0: i64, %arg1: tensor<2x?xf32>) -> tensor<2x?xf32>``;
after, for ``arg0 = 16`` and ``arg1: 2x16``: ``func @main(%arg1: tensor<2x16xf32>)
-> tensor<2x16xf32>`` with no dynamic op left.
"""

from __future__ import annotations

import functools
import math
import re
from typing import Mapping, Sequence

from tpu_inductor.errors import LoweringError
from tpu_inductor.lowering.fixups import apply_fixups
from tpu_inductor.lowering.shape_legalize import legalize_shape_arithmetic

_DYNAMIC_TYPE = re.compile(r"tensor<[^>]*\?|tensor<\*")
# Each round resolves one more level of shape arithmetic that depends on
# earlier results; torch-mlir's output needs two.
_MAX_ROUNDS = 6


class RefinementError(LoweringError):
    """StableHLO refinement could not make the module static."""


@functools.cache
def _register_passes() -> None:
    from torch_mlir import ir
    from torch_mlir._mlir_libs import _mlir, _stablehlo

    _stablehlo.register_stablehlo_passes()
    # torch-mlir ships no Python module for these dialects, and every op view of
    # an unregistered one retries importing ``torch_mlir.dialects.<name>``:
    # that failed import was 80% of a refinement. Empty bindings end the search.
    for namespace in ("stablehlo", "chlo"):
        binding = type(f"_{namespace}_dialect", (ir.Dialect,), {"DIALECT_NAMESPACE": namespace})
        try:
            _mlir.register_dialect(binding)
        except RuntimeError:  # a real binding is already registered: better still
            pass


def _context():
    from torch_mlir import ir
    from torch_mlir._mlir_libs import _stablehlo
    from torch_mlir.dialects import torch as torch_dialect

    context = ir.Context()
    torch_dialect.register_dialect(context)
    _stablehlo.register_dialect(context)
    return context


def refine_to_static(
    module_text: str,
    tensor_shapes: Sequence[Sequence[int]],
    scalar_values: Mapping[int, int],
    *,
    for_cpu: bool = False,
) -> str:
    """``module_text`` with static shapes.

    ``scalar_values`` maps the positions of scalar arguments to their values;
    ``tensor_shapes`` lists the shape of every other argument, in order.
    ``for_cpu`` adds the operand layouts XLA:CPU's matmuls want
    (cpu_dot_operands.py), which need the static shapes.
    """
    from torch_mlir import ir

    _register_passes()
    context = _context()
    diagnostics: list[str] = []

    def collect(diagnostic) -> bool:
        diagnostics.append(str(diagnostic.message))
        return True

    handler = context.attach_diagnostic_handler(collect)
    try:
        with context, ir.Location.unknown(context):
            context.emit_error_diagnostics = True
            module = ir.Module.parse(module_text)
            legalize_shape_arithmetic(module, scalar_values)
            types = _argument_types(ir, module, tensor_shapes)
            _run(module, f"stablehlo-refine-arguments{{types='{types}'}}")
            # Refinement folds integer shape arithmetic but not float: torch-mlir
            # computes arange's length as ceil((end - start) / step) in f64.
            # Folding those scalars unblocks the next round of refinement.
            for _ in range(_MAX_ROUNDS):
                _run(module, "stablehlo-refine-shapes")
                if not _fold_float_scalars(ir, module):
                    break
            _run(module, "func.func(stablehlo-canonicalize-dynamism), canonicalize")
            apply_fixups(module, for_cpu=for_cpu)
            text = module.operation.get_asm()
    except LoweringError:
        raise
    except Exception as exc:  # MLIR raises MLIRError / ValueError
        detail = "\n".join(diagnostics[:5]) or str(exc)
        raise RefinementError(f"StableHLO shape refinement failed:\n{detail}") from None
    finally:
        handler.detach()
    dynamic = _DYNAMIC_TYPE.search(text)
    if dynamic:
        line = text[: dynamic.start()].count("\n")
        raise RefinementError(
            "StableHLO shape refinement left a dynamic type at line "
            f"{line + 1}: {text.splitlines()[line].strip()[:200]}"
        )
    return text


_FLOAT_FOLDS = {
    "stablehlo.convert": lambda x: x,
    "stablehlo.divide": lambda x, y: x / y,
    "stablehlo.multiply": lambda x, y: x * y,
    "stablehlo.add": lambda x, y: x + y,
    "stablehlo.subtract": lambda x, y: x - y,
    "stablehlo.maximum": max,
    "stablehlo.minimum": min,
    "stablehlo.ceil": math.ceil,
    "stablehlo.floor": math.floor,
    "stablehlo.negate": lambda x: -x,
}


def _fold_float_scalars(ir, module) -> bool:
    """Evaluate 0-d float ops (and converts to or from float) on constants.

    Only shape arithmetic reaches here with constant operands; the values
    are exact in f64 for any size a tensor can have.
    """
    block = next(
        op for op in module.body.operations if op.operation.name == "func.func"
    ).regions[0].blocks[0]
    changed = False
    for op in list(block.operations):
        fold = _FLOAT_FOLDS.get(op.operation.name)
        if fold is None or len(op.operation.results) != 1:
            continue
        result_type = op.operation.results[0].type
        if not isinstance(result_type, ir.RankedTensorType) or result_type.rank != 0:
            continue
        operand_types = [v.type.element_type for v in op.operation.operands]
        if not any(isinstance(t, ir.FloatType) for t in [*operand_types, result_type.element_type]):
            continue  # integer arithmetic is refinement's own job
        values = [_scalar_constant(ir, v) for v in op.operation.operands]
        if any(v is None for v in values):
            continue
        value = fold(*values)
        element = result_type.element_type
        if isinstance(element, ir.FloatType):
            attr = ir.DenseElementsAttr.get_splat(result_type, ir.FloatAttr.get(element, float(value)))
        else:
            attr = ir.DenseElementsAttr.get_splat(result_type, ir.IntegerAttr.get(element, int(value)))
        with ir.InsertionPoint(op), op.location:
            constant = ir.Operation.create(
                "stablehlo.constant", results=[result_type], attributes={"value": attr}
            )
        op.operation.results[0].replace_all_uses_with(constant.results[0])
        op.operation.erase()
        changed = True
    return changed


def _scalar_constant(ir, value):
    owner = value.owner
    if getattr(owner, "name", None) != "stablehlo.constant":
        return None
    attr = owner.attributes["value"]
    if isinstance(attr, ir.DenseFPElementsAttr):
        return float(attr[0])
    if isinstance(attr, ir.DenseIntElementsAttr):
        return int(attr[0])
    return None


def _run(module, passes: str) -> None:
    from torch_mlir.passmanager import PassManager

    PassManager.parse(f"builtin.module({passes})").run(module.operation)


def _argument_types(ir, module, shapes: Sequence[Sequence[int]]) -> str:
    """The refined argument types: the symbolic ones with ``?`` replaced by sizes."""
    main = next(op for op in module.body.operations if op.operation.name == "func.func")
    function_type = ir.FunctionType(ir.TypeAttr(main.attributes["function_type"]).value)
    if len(function_type.inputs) != len(shapes):
        raise RefinementError(
            f"the module takes {len(function_type.inputs)} tensors, got {len(shapes)} shapes"
        )
    refined = []
    for type_, shape in zip(function_type.inputs, shapes):
        tensor = ir.RankedTensorType(type_)
        if tensor.rank != len(shape) or any(
            not tensor.is_dynamic_dim(d) and tensor.shape[d] != size for d, size in enumerate(shape)
        ):
            raise RefinementError(f"shape {tuple(shape)} does not fit argument type {type_}")
        refined.append(str(ir.RankedTensorType.get(list(shape), tensor.element_type)))
    return ",".join(refined)
