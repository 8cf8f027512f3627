"""What passes/complex_as_real_pairs.py does op by op: the real and imaginary
parts of each complex op's result, built from its operands' parts.

A part while it is built is a node, a Python number or None (zero), so that a
real operand or a real number adds no multiply by zero to the graph. Where a
textbook formula overflows before eager's kernel does, the rule follows
eager's: division scales by the divisor's larger part (Smith's method, as
``c10::complex`` and NumPy), and the magnitude (``abs``, ``log``, norms)
divides by the larger part before it squares.
"""

from __future__ import annotations

import numbers
from typing import TYPE_CHECKING, Any, Callable, Optional, Union

import torch
import torch.fx

from tpu_inductor.passes.rewrite import GraphBuilder

if TYPE_CHECKING:
    from tpu_inductor.passes.complex_as_real_pairs import Rewrite

aten = torch.ops.aten
prims = torch.ops.prims

Part = Union[torch.fx.Node, numbers.Number, None]
"""One part of a complex value while it is built: a node, a Python number, or None for zero."""
Parts = Optional[tuple[Part, Part]]
"""A rule's result: the two parts, or None to leave the op as it is."""

REAL_DTYPE = {torch.complex32: torch.float16, torch.complex64: torch.float32, torch.complex128: torch.float64}

VIEWS = frozenset({
    aten.view.default, aten._unsafe_view.default, aten.reshape.default, aten.unsqueeze.default,
    aten.squeeze.default, aten.squeeze.dim, aten.squeeze.dims, aten.permute.default, aten.transpose.int,
    aten.t.default, aten.expand.default, aten.slice.Tensor, aten.select.int, aten.alias.default,
    aten.detach.default, prims.squeeze.default,
})
"""Views whose first argument is the tensor: the same call on each part."""

PARTWISE = frozenset({
    aten.clone.default, aten.lift_fresh_copy.default, aten.index.Tensor, aten.index_select.default,
    aten.gather.default, aten.flip.default, aten.roll.default, aten.repeat.default, aten.cumsum.default,
    aten.mean.dim, aten.mean.default, aten.sum.dim_IntList, aten.sum.default,
})
"""Copies, gathers and linear reductions of the first argument: the same call
on each part (any ``dtype`` argument is the complex result's, so it is dropped)."""

SPLITS = frozenset({aten.split.Tensor, aten.split_with_sizes.default, aten.unbind.int})
"""Ops that return a list of views of the first argument: the same call on each
part, and each item's parts are the items of the two lists."""


def _node(x: Part) -> bool:
    return isinstance(x, torch.fx.Node)


def mul(build: GraphBuilder, x: Part, y: Part, product: Any = aten.mul.Tensor) -> Part:
    """``x * y``, or ``product(x, y)`` (a matmul): only elementwise products fold numbers."""
    if x is None or y is None:
        return None
    if product is aten.mul.Tensor:
        if not _node(x):
            x, y = y, x
        if not _node(x):
            return x * y
        if not _node(y) and y == 1:
            return x
    return build.call(product, x, y)


def add(build: GraphBuilder, x: Part, y: Part) -> Part:
    if x is None or (not _node(x) and x == 0 and _node(y)):
        return y
    if y is None or (not _node(y) and y == 0):
        return x
    if not _node(x) and not _node(y):
        return x + y
    if not _node(x):
        x, y = y, x
    return build.call(aten.add.Tensor, x, y)


def neg(build: GraphBuilder, x: Part) -> Part:
    if not _node(x):
        return None if x is None else -x
    return build.call(aten.neg.default, x)


def sub(build: GraphBuilder, x: Part, y: Part) -> Part:
    if _node(x) and _node(y):
        return build.call(aten.sub.Tensor, x, y)
    return add(build, x, neg(build, y))


def tensor(build: GraphBuilder, x: Part, like: torch.fx.Node) -> torch.fx.Node:
    """``x`` as a node: a number or zero filled to ``like``'s shape."""
    if _node(x):
        return x
    return build.call(aten.full_like.default, like, x or 0)


def magnitude(build: GraphBuilder, real: torch.fx.Node, imaginary: torch.fx.Node) -> torch.fx.Node:
    """``|real + imaginary i|`` without squaring a large part: ``m * sqrt(1 + (n/m)^2)``
    for the larger ``m`` and smaller ``n`` of the two, 0 where both are 0, inf
    where either is infinite (as ``hypot``, even beside a NaN)."""
    absolute = [build.call(aten.abs.default, part) for part in (real, imaginary)]
    larger = build.call(aten.maximum.default, *absolute)
    smaller = build.call(aten.minimum.default, *absolute)
    ratio = build.call(aten.div.Tensor, smaller, larger)
    scaled = build.call(aten.mul.Tensor, larger, build.call(aten.sqrt.default, add(build, mul(build, ratio, ratio), 1)))
    zero = build.call(aten.eq.Scalar, larger, 0)
    finite = build.call(aten.where.self, zero, build.call(aten.zeros_like.default, larger), scaled)
    infinite = build.call(aten.logical_or.default, *(build.call(aten.isinf.default, part) for part in absolute))
    return build.call(aten.where.self, infinite, build.call(aten.full_like.default, larger, float("inf")), finite)


