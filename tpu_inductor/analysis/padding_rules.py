"""The per-op rules of the padding analysis (analysis/padding_safety.py).

Why its own module: the analysis walks the graph and tracks each tensor's
dims as factors; what each op does to those factors, and which symbols it
makes unsafe to pad, is one rule per op (:data:`RULES`, filled by
:func:`rule`). An op without a rule is never assumed safe. The rules of
ops that address positions (slices, cat, gathers, scatters, attention) are
in analysis/padding_rules_positions.py.
"""

from __future__ import annotations

from typing import Any, Callable, Optional, Sequence

import sympy
import torch
import torch.fx

from tpu_inductor.analysis.padding_safety import _ONE, Dim, Layout, _Analyzer, expr_of
from tpu_inductor.analysis.padding_safety import _arg, _equal, _free, _norm, _sym_syms  # dim helpers
from tpu_inductor.passes.padded_positions import counted_from

aten = torch.ops.aten
prims = torch.ops.prims

_SAME_LAYOUT = frozenset(
    {
        aten.clone.default,
        aten.alias.default,
        aten.detach.default,
        aten._to_copy.default,
        aten.lift_fresh_copy.default,
        aten.contiguous.default,
        aten.zeros_like.default,
        aten.ones_like.default,
        aten.empty_like.default,
        aten.full_like.default,
        aten.fill.Scalar,
    }
)
_VIEWS = frozenset({aten.view.default, aten._unsafe_view.default, aten.reshape.default})
# Output aliases the input (for "a graph output is a view of an input").

# Reductions: (dim argument name, keepdim argument name); dim None/[] = all.
_REDUCTIONS: dict[Any, tuple[Optional[str], Optional[str]]] = {
    aten.sum.dim_IntList: ("dim", "keepdim"),
    aten.mean.dim: ("dim", "keepdim"),
    aten.amax.default: ("dim", "keepdim"),
    aten.amin.default: ("dim", "keepdim"),
    aten.var.correction: ("dim", "keepdim"),
    aten.var_mean.correction: ("dim", "keepdim"),
    aten.std.correction: ("dim", "keepdim"),
    aten.prod.dim_int: ("dim", "keepdim"),
    aten.logsumexp.default: ("dim", "keepdim"),
    aten.any.dim: ("dim", "keepdim"),
    aten.any.dims: ("dim", "keepdim"),
    aten.all.dim: ("dim", "keepdim"),
    aten.all.dims: ("dim", "keepdim"),
    aten.argmax.default: ("dim", "keepdim"),
    aten.argmin.default: ("dim", "keepdim"),
    aten.max.dim: ("dim", "keepdim"),
    aten.min.dim: ("dim", "keepdim"),
    aten.sum.default: (None, None),
    aten.mean.default: (None, None),
    aten.max.default: (None, None),
    aten.min.default: (None, None),
    aten.any.default: (None, None),
    aten.all.default: (None, None),
    aten.prod.default: (None, None),
}
# Ops that keep the layout but mix positions along one dim (or a list of dims):
# op -> (argument name, its position, default, what it does to the dim).
_MIXES_ALONG: dict[Any, tuple[str, Optional[int], Any, str]] = {
    aten._softmax.default: ("dim", 1, -1, "normalises over it"),
    aten._log_softmax.default: ("dim", 1, -1, "normalises over it"),
    aten.softmax.int: ("dim", 1, -1, "normalises over it"),
    aten.log_softmax.int: ("dim", 1, -1, "normalises over it"),
    aten._safe_softmax.default: ("dim", 1, -1, "normalises over it"),
    aten._softmax_backward_data.default: ("dim", 2, -1, "normalises over it"),
    aten._log_softmax_backward_data.default: ("dim", 2, -1, "normalises over it"),
    aten.sort.default: ("dim", 1, -1, "sorts along it"),
    aten.sort.stable: ("dim", None, -1, "sorts along it"),
    aten.argsort.default: ("dim", 1, -1, "sorts along it"),
    aten.argsort.stable: ("dim", None, -1, "sorts along it"),
    aten.flip.default: ("dims", 1, (), "reverses it"),
    aten.roll.default: ("dims", 2, (), "rolls along it"),
}
# Scans: position j reads positions 0..j only, so padding after the real
# positions never reaches them (positions from ``cumsum`` of a padding mask).
_PREFIX_SCANS = frozenset(
    {
        aten.cumsum.default,
        aten.cumprod.default,
        aten.logcumsumexp.default,
        aten.cummax.default,
        aten.cummin.default,
    }
)
# Convolutions and pooling keep batch (and for pooling, channel) positions
# and mix the spatial ones: op -> number of leading dims kept.
_WINDOWED = {
    aten.convolution.default: 1,
    aten.max_pool2d_with_indices.default: 2,
    aten.avg_pool2d.default: 2,
    aten._adaptive_avg_pool2d.default: 2,
    aten.max_pool1d.default: 2,
    aten.avg_pool1d.default: 2,
}
_FACTORIES = {
    aten.full.default: ("size",),
    aten.zeros.default: ("size",),
    aten.ones.default: ("size",),
    aten.empty.memory_format: ("size",),
    aten.empty_strided.default: ("size", "stride"),
    aten.new_zeros.default: ("size",),
    aten.new_ones.default: ("size",),
    aten.new_empty.default: ("size",),
    aten.new_full.default: ("size",),
    aten.new_empty_strided.default: ("size", "stride"),
    aten.scalar_tensor.default: (),
}



