"""Complex arithmetic as arithmetic on real and imaginary parts.

Why: torch-mlir lowers no complex dtype, so every op on a complex tensor ran
in eager PyTorch and split the graph around it. Rotary position embeddings
are written that way in Meta's Llama reference code, torchtitan and
transformers' Llama 4 (``view_as_complex``, a complex multiply,
``view_as_real``): eager ops in every attention layer, forward and backward,
each one an island boundary. A complex op is a few real ops on the two
parts, which every device runs and XLA fuses with their neighbours.

Before: ``%c = view_as_complex(%x)``; ``%p = mul(%c, %f)``; ``%y = view_as_real(%p)``
After:  ``%xr, %xi = select(%x, -1, 0), select(%x, -1, 1)``; ``%fr, %fi`` likewise
        from ``view_as_real(%f)``; ``%y = stack([%xr*%fr - %xi*%fi, %xr*%fi + %xi*%fr], -1)``

Each part has the complex tensor's shape, so a view of a complex tensor is
the same view of each part. A complex value from outside the rewrite (a
graph input, the result of an op this pass does not know, such as an FFT)
enters as ``view_as_real``; one that leaves (a graph output, such an op's
input) as ``view_as_complex`` of the stacked parts. Those two, and the views
of complex tensors left in the graph, cost no copy: they run eagerly at the
islands' edges as bookkeeping (:data:`CROSSING`, read by placement), not as
fallbacks. Ops it does not know still run eagerly, reported as before. The
rules op by op are in passes/complex_parts.py.
"""

from __future__ import annotations

import operator
from typing import Any

import torch
import torch.fx
from torch.fx.experimental.symbolic_shapes import statically_known_true

from tpu_inductor.passes.complex_parts import (
    COMPLEX_RESULTS,
    REAL_DTYPE,
    REAL_RESULTS,
    SPLITS,
    VIEWS,
    Part,
    add,
    tensor,
)
from tpu_inductor.passes.rewrite import GraphBuilder

aten = torch.ops.aten

CROSSING = "tpu_inductor_complex_crossing"
"""Node metadata: a view that carries a complex tensor to or from its real parts."""

Pair = tuple[torch.fx.Node, torch.fx.Node]

LAZY = VIEWS | {aten._conj.default}
"""Views of a complex tensor: given parts only when a rewritten op reads
them; left for any other reader, they copy nothing."""


def complex_as_real_pairs(gm: torch.fx.GraphModule) -> torch.fx.GraphModule:
    if not any(_is_complex(node) for node in gm.graph.nodes):
        return gm
    rewrite = Rewrite(gm.graph)
    for node in list(gm.graph.nodes):
        if node.op == "call_function":
            rewrite.visit(node)
    rewrite.finish()
    gm.recompile()
    return gm


def _is_complex(arg: Any) -> bool:
    value = arg.meta.get("val") if isinstance(arg, torch.fx.Node) else None
    return isinstance(value, torch.Tensor) and value.dtype.is_complex


def _value(node: torch.fx.Node) -> torch.Tensor:
    return node.meta["val"]