def divide(build: GraphBuilder, numerator: tuple[Part, Part], divisor: tuple[Part, Part]) -> Parts:
    a, b = numerator
    c, d = divisor
    if d is None:  # a real divisor
        return _quotient(build, a, c), _quotient(build, b, c)
    if not _node(c) and not _node(d):  # a complex number: multiply by its reciprocal
        inverse = 1 / complex(c or 0, d)
        return (
            sub(build, mul(build, a, inverse.real), mul(build, b, inverse.imag)),
            add(build, mul(build, a, inverse.imag), mul(build, b, inverse.real)),
        )
    c, d = tensor(build, c, d), tensor(build, d, c)
    # Smith's method: the ratio of the smaller part of the divisor to the
    # larger, so that nothing squares (c^2 + d^2 overflows float32 from 1.8e19).
    c_larger = build.call(aten.ge.Tensor, build.call(aten.abs.default, c), build.call(aten.abs.default, d))
    ratio = build.call(
        aten.where.self, c_larger, build.call(aten.div.Tensor, d, c), build.call(aten.div.Tensor, c, d)
    )
    denominator = build.call(
        aten.where.self, c_larger, add(build, c, mul(build, d, ratio)), add(build, d, mul(build, c, ratio))
    )
    scale = build.call(aten.reciprocal.default, denominator)

    def branch(when_c_larger: Part, otherwise: Part) -> torch.fx.Node:
        chosen = build.call(
            aten.where.self, c_larger, tensor(build, when_c_larger, ratio), tensor(build, otherwise, ratio)
        )
        return build.call(aten.mul.Tensor, chosen, scale)

    return (
        branch(add(build, a, mul(build, b, ratio)), add(build, mul(build, a, ratio), b)),
        branch(sub(build, b, mul(build, a, ratio)), sub(build, mul(build, b, ratio), a)),
    )


def _quotient(build: GraphBuilder, x: Part, y: Part) -> Part:
    if x is None:
        return None
    if not _node(x) and not _node(y):
        return x / y
    if not _node(x):  # a number over a tensor
        return mul(build, build.call(aten.reciprocal.default, y), x)
    return build.call(aten.div.Tensor, x, y)


# -- ops with a complex result --------------------------------------------------------------


def _alpha(node: torch.fx.Node) -> Any:
    return node.kwargs.get("alpha", node.args[2] if len(node.args) > 2 else 1)


def _product(rewrite: "Rewrite", build: GraphBuilder, node: torch.fx.Node) -> Parts:
    """(a + bi)(c + di) = (ac - bd) + (ad + bc)i, elementwise or as matmuls."""
    (a, b), (c, d) = (rewrite.operand(build, arg) for arg in node.args[:2])
    product = aten.mul.Tensor if node.target in (aten.mul.Tensor, aten.mul.Scalar) else node.target
    return (
        sub(build, mul(build, a, c, product), mul(build, b, d, product)),
        add(build, mul(build, a, d, product), mul(build, b, c, product)),
    )


def _addition(rewrite: "Rewrite", build: GraphBuilder, node: torch.fx.Node, sign: int = 1) -> Parts:
    (a, b), (c, d) = (rewrite.operand(build, arg) for arg in node.args[:2])
    alpha_real, alpha_imaginary = rewrite.operand(build, _alpha(node))
    c, d = (
        sub(build, mul(build, c, alpha_real), mul(build, d, alpha_imaginary)),
        add(build, mul(build, c, alpha_imaginary), mul(build, d, alpha_real)),
    )
    if sign < 0:
        c, d = neg(build, c), neg(build, d)
    return add(build, a, c), add(build, b, d)


def _difference(rewrite: "Rewrite", build: GraphBuilder, node: torch.fx.Node) -> Parts:
    return _addition(rewrite, build, node, sign=-1)


def _quotient_parts(rewrite: "Rewrite", build: GraphBuilder, node: torch.fx.Node) -> Parts:
    if len(node.args) > 2 or node.kwargs:
        return None  # a rounding mode: not defined for complex numbers
    return divide(build, *(rewrite.operand(build, arg) for arg in node.args[:2]))


def _reciprocal(rewrite: "Rewrite", build: GraphBuilder, node: torch.fx.Node) -> Parts:
    return divide(build, (1, None), rewrite.operand(build, node.args[0]))


