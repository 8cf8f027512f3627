"""Hand XLA's CPU matmuls their operands in the layouts its kernels take.

Two rewrites of the StableHLO, CPU only (GPU and TPU compilers choose operand
layouts themselves); :func:`arrange_dot_operands` runs both.

**A transposed right operand is read in place** (:func:`fold_transposed_rhs`).
torch-mlir lowers ``x @ weight.t()`` (every ``nn.Linear``) as a
``stablehlo.transpose`` of the ``[out, in]`` weight feeding ``dot_general``.
For a wide left operand XLA folds that transpose into the dot itself; for a
single row (batch 1, a decode step) it first rewrites the dot as a
vector-matrix product and then materialises the transpose, copying the whole
weight on every call. The perf.py MLP (3x1024) at batch 1 ran 1.82 ms that
way and 0.22 ms with the transpose folded (eager: 0.29 ms); batch 64 is
unchanged, since XLA folds it there already. Folding is only a renumbering:

    before: %t = stablehlo.transpose %w, dims = [1, 0] : (tensor<1024x512xf32>) -> tensor<512x1024xf32>
            %y = stablehlo.dot_general %x, %t, contracting_dims = [1] x [0]
    after:  %y = stablehlo.dot_general %x, %w, contracting_dims = [1] x [1]

It applies where the right operand's free dimensions keep their order (the
dot's result layout is unchanged), which covers 2-D weights and batched
``k.transpose(-2, -1)``.

**A transposed left operand is materialised** (:func:`materialize_transposed_lhs`).
A weight gradient is ``grad_out^T @ input``; torch-mlir emits it as a 2-D
``stablehlo.transpose`` feeding ``dot_general``. XLA folds the transpose
into the dot (contracting the left operand's first dimension), and XLA:CPU's
YNNPACK fusion does not take that form: the dot falls back to XLA's generic
emitter. On the perf.py MLP training step (64x1024 activations, one
thread) each of the three weight-gradient dots took 1.52 ms that way and
1.33 ms with the transpose materialised (a 256 KB copy); the backward graph
went from 8.05 to 7.50 ms. An ``optimization_barrier`` keeps the transpose
from being folded back. Only where the copy is small next to the product:
the transposed operand has at most 1/64 of the dot's multiply-adds (the
other side is at least 64 wide).

    before: %t = stablehlo.transpose %g, dims = [1, 0] : (tensor<64x1024xf32>) -> tensor<1024x64xf32>
            %w = stablehlo.dot_general %t, %x, contracting_dims = [1] x [0]
    after:  %t = stablehlo.transpose %g, dims = [1, 0]
            %b = stablehlo.optimization_barrier %t : tensor<1024x64xf32>
            %w = stablehlo.dot_general %b, %x, contracting_dims = [1] x [0]
"""

from __future__ import annotations

from typing import Any, Callable

from tpu_inductor.lowering.mlir_ops import ops_where, producer

WIDE_WEIGHT_ELEMENTS = 1 << 18
"""Below a 1 MB float32 weight the swap's extra transpose and barrier cost
more than they save (64x128x128: 0.036 -> 0.085 ms)."""

MIN_OTHER_SIDE = 64
"""The dot's output columns per transposed element: below this the copy costs
about what it saves."""


def arrange_dot_operands(module: Any) -> None:
    """All three rewrites on ``module``, in place (the order matters: the
    fold produces the ``x . W^T`` form the swap looks for)."""
    fold_transposed_rhs(module)
    weight_as_left_operand(module)
    materialize_transposed_lhs(module)


def _dots(module: Any, ir: Any, wanted: Callable[[Any], bool]) -> list[Any]:
    """The ``stablehlo.dot_general`` ops of ``module`` that ``wanted`` accepts,
    collected before any is rewritten."""
    return ops_where(module, ir, lambda op: op.name == "stablehlo.dot_general" and wanted(op))


def fold_transposed_rhs(module: Any) -> int:
    """Read each transposed right operand of a dot in place; how many transposes."""
    from torch_mlir import ir

    folds = 0
    with module.context, ir.Location.unknown():
        for dot in _dots(module, ir, lambda dot: True):
            # Repeatedly: AOTAutograd's backward reads a weight as t(t(W)).
            while chain := _foldable_rhs_chain(dot, ir):
                _fold(dot, chain, ir)
                folds += 1
    return folds


def _fold(dot: Any, chain: list[Any], ir: Any) -> None:
    from torch_mlir._mlir_libs._stablehlo import DotDimensionNumbers

    transpose = chain[-1]
    permutation = _permutation(transpose, ir)
    numbers = DotDimensionNumbers(dot.attributes["dot_dimension_numbers"])
    dot.attributes["dot_dimension_numbers"] = DotDimensionNumbers.get(
        lhs_batching_dimensions=numbers.lhs_batching_dimensions,
        rhs_batching_dimensions=[permutation[d] for d in numbers.rhs_batching_dimensions],
        lhs_contracting_dimensions=numbers.lhs_contracting_dimensions,
        rhs_contracting_dimensions=[permutation[d] for d in numbers.rhs_contracting_dimensions],
    )
    dot.operands[1] = transpose.operands[0]
    for op in chain:  # what only fed this dot goes
        if list(op.result.uses):
            break
        op.erase()


def _permutation(transpose: Any, ir: Any) -> list[int]:
    return list(ir.DenseI64ArrayAttr(transpose.attributes["permutation"]))


