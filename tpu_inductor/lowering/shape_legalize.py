"""Rewrite torch-mlir's host-side shape arithmetic as StableHLO, so shapes can be refined.

Why: torch-mlir lowers a graph with dynamic dims to StableHLO whose shape
computations are not StableHLO: ``tensor.dim``, ``arith`` on ``i64``/``index``
scalars, ``tensor.from_elements`` and the ``shape`` dialect (``shape_of``,
``broadcast``, ``num_elements``, ``cstr_broadcastable`` + ``assuming``).
``stablehlo-refine-shapes`` refuses to refine a value that any non-StableHLO op
uses, and upstream ``shape-legalize-to-stablehlo`` only covers JAX's
index/i32 subset (it rejects ``tensor.from_elements`` of ``i64``,
``arith.maxsi``, ``arith.select``, ...). This rewrite moves every scalar into a
0-d ``tensor<i64>`` and every extent tensor into a ``tensor<Nxi64>``, each
computed by StableHLO ops; once the arguments are refined, StableHLO's own
refinement folds all of it to constants.

Before::

    %d = tensor.dim %x, %c1 : tensor<2x?xf32>
    %n = arith.index_cast %d : index to i64
    %s = tensor.from_elements %c2_i64, %n : tensor<2xi64>

After::

    %d = stablehlo.get_dimension_size %x, dim = 1 : (tensor<2x?xf32>) -> tensor<i32>
    %n = stablehlo.convert %d : (tensor<i32>) -> tensor<i64>
    %s = stablehlo.concatenate %c2, %n_1, dim = 0 : tensor<2xi64>   (each reshaped to 1xi64)

Scalar function arguments (SymInts, which XLA cannot take as bare ``i64``
arguments) are replaced by constants given by the caller and dropped from the
signature.
"""

from __future__ import annotations

from typing import Mapping, Sequence

from tpu_inductor.errors import LoweringError


class ShapeLegalizationError(LoweringError):
    """An op of torch-mlir's shape arithmetic that this rewrite does not know."""


# arith.cmpi predicate number -> (StableHLO direction, comparison type).
_CMPI = {
    0: ("EQ", "SIGNED"),
    1: ("NE", "SIGNED"),
    2: ("LT", "SIGNED"),
    3: ("LE", "SIGNED"),
    4: ("GT", "SIGNED"),
    5: ("GE", "SIGNED"),
    6: ("LT", "UNSIGNED"),
    7: ("LE", "UNSIGNED"),
    8: ("GT", "UNSIGNED"),
    9: ("GE", "UNSIGNED"),
}

# Sizes are non-negative, so signed and unsigned integer ops agree on them.
_BINARY = {
    "arith.addi": "stablehlo.add",
    "arith.subi": "stablehlo.subtract",
    "arith.muli": "stablehlo.multiply",
    "arith.divsi": "stablehlo.divide",
    "arith.divui": "stablehlo.divide",
    "arith.remsi": "stablehlo.remainder",
    "arith.remui": "stablehlo.remainder",
    "arith.maxsi": "stablehlo.maximum",
    "arith.maxui": "stablehlo.maximum",
    "arith.minsi": "stablehlo.minimum",
    "arith.minui": "stablehlo.minimum",
    "arith.andi": "stablehlo.and",
    "arith.ori": "stablehlo.or",
    "arith.xori": "stablehlo.xor",
    "arith.addf": "stablehlo.add",
    "arith.subf": "stablehlo.subtract",
    "arith.mulf": "stablehlo.multiply",
    "arith.divf": "stablehlo.divide",
}

_CASTS = frozenset(
    {
        "arith.index_cast",
        "arith.index_castui",
        "arith.extsi",
        "arith.extui",
        "arith.trunci",
        "arith.sitofp",
        "arith.uitofp",
        "arith.fptosi",
        "arith.fptoui",
        "arith.extf",
        "arith.truncf",
    }
)