# Each rule: (analyzer, node, target) -> the names of the size arguments it reads.
Rule = Callable[[_Analyzer, torch.fx.Node, Any], tuple[str, ...]]

RULES: dict[Any, Rule] = {}
"""Op overload -> its rule; an op with none is never assumed safe to pad."""


def rule(*targets: Any, reads_layout: bool = False) -> Callable[[Rule], Rule]:
    """Register a rule for ``targets`` (one rule per op).

    ``reads_layout``: the rule reads its first input's layout
    (:meth:`_Analyzer.source_layout`); a node whose input has none is left
    as an op without a rule, before the rule runs.
    """

    def register(body: Rule) -> Rule:
        def checked(a: _Analyzer, node: torch.fx.Node, target: Any) -> tuple[str, ...]:
            if reads_layout and a.source_layout(node) is None:
                return ()
            return body(a, node, target)

        for target in targets:
            assert target not in RULES, f"two padding rules for {target}"
            RULES[target] = checked if reads_layout else body
        return body

    return register


@rule(*_SAME_LAYOUT, *_PREFIX_SCANS)
def _rule_same_layout(a: _Analyzer, node: torch.fx.Node, target) -> Optional[tuple[str, ...]]:
    source = a.source_layout(node)
    if source is not None:
        val = node.meta["val"]
        a.layouts[node] = [source for _ in val] if isinstance(val, (list, tuple)) else source
    return ()


@rule(*_VIEWS)
def _rule_view(a: _Analyzer, node: torch.fx.Node, target) -> Optional[tuple[str, ...]]:
    source = a.layout(node.args[0])
    out_shape = [expr_of(s) for s in node.meta["val"].shape]
    regrouped = _regroup(source, out_shape) if source is not None else None
    if regrouped is None:
        a.mark(_free(out_shape) | _sym_syms(tuple(f for d in source or () for f in d)),
               "reshapes it in a way whose positions are not tracked")
        a._set_plain(node)
    else:
        a.layouts[node] = regrouped
    return ("size", "shape")


def _regroup(source: Layout, out_shape: Sequence[sympy.Expr]) -> Optional[Layout]:
    """The factors of ``source`` regrouped into ``out_shape``, if positions line up."""
    factors = [f for dim in source for f in dim if f != 1]
    out: list[Dim] = []
    i = 0
    for size in out_shape:
        if size == 1:
            out.append(_ONE)
            continue
        group: list[sympy.Expr] = []
        product: sympy.Expr = sympy.Integer(1)
        while not _equal(product, size):
            if i >= len(factors):
                return None
            factor = factors[i]
            remaining = size / product  # sympy cancels common factors itself
            if factor.is_Integer and remaining.is_Integer and factor > remaining:
                if factor % remaining:
                    return None
                group.append(remaining)  # split a static factor
                factors[i] = factor / remaining
                product = size
                break
            group.append(factor)
            product = product * factor
            i += 1
        out.append(tuple(group))
    if any(f != 1 for f in factors[i:]):
        return None
    return tuple(out)