def _square(rewrite: "Rewrite", build: GraphBuilder, node: torch.fx.Node) -> Parts:
    """``z ** 2`` as ``z * z`` (other powers are left as they are)."""
    if node.args[1] != 2:
        return None
    a, b = rewrite.operand(build, node.args[0])
    return sub(build, mul(build, a, a), mul(build, b, b)), mul(build, mul(build, a, b), 2)


def _negation(rewrite: "Rewrite", build: GraphBuilder, node: torch.fx.Node) -> Parts:
    a, b = rewrite.operand(build, node.args[0])
    return neg(build, a), neg(build, b)


def _conjugate(rewrite: "Rewrite", build: GraphBuilder, node: torch.fx.Node) -> Parts:
    a, b = rewrite.operand(build, node.args[0])
    return a, neg(build, b)


def _partwise(rewrite: "Rewrite", build: GraphBuilder, node: torch.fx.Node) -> Parts:
    kwargs = {k: v for k, v in node.kwargs.items() if k != "dtype"}
    a, b = rewrite.operand(build, node.args[0])
    return tuple(build.call(node.target, part, *node.args[1:], **kwargs) for part in (a, tensor(build, b, a)))


def _writing(source_at: int) -> Callable[["Rewrite", GraphBuilder, torch.fx.Node], Parts]:
    """Ops that write a source tensor (argument ``source_at``) into the first
    at given places (``index_put``, scatters, ``slice_scatter``): linear in
    both, so each part is written into the same part."""

    def rule(rewrite: "Rewrite", build: GraphBuilder, node: torch.fx.Node) -> Parts:
        if any(isinstance(value, complex) for value in [*node.args, *node.kwargs.values()]):
            return None  # a complex alpha mixes the parts
        a, b = rewrite.operand(build, node.args[0])
        c, d = rewrite.operand(build, node.args[source_at])
        before, after = node.args[1:source_at], node.args[source_at + 1:]
        return tuple(
            build.call(node.target, tensor(build, x, a), *before, tensor(build, v, c), *after, **node.kwargs)
            for x, v in ((a, c), (b, d))
        )

    return rule


def _pad(rewrite: "Rewrite", build: GraphBuilder, node: torch.fx.Node) -> Parts:
    a, b = rewrite.operand(build, node.args[0])
    value = complex(node.kwargs.get("value", node.args[2] if len(node.args) > 2 else 0))
    return tuple(
        build.call(aten.constant_pad_nd.default, part, node.args[1], fill)
        for part, fill in ((a, value.real), (tensor(build, b, a), value.imag))
    )


def _polar(rewrite: "Rewrite", build: GraphBuilder, node: torch.fx.Node) -> Parts:
    length, angle = node.args[:2]
    cos, sin = build.call(aten.cos.default, angle), build.call(aten.sin.default, angle)
    return mul(build, length, cos), mul(build, length, sin)


def _from_parts(rewrite: "Rewrite", build: GraphBuilder, node: torch.fx.Node) -> Parts:
    return node.args[0], node.args[1]


def _exp(rewrite: "Rewrite", build: GraphBuilder, node: torch.fx.Node) -> Parts:
    a, b = rewrite.operand(build, node.args[0])
    scale = build.call(aten.exp.default, a)
    if b is None:
        return scale, None
    return mul(build, scale, build.call(aten.cos.default, b)), mul(build, scale, build.call(aten.sin.default, b))


def _log(rewrite: "Rewrite", build: GraphBuilder, node: torch.fx.Node) -> Parts:
    a, b = rewrite.operand(build, node.args[0])
    b = tensor(build, b, a)
    return build.call(aten.log.default, magnitude(build, a, b)), build.call(aten.atan2.default, b, a)


def _moves_device(node: torch.fx.Node) -> bool:
    """Whether the cast ``node`` also moves its input to another device (left as it is)."""
    device = node.kwargs.get("device")
    return device is not None and torch.device(device) != node.args[0].meta["val"].device


def _cast(rewrite: "Rewrite", build: GraphBuilder, node: torch.fx.Node) -> Parts:
    if _moves_device(node):
        return None
    return rewrite.operand(build, node.args[0])  # the pass casts each part to the result's real dtype


def _fill(rewrite: "Rewrite", build: GraphBuilder, node: torch.fx.Node) -> Parts:
    """``full`` and ``full_like`` of a complex dtype: each part filled with its part of the value."""
    value = complex(node.args[1])
    kwargs = {**node.kwargs, "dtype": REAL_DTYPE[node.meta["val"].dtype]}
    like = node.args[0]
    if node.target is aten.full_like.default and isinstance(like, torch.fx.Node) and like.meta["val"].is_complex():
        like = rewrite.pair_of(build, like)[0]
    return tuple(build.call(node.target, like, fill, **kwargs) for fill in (value.real, value.imag))