# Ops that only carry a value through: their result is their (rewritten) operand.
_IDENTITY = frozenset(
    {
        "tensor.cast",
        "shape.to_extent_tensor",
        "shape.from_extent_tensor",
        "shape.index_to_size",
        "shape.size_to_index",
        "builtin.unrealized_conversion_cast",
    }
)

# Constraint ops: they only feed the ``shape.assuming`` regions we inline.
_DROPPED = frozenset(
    {
        "shape.cstr_broadcastable",
        "shape.cstr_eq",
        "shape.cstr_require",
        "shape.const_witness",
        "shape.assuming_all",
    }
)

_KEPT_DIALECTS = ("stablehlo.", "chlo.", "func.")


def legalize_shape_arithmetic(module, scalar_values: Mapping[int, int]) -> None:
    """Rewrite ``module``'s ``main`` in place; ``scalar_values``: arg index -> value."""
    from torch_mlir import ir

    func_op = _main_function(module)
    with module.context, ir.Location.unknown(module.context):
        builder = _Builder(ir)
        block = func_op.regions[0].blocks[0]
        _substitute_scalar_arguments(ir, func_op, block, scalar_values, builder)
        _inline_assuming_regions(block)
        for op in list(block.operations):
            name = op.operation.name
            if name.startswith(_KEPT_DIALECTS):
                continue
            with ir.InsertionPoint(op), op.location:
                _rewrite(op.operation, name, builder)
        # Constraints become dead once their assuming regions are gone.
        for op in reversed(list(block.operations)):
            if op.operation.name in _DROPPED:
                op.operation.erase()
        leftovers = sorted(
            {
                op.operation.name
                for op in block.operations
                if not op.operation.name.startswith(_KEPT_DIALECTS)
            }
        )
        if leftovers:
            raise ShapeLegalizationError(
                f"shape arithmetic left non-StableHLO ops {leftovers} that refinement cannot fold"
            )


def _main_function(module):
    funcs = [op for op in module.body.operations if op.operation.name == "func.func"]
    for op in funcs:
        if str(op.attributes["sym_name"]).strip('"') == "main":
            return op
    if len(funcs) == 1:
        return funcs[0]
    raise ShapeLegalizationError("the module has no single `main` function")


def _substitute_scalar_arguments(ir, func_op, block, values: Mapping[int, int], builder) -> None:
    """Replace scalar (non-tensor) arguments with constants and drop them."""
    if not values:
        return
    function_type = ir.FunctionType(ir.TypeAttr(func_op.attributes["function_type"]).value)
    first = block.operations[0] if len(block.operations) else None
    with ir.InsertionPoint(first) if first is not None else ir.InsertionPoint(block):
        for index, value in sorted(values.items()):
            argument = block.arguments[index]
            if isinstance(argument.type, ir.RankedTensorType):
                raise ShapeLegalizationError(f"argument {index} is a tensor, not a scalar")
            argument.replace_all_uses_with(builder.scalar(value, argument.type))
    for index in sorted(values, reverse=True):
        block.erase_argument(index)
    inputs = [t for i, t in enumerate(function_type.inputs) if i not in values]
    func_op.attributes["function_type"] = ir.TypeAttr.get(
        ir.FunctionType.get(inputs, function_type.results)
    )
    if "arg_attrs" in func_op.attributes:
        attrs = ir.ArrayAttr(func_op.attributes["arg_attrs"])
        kept = [a for i, a in enumerate(attrs) if i not in values]
        func_op.attributes["arg_attrs"] = ir.ArrayAttr.get(kept)


def _inline_assuming_regions(block) -> None:
    """``shape.assuming %w { ops; yield %v }`` -> ``ops`` with uses of the result -> ``%v``.

    The constraints only guard against broadcasting errors that Dynamo's
    guards already rule out for every shape we compile.
    """
    while True:
        assuming = [op for op in block.operations if op.operation.name == "shape.assuming"]
        if not assuming:
            return
        for op in assuming:
            body = op.operation.regions[0].blocks[0]
            inner = list(body.operations)
            terminator = inner[-1]
            for child in inner[:-1]:
                child.operation.move_before(op.operation)
            for result, yielded in zip(op.operation.results, terminator.operation.operands):
                result.replace_all_uses_with(yielded)
            op.operation.erase()