@rule(aten.permute.default, aten.t.default, aten.transpose.int, reads_layout=True)
def _rule_permute(a: _Analyzer, node: torch.fx.Node, target) -> Optional[tuple[str, ...]]:
    source = a.source_layout(node)
    rank = len(source)
    if target is aten.permute.default:
        order = [_norm(d, rank) for d in node.args[1]]
    else:
        d0, d1 = (0, 1) if target is aten.t.default else (
            _norm(node.args[1], rank), _norm(node.args[2], rank)
        )
        order = list(range(rank))
        if rank >= 2:
            order[d0], order[d1] = order[d1], order[d0]
    a.layouts[node] = tuple(source[d] for d in order)
    return ()


@rule(
    aten.unsqueeze.default, aten.squeeze.dim, aten.squeeze.dims, aten.squeeze.default, prims.squeeze.default,
    reads_layout=True,
)
def _rule_squeeze(a: _Analyzer, node: torch.fx.Node, target) -> Optional[tuple[str, ...]]:
    source = a.source_layout(node)
    rank = len(source)
    if target is aten.unsqueeze.default:
        d = _norm(node.args[1], rank + 1)
        a.layouts[node] = source[:d] + (_ONE,) + source[d:]
        return ()
    if target is aten.squeeze.default:
        dims = set(range(rank))
    else:
        raw = node.args[1]
        dims = {_norm(d, rank) for d in (raw if isinstance(raw, (list, tuple)) else [raw])}
    a.layouts[node] = tuple(d for i, d in enumerate(source) if not (i in dims and d == _ONE))
    if len(a.layouts[node]) != node.meta["val"].dim():
        a._set_plain(node)
    return ()


@rule(aten.expand.default)
def _rule_expand(a: _Analyzer, node: torch.fx.Node, target) -> Optional[tuple[str, ...]]:
    source = a.source_layout(node)
    out = node.meta["val"].shape
    if source is None:
        return ("size",)
    layout = []
    for k, size in enumerate(out):
        index = k - (len(out) - len(source))
        if index < 0 or (source[index] == _ONE and size != 1):
            layout.append(a.dim_from_size(size, prefix=True))  # broadcast: every position a copy
        else:
            layout.append(source[index])
    a.layouts[node] = tuple(layout)
    return ("size",)


@rule(*_REDUCTIONS, reads_layout=True)
def _rule_reduction(a: _Analyzer, node: torch.fx.Node, target) -> Optional[tuple[str, ...]]:
    source = a.source_layout(node)
    dim_name, keep_name = _REDUCTIONS[target]
    rank = len(source)
    dims = _arg(node, dim_name, 1) if dim_name else None
    if dims is None or dims == []:
        reduced = set(range(rank))
    else:
        reduced = {_norm(d, rank) for d in (dims if isinstance(dims, (list, tuple)) else [dims])}
    keepdim = bool(_arg(node, keep_name, 2, False)) if keep_name else False
    for d in reduced:
        a.mark(_sym_syms(source[d]), "reduces over it")
    kept = tuple(_ONE if i in reduced else d for i, d in enumerate(source) if keepdim or i not in reduced)
    val = node.meta["val"]
    vals = val if isinstance(val, (list, tuple)) else [val]
    layouts = [kept if v.dim() == len(kept) else a._plain(v.shape) for v in vals]
    a.layouts[node] = layouts if isinstance(val, (list, tuple)) else layouts[0]
    return ()


@rule(*_MIXES_ALONG)
def _rule_mixes_along(a: _Analyzer, node: torch.fx.Node, target) -> Optional[tuple[str, ...]]:
    name, index, default, why = _MIXES_ALONG[target]
    source = a.source_layout(node)
    if source is None:
        return ()
    rank = len(source)
    raw = node.kwargs.get(name, node.args[index] if index is not None and index < len(node.args) else default)
    dims = list(raw) if isinstance(raw, (list, tuple)) else [raw]
    if not dims:
        dims = list(range(rank))  # flip/roll without dims act on every dim
    for d in dims:
        a.mark(_sym_syms(source[_norm(d, rank)]), why)
    val = node.meta["val"]
    a.layouts[node] = [source for _ in val] if isinstance(val, (list, tuple)) else source
    return ()


@rule(*_WINDOWED, reads_layout=True)
def _rule_windowed(a: _Analyzer, node: torch.fx.Node, target) -> Optional[tuple[str, ...]]:
    source = a.source_layout(node)
    kept = _WINDOWED[target]
    for dim in source[kept:]:
        a.mark(_sym_syms(dim), "slides a window over it")
    if target is aten.convolution.default:
        weight = a.layout(node.args[1])
        a.mark(_sym_syms(tuple(f for d in weight or () for f in d)), "convolves with a kernel sized by it")
    val = node.meta["val"]
    vals = val if isinstance(val, (list, tuple)) else [val]
    layouts = [source[:kept] + a._plain(v.shape[kept:]) for v in vals]
    a.layouts[node] = layouts if isinstance(val, (list, tuple)) else layouts[0]
    return ()