class Rewrite:
    """The pairs made so far, and the complex nodes they replace."""

    def __init__(self, graph: torch.fx.Graph) -> None:
        self.graph = graph
        self.pairs: dict[torch.fx.Node, Pair] = {}
        self.replaced: list[torch.fx.Node] = []
        self.split_parts: dict[torch.fx.Node, Pair] = {}
        """A split of a complex tensor -> the same split of its real and of its imaginary part."""

    def visit(self, node: torch.fx.Node) -> None:
        with self.graph.inserting_before(node):
            build = GraphBuilder(self.graph, node)
            if _is_complex(node) and node.target in COMPLEX_RESULTS:
                parts = COMPLEX_RESULTS[node.target](self, build, node)
                if parts is not None and any(isinstance(part, torch.fx.Node) for part in parts):
                    self.pairs[node] = self._finish(build, parts, _value(node))
                    self.replaced.append(node)
            elif node.target in SPLITS and _is_complex(node.args[0]):
                parts = self.pair_of(build, node.args[0])
                self.split_parts[node] = tuple(build.call(node.target, p, *node.args[1:], **node.kwargs) for p in parts)
            elif node.target is operator.getitem and node.args[0] in self.split_parts:
                self.pairs[node] = tuple(
                    build.call(operator.getitem, items, node.args[1]) for items in self.split_parts[node.args[0]]
                )
                self.replaced.append(node)
            elif node.args and _is_complex(node.args[0]) and node.target in REAL_RESULTS:
                if node.target is aten.view_as_real.default and not self._pairs_known(node.args[0]):
                    _crossing(node)  # a complex value from outside, read as it is
                    return
                result = REAL_RESULTS[node.target](self, build, node)
                if result is not None:
                    build.replace_anchor(result)

    def finish(self) -> None:
        """Complex values the rewrite replaced go on to their remaining readers
        through ``view_as_complex``; views of complex tensors left in the graph
        are marked as crossings too (they copy nothing)."""
        for node in self.replaced:
            if node.users:
                with self.graph.inserting_before(node):
                    build = GraphBuilder(self.graph, node)
                    stacked = build.call(aten.stack.default, list(self.pairs[node]), -1)
                    build.replace_anchor(_crossing(build.call(aten.view_as_complex.default, stacked)))
            else:
                self.graph.erase_node(node)
        for node in self.graph.nodes:
            if _is_complex(node) and node.target in (*LAZY, aten.view_as_complex.default):
                node.meta[CROSSING] = True

    def _pairs_known(self, node: torch.fx.Node) -> bool:
        """Whether ``node``'s parts come without a crossing: it was replaced, or
        it is a view of such a value, or it is made from a real tensor."""
        while node not in self.pairs and node.op == "call_function" and node.target in LAZY:
            node = node.args[0]
        return node in self.pairs or node.target is aten.view_as_complex.default

    def pair_of(self, build: GraphBuilder, node: torch.fx.Node) -> Pair:
        """The real and imaginary parts of the complex ``node``, made before ``build``'s anchor."""
        if node in self.pairs:
            return self.pairs[node]
        if node.op == "call_function" and node.target in VIEWS:
            source = self.pair_of(build, node.args[0])
            pair = tuple(build.call(node.target, part, *node.args[1:], **node.kwargs) for part in source)
        elif node.target is aten._conj.default:  # a view too: conjugation is a flag on the tensor
            real, imaginary = self.pair_of(build, node.args[0])
            pair = real, build.call(aten.neg.default, imaginary)
        elif node.target is aten.view_as_complex.default:
            pair = _split(build, node.args[0])
        else:
            resolved = node
            if _value(node).is_conj():
                # view_as_real refuses a tensor flagged conjugated (AOTAutograd
                # saves the forward's _conj view for the backward): resolved, the
                # values are the same, in a tensor of their own.
                resolved = _crossing(build.call(aten.resolve_conj.default, node))
            pair = _split(build, _crossing(build.call(aten.view_as_real.default, resolved)))
        self.pairs[node] = pair
        return pair

    def operand(self, build: GraphBuilder, arg: Any) -> tuple[Part, Part]:
        """An argument of a complex op as (real, imaginary): a complex node's
        parts, a real tensor with no imaginary part, or a number's parts."""
        if isinstance(arg, torch.fx.Node):
            return self.pair_of(build, arg) if _is_complex(arg) else (arg, None)
        if isinstance(arg, complex):
            return arg.real, arg.imag
        return arg, None

    def _finish(self, build: GraphBuilder, parts: tuple[Part, Part], result: torch.Tensor) -> Pair:
        """Two nodes of ``result``'s shape and real dtype from ``parts``."""
        real, imaginary = parts
        real = tensor(build, real, imaginary)  # a number or zero: the rule made the other part a node
        imaginary = tensor(build, imaginary, real)
        # A part that broadcasting left smaller (the imaginary part of c + t,
        # with t larger than c) takes the other's shape.
        if not _same_shape(_value(real), result):
            real = add(build, real, build.call(aten.zeros_like.default, imaginary))
        if not _same_shape(_value(imaginary), result):
            imaginary = add(build, imaginary, build.call(aten.zeros_like.default, real))
        dtype = REAL_DTYPE[result.dtype]
        return tuple(
            part if _value(part).dtype == dtype else build.call(aten._to_copy.default, part, dtype=dtype)
            for part in (real, imaginary)
        )


def _same_shape(value: torch.Tensor, like: torch.Tensor) -> bool:
    return value.dim() == like.dim() and all(statically_known_true(a == b) for a, b in zip(value.shape, like.shape))


def _crossing(node: torch.fx.Node) -> torch.fx.Node:
    node.meta[CROSSING] = True
    return node


def _split(build: GraphBuilder, pairs_last: torch.fx.Node) -> Pair:
    """A real tensor whose last dim holds (real, imaginary), as its two parts."""
    return build.call(aten.select.int, pairs_last, -1, 0), build.call(aten.select.int, pairs_last, -1, 1)