class _Builder:
    """Creates the StableHLO ops of the rewrite at the current insertion point."""

    def __init__(self, ir) -> None:
        self.ir = ir
        self.i64 = ir.IntegerType.get_signless(64)
        self.i1 = ir.IntegerType.get_signless(1)

    def op(self, name: str, result_types: Sequence, operands: Sequence, attributes=None):
        created = self.ir.Operation.create(
            name,
            results=list(result_types),
            operands=list(operands),
            attributes={k: self.ir.Attribute.parse(v) for k, v in (attributes or {}).items()},
        )
        return created.results[0] if len(created.results) == 1 else created.results

    def tensor_type(self, shape: Sequence[int], element) -> object:
        return self.ir.RankedTensorType.get(list(shape), element)

    def element(self, scalar_type) -> object:
        """The element type a scalar of ``scalar_type`` is carried in: index -> i64."""
        if isinstance(scalar_type, self.ir.IndexType):
            return self.i64
        return scalar_type

    def constant(self, values: Sequence, shape: Sequence[int], element) -> object:
        type_ = self.tensor_type(shape, element)
        if isinstance(element, self.ir.FloatType):
            (value,) = values  # only 0-d float constants occur in shape arithmetic
            attr = self.ir.DenseElementsAttr.get_splat(type_, self.ir.FloatAttr.get(element, value))
            created = self.ir.Operation.create(
                "stablehlo.constant", results=[type_], attributes={"value": attr}
            )
            return created.results[0]
        if element == self.i1:
            words = ["true" if v else "false" for v in values]
        else:
            words = [str(int(v)) for v in values]
        literal = words[0] if not shape else "[" + ", ".join(words) + "]"
        return self.op("stablehlo.constant", [type_], [], {"value": f"dense<{literal}> : {type_}"})

    def scalar(self, value, scalar_type) -> object:
        return self.constant([value], [], self.element(scalar_type))

    def convert(self, value, element) -> object:
        type_ = self.ir.RankedTensorType(value.type)
        if type_.element_type == element:
            return value
        return self.op("stablehlo.convert", [self.tensor_type(type_.shape, element)], [value])

    def reshape(self, value, shape: Sequence[int]) -> object:
        type_ = self.ir.RankedTensorType(value.type)
        if list(type_.shape) == list(shape):
            return value
        return self.op("stablehlo.reshape", [self.tensor_type(shape, type_.element_type)], [value])

    def concatenate(self, parts: Sequence, element) -> object:
        """A 1-d tensor of 0-d ``parts``."""
        if not parts:
            return self.constant([], [0], element)
        pieces = [self.reshape(self.convert(p, element), [1]) for p in parts]
        if len(pieces) == 1:
            return pieces[0]
        return self.op(
            "stablehlo.concatenate",
            [self.tensor_type([len(pieces)], element)],
            pieces,
            {"dimension": "0 : i64"},
        )

    def element_at(self, vector, index: int) -> object:
        """``vector[index]`` of a 1-d tensor, as a 0-d tensor."""
        type_ = self.ir.RankedTensorType(vector.type)
        piece = self.op(
            "stablehlo.slice",
            [self.tensor_type([1], type_.element_type)],
            [vector],
            {
                "start_indices": f"array<i64: {index}>",
                "limit_indices": f"array<i64: {index + 1}>",
                "strides": "array<i64: 1>",
            },
        )
        return self.reshape(piece, [])

    def compare(self, lhs, rhs, direction: str, kind: str = "SIGNED") -> object:
        shape = self.ir.RankedTensorType(lhs.type).shape
        return self.op(
            "stablehlo.compare",
            [self.tensor_type(shape, self.i1)],
            [lhs, rhs],
            {
                "comparison_direction": f"#stablehlo<comparison_direction {direction}>",
                "compare_type": f"#stablehlo<comparison_type {kind}>",
            },
        )

    def binary(self, name: str, lhs, rhs) -> object:
        return self.op(name, [lhs.type], [lhs, rhs])

    def dim_size(self, tensor, dim: int) -> object:
        """Size of ``tensor`` along ``dim`` as ``tensor<i64>``."""
        type_ = self.ir.RankedTensorType(tensor.type)
        if not type_.is_dynamic_dim(dim):
            return self.constant([type_.shape[dim]], [], self.i64)
        size = self.op(
            "stablehlo.get_dimension_size",
            [self.tensor_type([], self.ir.IntegerType.get_signless(32))],
            [tensor],
            {"dimension": f"{dim} : i64"},
        )
        return self.convert(size, self.i64)

    def shape_of(self, tensor) -> object:
        type_ = self.ir.RankedTensorType(tensor.type)
        return self.concatenate([self.dim_size(tensor, d) for d in range(type_.rank)], self.i64)