def _foldable_rhs_chain(dot: Any, ir: Any) -> list[Any]:
    """The ops from ``dot``'s right operand back to a transpose (through
    identity broadcasts, which torch-mlir puts before a ``bmm``), where reading
    the transpose's input instead keeps the dot's result the same; else []."""
    from torch_mlir._mlir_libs._stablehlo import DotDimensionNumbers

    chain = [producer(dot.operands[1])]
    while chain[-1] is not None and chain[-1].name == "stablehlo.broadcast_in_dim" and _is_identity(chain[-1], ir):
        chain.append(producer(chain[-1].operands[0]))
    transpose = chain[-1]
    if transpose is None or transpose.name != "stablehlo.transpose":
        return []
    permutation = _permutation(transpose, ir)
    numbers = DotDimensionNumbers(dot.attributes["dot_dimension_numbers"])
    used = {*numbers.rhs_batching_dimensions, *numbers.rhs_contracting_dimensions}
    free = [permutation[d] for d in range(len(permutation)) if d not in used]
    # The result lists the right operand's free dims in dimension order.
    return chain if free == sorted(free) else []


def _is_identity(broadcast: Any, ir: Any) -> bool:
    dims = list(ir.DenseI64ArrayAttr(broadcast.attributes["broadcast_dimensions"]))
    return broadcast.operands[0].type == broadcast.result.type and dims == list(range(len(dims)))


def weight_as_left_operand(module: Any) -> int:
    """Compute each thin ``x . W^T`` as ``(W . x^T)^T``; how many."""
    from torch_mlir import ir
    from torch_mlir._mlir_libs._stablehlo import DotDimensionNumbers

    dots = _dots(module, ir, lambda dot: _thin_times_wide(dot, ir))
    with module.context, ir.Location.unknown():
        for dot in dots:
            thin, wide = dot.operands[0], dot.operands[1]
            rows, columns = ir.RankedTensorType(dot.result.type).shape
            element = ir.RankedTensorType(dot.result.type).element_type
            swapped_type = ir.RankedTensorType.get([columns, rows], element)
            attributes = {name: dot.attributes[name] for name in dot.attributes}
            attributes["dot_dimension_numbers"] = DotDimensionNumbers.get(
                lhs_batching_dimensions=[],
                rhs_batching_dimensions=[],
                lhs_contracting_dimensions=[1],
                rhs_contracting_dimensions=[1],
            )
            with ir.InsertionPoint(dot):
                swapped = ir.Operation.create(
                    "stablehlo.dot_general", results=[swapped_type], operands=[wide, thin], attributes=attributes
                )
                # Without the barrier XLA folds the transpose back into the dot.
                barrier = ir.Operation.create(
                    "stablehlo.optimization_barrier", results=[swapped_type], operands=[swapped.result]
                )
                transposed = ir.Operation.create(
                    "stablehlo.transpose",
                    results=[dot.result.type],
                    operands=[barrier.result],
                    attributes={"permutation": ir.DenseI64ArrayAttr.get([1, 0])},
                )
            dot.result.replace_all_uses_with(transposed.result)
            dot.erase()
    return len(dots)


def _thin_times_wide(dot: Any, ir: Any) -> bool:
    """A float32 ``[M, K] . [N, K]^T`` where packing the wide side costs more
    than transposing the thin side and the product (see WIDE_WEIGHT_ELEMENTS)."""
    from torch_mlir._mlir_libs._stablehlo import DotDimensionNumbers

    numbers = DotDimensionNumbers(dot.attributes["dot_dimension_numbers"])
    if list(numbers.lhs_batching_dimensions) or list(numbers.lhs_contracting_dimensions) != [1]:
        return False
    if list(numbers.rhs_contracting_dimensions) != [1]:
        return False
    lhs, rhs = (ir.RankedTensorType(v.type) for v in dot.operands)
    if not (lhs.rank == rhs.rank == 2 and lhs.has_static_shape and rhs.has_static_shape):
        return False
    if ir.RankedTensorType(dot.result.type).element_type.typeid != ir.F32Type.static_typeid:
        return False
    (rows, depth), (columns, _) = lhs.shape, rhs.shape
    return (
        rows >= 2
        and columns * depth >= WIDE_WEIGHT_ELEMENTS
        and 2 * rows * (columns + depth) < columns * depth
    )


def materialize_transposed_lhs(module: Any) -> int:
    """Put a barrier between each qualifying transpose and its dot in ``module``; how many."""
    from torch_mlir import ir

    dots = _dots(module, ir, lambda dot: _qualifies(dot, ir))
    with module.context, ir.Location.unknown():
        for dot in dots:
            transposed = dot.operands[0]
            with ir.InsertionPoint(dot):
                barrier = ir.Operation.create(
                    "stablehlo.optimization_barrier", results=[transposed.type], operands=[transposed]
                )
            dot.operands[0] = barrier.results[0]
    return len(dots)


def _qualifies(dot: Any, ir: Any) -> bool:
    from torch_mlir._mlir_libs._stablehlo import DotDimensionNumbers

    lhs, rhs = dot.operands[0], dot.operands[1]
    transpose = producer(lhs)
    if transpose is None or transpose.name != "stablehlo.transpose":
        return False
    if _permutation(transpose, ir) != [1, 0]:
        return False
    numbers = DotDimensionNumbers(dot.attributes["dot_dimension_numbers"])
    if list(numbers.lhs_batching_dimensions) or list(numbers.lhs_contracting_dimensions) != [1]:
        return False
    lhs_shape = ir.RankedTensorType(lhs.type).shape
    rhs_shape = ir.RankedTensorType(rhs.type).shape
    if len(lhs_shape) != 2 or len(rhs_shape) != 2 or any(d < 0 for d in lhs_shape + rhs_shape):
        return False
    other_side = rhs_shape[1] if list(numbers.rhs_contracting_dimensions) == [0] else rhs_shape[0]
    return other_side >= MIN_OTHER_SIDE
