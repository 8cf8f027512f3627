"""Real (unpadded) sizes as run-time inputs of a padded graph.

Why: one executable serves every size in its bucket, so a rewrite that must
know where the real positions end (attention masking padded keys, a KV
cache appended at the real end, the last real token) cannot read it from a
shape: the shapes are the bucket's. It reads it from a 0-d int64 input
appended to the graph, ``valid_<size>``, which the dynamic-shape runtime
fills with the size's value at the call's real sizes
(``DynamicShapeGraph.__call__``, through ``dynamic/size_functions.py``).

One :class:`RealLengths` per graph makes each size's input once, in order,
shared by every rewrite that needs it.
"""

from __future__ import annotations

import re
from typing import Any

import sympy
import torch
import torch.fx

VALID_LENGTH_PREFIX = "valid_"


class RealLengths:
    """The graph's ``valid_<size>`` inputs, one per size expression."""

    def __init__(self, gm: torch.fx.GraphModule) -> None:
        self.gm = gm
        self._inputs: dict[sympy.Expr, torch.fx.Node] = {}
        self._shape_env = None

    @property
    def exprs(self) -> list[sympy.Expr]:
        """The sizes whose real values the graph takes, in input order, in
        the symbols the graph's inputs carry now (tracing a rewrite can
        teach the shape environment that two symbols are one, e.g. a KV
        cache's key and value lengths)."""
        env = self._shape_env
        return [sympy.expand(env.replace(e)) if env is not None else e for e in self._inputs]

    def node(self, size: sympy.Expr, like: torch.Tensor) -> torch.fx.Node:
        """The input holding ``size``'s real value (made on first use)."""
        size = sympy.expand(size)
        if size in self._inputs:
            return self._inputs[size]
        graph = self.gm.graph
        last = list(self._inputs.values())[-1] if self._inputs else list(graph.find_nodes(op="placeholder"))[-1]
        with graph.inserting_after(last):
            node = graph.placeholder(VALID_LENGTH_PREFIX + re.sub(r"\W+", "_", str(size)).strip("_"))
        self._shape_env = self._shape_env or like.fake_mode.shape_env
        with like.fake_mode:
            node.meta["val"] = torch.empty((), dtype=torch.int64, device=like.device)
        self._inputs[size] = node
        return node


def is_extent(expr: Any) -> bool:
    """A size that grows with each symbol, as an extent whose real positions
    can be a prefix of the padded ones: symbols with positive integer
    coefficients plus any integer (``s0``, ``s0 + 1``, ``s0 + s1``,
    ``s0 - 1``), e.g. a KV cache after appending a token."""
    if not isinstance(expr, sympy.Expr) or not expr.free_symbols:
        return False
    symbols = sorted(expr.free_symbols, key=str)
    try:
        poly = sympy.Poly(expr, *symbols)
    except sympy.PolynomialError:
        return False
    if poly.total_degree() != 1:
        return False
    return all(c.is_Integer for c in poly.coeffs()) and all(poly.coeff_monomial(s) > 0 for s in symbols)