def _constant_int(value) -> int:
    """The integer a 0-d StableHLO constant (or arith constant) holds."""
    from torch_mlir import ir

    owner = value.owner
    name = owner.name if hasattr(owner, "name") else owner.operation.name
    if name not in ("stablehlo.constant", "arith.constant"):
        raise ShapeLegalizationError(f"expected a constant index, got {name}")
    attr = owner.attributes["value"]
    if isinstance(attr, ir.IntegerAttr):
        return ir.IntegerAttr(attr).value
    dense = ir.DenseIntElementsAttr(attr)
    return int(dense[0])


def _rewrite(op, name: str, b: _Builder) -> None:
    ir = b.ir
    operands = list(op.operands)
    results = list(op.results)

    def replace(*values) -> None:
        for result, value in zip(results, values):
            result.replace_all_uses_with(value)
        op.erase()

    if name in _DROPPED:
        return  # erased after the pass, once nothing uses them
    if name in _IDENTITY:
        replace(operands[0])
    elif name == "arith.constant":
        replace(_rewrite_constant(op, b))
    elif name in _BINARY:
        replace(b.binary(_BINARY[name], *operands))
    elif name in ("arith.floordivsi", "arith.ceildivsi"):
        replace(_rounded_division(b, *operands, floor=name == "arith.floordivsi"))
    elif name == "arith.cmpi":
        direction, kind = _CMPI[ir.IntegerAttr(op.attributes["predicate"]).value]
        replace(b.compare(operands[0], operands[1], direction, kind))
    elif name == "arith.select":
        replace(b.op("stablehlo.select", [operands[1].type], operands))
    elif name in _CASTS:
        replace(b.convert(operands[0], b.element(results[0].type)))
    elif name == "tensor.dim":
        replace(b.dim_size(operands[0], _constant_int(operands[1])))
    elif name == "tensor.from_elements":
        result_type = ir.RankedTensorType(results[0].type)
        element = b.element(result_type.element_type)
        flat = b.concatenate(operands, element)
        replace(b.reshape(flat, list(result_type.shape)))
    elif name == "tensor.extract":
        replace(_extract(b, operands[0], [_constant_int(i) for i in operands[1:]]))
    elif name == "shape.shape_of":
        replace(b.shape_of(operands[0]))
    elif name == "shape.const_shape":
        values = [int(v) for v in ir.DenseIntElementsAttr(op.attributes["shape"])]
        replace(b.constant(values, [len(values)], b.i64))
    elif name == "shape.broadcast":
        rank = ir.RankedTensorType(results[0].type).shape[0]
        replace(_broadcast_shapes(b, operands, rank))
    elif name == "shape.num_elements":
        replace(_product(b, operands[0]))
    elif name == "shape.get_extent":
        replace(b.element_at(operands[0], _constant_int(operands[1])))
    else:
        raise ShapeLegalizationError(f"no StableHLO rewrite for {name}")


