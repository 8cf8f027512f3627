"""Walking a StableHLO module for the fix-ups: the ops a test picks, the op
that produced a value, and erasing side-effect-free ops whose results nobody
uses (after a fix-up folds their users away)."""

from __future__ import annotations

from typing import Any, Callable, Optional


def ops_where(module: Any, ir: Any, wanted: Callable[[Any], bool]) -> list[Any]:
    """The ops of ``module`` that ``wanted`` accepts, in walk order, collected
    before any is rewritten."""
    found = []

    def visit(op: Any) -> Any:
        if wanted(op):
            found.append(op)
        return ir.WalkResult.ADVANCE

    with module.context:
        module.operation.walk(visit)
    return found


def producer(value: Any) -> Optional[Any]:
    """The operation whose result ``value`` is; None for a block argument (a function's input)."""
    return getattr(value.owner, "operation", None)


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
        unused = ops_where(module, ir, lambda op: op.name in PURE and not any(list(r.uses) for r in op.results))
        if not unused:
            return
        for op in unused:
            op.erase()