def _where(rewrite: "Rewrite", build: GraphBuilder, node: torch.fx.Node) -> Parts:
    condition = node.args[0]
    (a, b), (c, d) = (rewrite.operand(build, arg) for arg in node.args[1:3])
    zero = build.call(aten.zeros_like.default, condition, dtype=REAL_DTYPE[node.meta["val"].dtype])
    return tuple(
        build.call(aten.where.self, condition, tensor(build, x, zero), tensor(build, y, zero))
        for x, y in ((a, c), (b, d))
    )


def _concatenation(rewrite: "Rewrite", build: GraphBuilder, node: torch.fx.Node) -> Parts:
    operands = [rewrite.operand(build, arg) for arg in node.args[0]]
    return tuple(
        build.call(aten.cat.default, [tensor(build, pair[index], pair[0]) for pair in operands], *node.args[1:])
        for index in (0, 1)
    )


COMPLEX_RESULTS: dict[Any, Callable[["Rewrite", GraphBuilder, torch.fx.Node], Parts]] = {
    aten.mul.Tensor: _product,
    aten.mul.Scalar: _product,
    aten.mm.default: _product,
    aten.bmm.default: _product,
    aten.add.Tensor: _addition,
    aten.add.Scalar: _addition,
    aten.sub.Tensor: _difference,
    aten.sub.Scalar: _difference,
    aten.div.Tensor: _quotient_parts,
    aten.div.Scalar: _quotient_parts,
    aten.reciprocal.default: _reciprocal,
    aten.neg.default: _negation,
    aten.conj_physical.default: _conjugate,
    aten._conj_physical.default: _conjugate,
    aten.pow.Tensor_Scalar: _square,
    prims.conj_physical.default: _conjugate,
    aten._to_copy.default: _cast,
    prims.convert_element_type.default: _cast,
    aten.full.default: _fill,
    aten.full_like.default: _fill,
    aten.constant_pad_nd.default: _pad,
    aten.index_put.default: _writing(2),
    aten._unsafe_index_put.default: _writing(2),
    aten.index_copy.default: _writing(3),
    aten.index_add.default: _writing(3),
    aten.scatter.src: _writing(3),
    aten.scatter_add.default: _writing(3),
    aten.slice_scatter.default: _writing(1),
    aten.select_scatter.default: _writing(1),
    aten.polar.default: _polar,
    aten.complex.default: _from_parts,
    aten.exp.default: _exp,
    aten.log.default: _log,
    aten.where.self: _where,
    aten.cat.default: _concatenation,
    **{op: _partwise for op in PARTWISE},
}


# -- ops on a complex tensor with a real result ---------------------------------------------


def _norm(rewrite: "Rewrite", build: GraphBuilder, node: torch.fx.Node) -> Optional[torch.fx.Node]:
    if node.kwargs.get("dtype") is not None:
        return None
    lengths = magnitude(build, *rewrite.pair_of(build, node.args[0]))
    return build.call(node.target, lengths, *node.args[1:], **node.kwargs)


def _real_cast(rewrite: "Rewrite", build: GraphBuilder, node: torch.fx.Node) -> Optional[torch.fx.Node]:
    """A cast to a real dtype keeps the real part, as eager does (with a
    warning); to ``bool``, whether either part is nonzero."""
    dtype = node.meta["val"].dtype
    if _moves_device(node):
        return None
    real, imaginary = rewrite.pair_of(build, node.args[0])
    if dtype == torch.bool:
        nonzero = [build.call(aten.ne.Scalar, part, 0) for part in (real, imaginary)]
        return build.call(aten.logical_or.default, *nonzero)
    return build.call(aten._to_copy.default, real, dtype=dtype)


def _parts_of_first(
    read: Callable[[GraphBuilder, torch.fx.Node, torch.fx.Node], torch.fx.Node],
) -> Callable[["Rewrite", GraphBuilder, torch.fx.Node], torch.fx.Node]:
    return lambda rewrite, build, node: read(build, *rewrite.pair_of(build, node.args[0]))


REAL_RESULTS: dict[Any, Callable[["Rewrite", GraphBuilder, torch.fx.Node], Optional[torch.fx.Node]]] = {
    aten.view_as_real.default: _parts_of_first(lambda build, re, im: build.call(aten.stack.default, [re, im], -1)),
    aten.real.default: _parts_of_first(lambda build, re, im: re),
    aten.imag.default: _parts_of_first(lambda build, re, im: im),
    aten.abs.default: _parts_of_first(magnitude),
    aten.angle.default: _parts_of_first(lambda build, re, im: build.call(aten.atan2.default, im, re)),
    aten.linalg_vector_norm.default: _norm,
    aten._to_copy.default: _real_cast,
    prims.convert_element_type.default: _real_cast,
}
