"""Hand XLA's CPU matmul library a transposed left operand already laid out.

Why: a weight gradient is ``grad_out^T @ input``; torch-mlir emits it as a
2-D ``stablehlo.transpose`` feeding ``dot_general``. XLA folds the transpose
into the dot (contracting the left operand's first dimension), and XLA:CPU's
YNNPACK fusion does not take that form: the dot falls back to XLA's generic
emitter. On the perf.py MLP training step (64x1024 activations, one
thread) each of the three weight-gradient dots took 1.52 ms that way and
1.33 ms with the transpose materialised (a 256 KB copy); the backward graph
went from 8.05 to 7.50 ms. An ``optimization_barrier`` keeps the transpose
from being folded back.

Only where the copy is small next to the product: the transposed operand
has at most 1/64 of the dot's multiply-adds (the other side is at least 64
wide). CPU only: GPU and TPU compilers choose operand layouts themselves.

    before: %t = stablehlo.transpose %g, dims = [1, 0] : (tensor<64x1024xf32>) -> tensor<1024x64xf32>
            %w = stablehlo.dot_general %t, %x, contracting_dims = [1] x [0]
    after:  %t = stablehlo.transpose %g, dims = [1, 0]
            %b = stablehlo.optimization_barrier %t : tensor<1024x64xf32>
            %w = stablehlo.dot_general %b, %x, contracting_dims = [1] x [0]
"""

from __future__ import annotations

from typing import Any

MIN_OTHER_SIDE = 64
"""The dot's output columns per transposed element: below this the copy costs
about what it saves."""


def materialize_transposed_lhs(module: Any) -> int:
    """Put a barrier between each qualifying transpose and its dot in ``module``; how many."""
    from torch_mlir import ir

    dots = []

    def visit(op: Any) -> Any:
        if op.name == "stablehlo.dot_general" and _qualifies(op, ir):
            dots.append(op)
        return ir.WalkResult.ADVANCE

    with module.context, ir.Location.unknown():
        module.operation.walk(visit)
        for dot in dots:
            transposed = dot.operands[0]
            with ir.InsertionPoint(dot):
                barrier = ir.Operation.create(
                    "stablehlo.optimization_barrier", results=[transposed.type], operands=[transposed]
                )
            dot.operands[0] = barrier.results[0]
    return len(dots)


def _qualifies(dot: Any, ir: Any) -> bool:
    lhs, rhs = dot.operands[0], dot.operands[1]
    producer = getattr(lhs.owner, "operation", None)  # a block argument has no operation
    if producer is None or producer.name != "stablehlo.transpose":
        return False
    if list(ir.DenseI64ArrayAttr(producer.attributes["permutation"])) != [1, 0]:
        return False
    numbers = str(dot.attributes["dot_dimension_numbers"])
    if "batching" in numbers or "lhs_contracting_dimensions = [1]" not in numbers:
        return False
    lhs_shape = ir.RankedTensorType(lhs.type).shape
    rhs_shape = ir.RankedTensorType(rhs.type).shape
    if len(lhs_shape) != 2 or len(rhs_shape) != 2 or any(d < 0 for d in lhs_shape + rhs_shape):
        return False
    other_side = rhs_shape[1] if "rhs_contracting_dimensions = [0]" in numbers else rhs_shape[0]
    return other_side >= MIN_OTHER_SIDE
