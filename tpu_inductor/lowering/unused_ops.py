"""Erase side-effect-free StableHLO ops whose results nobody uses (after a fix-up folds their users away)."""

from __future__ import annotations

from typing import Any

PURE = frozenset({
    "arith.constant", "stablehlo.constant", "stablehlo.convert", "stablehlo.divide", "stablehlo.ceil",
    "stablehlo.reshape", "stablehlo.subtract", "stablehlo.add", "stablehlo.multiply", "stablehlo.concatenate",
    "stablehlo.broadcast_in_dim", "stablehlo.floor", "stablehlo.abs", "stablehlo.sign",
})
"""Ops without side effects that the folded computations are made of."""


def erase_unused(module: Any, ir: Any) -> None:
    """Erase :data:`PURE` ops with unused results until none is left.

    Collected afresh each round, so an op erased is never touched again."""
    while True:
        unused = []

        def visit(op: Any) -> Any:
            if op.name in PURE and not any(list(result.uses) for result in op.results):
                unused.append(op)
            return ir.WalkResult.ADVANCE

        module.operation.walk(visit)
        if not unused:
            return
        for op in unused:
            op.erase()