@rule(aten.native_layer_norm.default, reads_layout=True)
def _rule_layer_norm(a: _Analyzer, node: torch.fx.Node, target) -> Optional[tuple[str, ...]]:
    source = a.source_layout(node)
    n = len(node.args[1])
    for dim in source[len(source) - n:]:
        a.mark(_sym_syms(dim), "normalises over it")
    stats = source[: len(source) - n] + (_ONE,) * n
    a.layouts[node] = [source, stats, stats]
    return ()


@rule(
    aten._native_batch_norm_legit_no_training.default,
    aten._native_batch_norm_legit.default,
    aten.native_batch_norm.default,
    aten._native_batch_norm_legit_functional.default,
    reads_layout=True,
)
def _rule_batch_norm(a: _Analyzer, node: torch.fx.Node, target) -> Optional[tuple[str, ...]]:
    source = a.source_layout(node)
    if target is not aten._native_batch_norm_legit_no_training.default:
        for i, dim in enumerate(source):
            if i != 1:
                a.mark(_sym_syms(dim), "normalises over it (batch statistics)")
    if len(source) > 1:
        a.mark(_sym_syms(source[1]), "has per-channel parameters along it")
    rest = [a._plain(v.shape) if isinstance(v, torch.Tensor) else None for v in node.meta["val"][1:]]
    a.layouts[node] = [source, *rest]
    return ()


@rule(aten.mm.default, aten.addmm.default, aten.bmm.default, aten.baddbmm.default)
def _rule_matmul(a: _Analyzer, node: torch.fx.Node, target) -> Optional[tuple[str, ...]]:
    with_bias = target in (aten.addmm.default, aten.baddbmm.default)
    lhs, rhs = (node.args[1], node.args[2]) if with_bias else (node.args[0], node.args[1])
    left, right = a.layout(lhs), a.layout(rhs)
    if left is None or right is None:
        a._unknown(node)
        return ()
    a.mark(_sym_syms(left[-1]) | _sym_syms(right[-2]), "contracts over it (matmul)")
    batch: tuple = ()
    if len(left) == 3:
        if left[0] != right[0]:
            a.mark(_sym_syms(left[0]) | _sym_syms(right[0]), "pairs differently laid out batches")
        batch = (left[0],)
    a.layouts[node] = batch + (left[-2], right[-1])
    if with_bias:
        a._pointwise(node, [node.args[0], node])
    return ()


@rule(aten.embedding.default)
def _rule_embedding(a: _Analyzer, node: torch.fx.Node, target) -> Optional[tuple[str, ...]]:
    weight, indices = a.layout(node.args[0]), a.layout(node.args[1])
    if weight is None or indices is None:
        a._unknown(node)
        return ()
    a.mark(_sym_syms(weight[0]), "looks rows up in a table sized by it")
    a.layouts[node] = indices + (weight[-1],)
    return ()


@rule(aten.arange.default, aten.arange.start, aten.arange.start_step)
def _rule_arange(a: _Analyzer, node: torch.fx.Node, target) -> Optional[tuple[str, ...]]:
    if target is aten.arange.default:
        start, step = 0, 1
    else:
        start = node.args[0]
        step = node.args[2] if target is aten.arange.start_step and len(node.args) > 2 else 1
    size = node.meta["val"].shape[0]
    if (isinstance(start, int) or counted_from(node) is not None) and step == 1:
        # Position j holds start + j: the real prefix is the same at any padded
        # length (a symbolic start is read at its real value: passes/padded_positions.py).
        a.layouts[node] = (a.dim_from_size(size, prefix=True),)
        return ("start", "end")
    a.mark(expr_of(size).free_symbols, "counts with a step along it")
    a._set_plain(node)
    return ()


@rule(*_FACTORIES)
def _rule_factory(a: _Analyzer, node: torch.fx.Node, target) -> Optional[tuple[str, ...]]:
    val = node.meta["val"]
    if isinstance(val, torch.Tensor):
        a.layouts[node] = a._plain(val.shape, prefix=True)  # a fill is the same at every position
    return _FACTORIES[target]