def _rewrite_constant(op, b: _Builder):
    ir = b.ir
    attr = op.attributes["value"]
    type_ = op.results[0].type
    if isinstance(type_, ir.RankedTensorType):
        tensor_type = ir.RankedTensorType(type_)
        if isinstance(tensor_type.element_type, ir.IndexType):
            text = str(attr).replace("index>", "i64>")
            new_type = b.tensor_type(tensor_type.shape, b.i64)
            return b.op("stablehlo.constant", [new_type], [], {"value": text})
        return b.op("stablehlo.constant", [type_], [], {"value": str(attr)})
    if isinstance(attr, ir.IntegerAttr):
        return b.scalar(ir.IntegerAttr(attr).value, type_)
    if isinstance(attr, ir.FloatAttr):
        return b.constant([ir.FloatAttr(attr).value], [], type_)
    raise ShapeLegalizationError(f"unsupported constant {attr}")


def _rounded_division(b: _Builder, lhs, rhs, floor: bool):
    """Floor (or ceil) division from truncating division and the remainder's sign."""
    zero = b.constant([0], [], b.ir.RankedTensorType(lhs.type).element_type)
    one = b.constant([1], [], b.ir.RankedTensorType(lhs.type).element_type)
    quotient = b.binary("stablehlo.divide", lhs, rhs)
    remainder = b.binary("stablehlo.remainder", lhs, rhs)
    inexact = b.compare(remainder, zero, "NE")
    same_sign = b.compare(b.compare(remainder, zero, "LT"), b.compare(rhs, zero, "LT"), "EQ")
    if floor:
        adjust = b.binary("stablehlo.and", inexact, b.op("stablehlo.not", [same_sign.type], [same_sign]))
        shifted = b.binary("stablehlo.subtract", quotient, one)
    else:
        adjust = b.binary("stablehlo.and", inexact, same_sign)
        shifted = b.binary("stablehlo.add", quotient, one)
    return b.op("stablehlo.select", [quotient.type], [adjust, shifted, quotient])


def _extract(b: _Builder, tensor, indices: Sequence[int]):
    type_ = b.ir.RankedTensorType(tensor.type)
    if type_.rank == 0:
        return tensor
    flat = b.reshape(tensor, [_numel(type_.shape)]) if type_.rank > 1 else tensor
    offset = 0
    for index, size in zip(indices, type_.shape):
        offset = offset * size + index
    return b.element_at(flat, offset)


def _numel(shape: Sequence[int]) -> int:
    total = 1
    for size in shape:
        total *= size
    return total


def _broadcast_shapes(b: _Builder, shapes: Sequence, rank: int):
    """NumPy broadcasting of extent tensors: right-aligned, 1 stretches."""
    padded = []
    for shape in shapes:
        length = b.ir.RankedTensorType(shape.type).shape[0]
        shape = b.convert(shape, b.i64)
        if length < rank:
            ones = b.constant([1] * (rank - length), [rank - length], b.i64)
            shape = b.op(
                "stablehlo.concatenate",
                [b.tensor_type([rank], b.i64)],
                [ones, shape],
                {"dimension": "0 : i64"},
            )
        padded.append(shape)
    result = padded[0]
    ones = b.constant([1] * rank, [rank], b.i64)
    for other in padded[1:]:
        # other == 1 keeps result; else other (equal, or result was 1).
        result = b.op("stablehlo.select", [result.type], [b.compare(other, ones, "EQ"), result, other])
    return result


def _product(b: _Builder, vector):
    length = b.ir.RankedTensorType(vector.type).shape[0]
    vector = b.convert(vector, b.i64)
    total = b.constant([1], [], b.i64)
    for index in range(length):
        total = b.binary("stablehlo.multiply", total, b.element_at(vector, index))
    return total

