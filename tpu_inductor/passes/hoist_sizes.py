"""Read symbolic sizes from the graph's inputs, not from intermediate tensors.

Why: tracing records ``sym_size(t, d)`` on whatever tensor a size was read
from, often one computed inside what will be a device island. The
partitioner must then hand that tensor out of the island just so the host
can read its size, which splits one island into many (five islands per
decoder layer for a transformer with a dynamic sequence length). Every such
size is a function of the input symbols, so it is re-read from an input.

Before: ``n = sym_size(softmax_out, 2); y = view(z, [8, n, n])``;
after: ``s0 = sym_size(tokens, 1); y = view(z, [8, s0, s0])``.
"""

from __future__ import annotations

import operator
from typing import Optional

import sympy
import torch
import torch.fx

from tpu_inductor.dynamic import SYMBOLIC_TYPES
from tpu_inductor.analysis.padding_safety import expr_of

aten = torch.ops.aten


def hoist_sizes(gm: torch.fx.GraphModule) -> torch.fx.GraphModule:
    graph = gm.graph
    placeholders = list(graph.find_nodes(op="placeholder"))
    if not placeholders:
        return gm
    # Where each symbol can be read: a SymInt input, or a dim of a tensor input.
    readers: dict[sympy.Symbol, tuple[torch.fx.Node, Optional[int]]] = {}
    for node in placeholders:
        val = node.meta.get("val")
        if isinstance(val, SYMBOLIC_TYPES) and isinstance(expr_of(val), sympy.Symbol):
            readers.setdefault(expr_of(val), (node, None))
    for node in placeholders:
        val = node.meta.get("val")
        if isinstance(val, torch.Tensor):
            for dim, size in enumerate(val.shape):
                expr = expr_of(size)
                if isinstance(expr, sympy.Symbol):
                    readers.setdefault(expr, (node, dim))
    made: dict[sympy.Symbol, torch.fx.Node] = {}
    anchor = [placeholders[-1]]

    def read(symbol: sympy.Symbol) -> Optional[torch.fx.Node]:
        if symbol in made:
            return made[symbol]
        if symbol not in readers:
            return None
        source, dim = readers[symbol]
        if dim is None:
            made[symbol] = source
            return source
        with graph.inserting_after(anchor[0]):
            node = graph.call_function(aten.sym_size.int, (source, dim))
        node.meta["val"] = source.meta["val"].shape[dim]
        anchor[0] = node
        made[symbol] = node
        return node

    changed = False
    for node in list(graph.find_nodes(op="call_function", target=aten.sym_size.int)):
        if node.args[0].op == "placeholder" or node in made.values():
            continue
        replacement = _build(expr_of(node.meta["val"]), read, graph, node)
        if replacement is None:
            continue
        node.replace_all_uses_with(replacement)
        graph.erase_node(node)
        changed = True
    if changed:
        graph.lint()
        gm.recompile()
    return gm


def _build(expr: sympy.Expr, read, graph: torch.fx.Graph, before: torch.fx.Node):
    """``expr`` as host arithmetic on input sizes (None when it is not a sum/product)."""
    if isinstance(expr, sympy.Integer):
        return int(expr)
    if isinstance(expr, sympy.Symbol):
        return read(expr)
    if isinstance(expr, (sympy.Mul, sympy.Add)):
        combine = operator.mul if isinstance(expr, sympy.Mul) else operator.add
        parts = [_build(arg, read, graph, before) for arg in expr.args]
        if any(p is None for p in parts):
            return None
        result = parts[0]
        for part in parts[1:]:
            with graph.inserting_before(before):
                node = graph.call_function(combine, (result, part))
            # SymInt arithmetic on the inputs' sizes: builds the expression, adds no guard.
            node.meta["val"] = combine(_value(result), _value(part))
            result = node
        return result
    return None


def _value(part):
    return part.meta["val"] if isinstance(part, torch.fx.Node) else part
