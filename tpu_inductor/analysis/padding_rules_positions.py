"""Padding rules for the ops that address positions along a dim: slices,
selects, splits, concatenation, gathers and scatters, attention.

Why its own module: these are the rules that decide whether a dim padded at
its end still has its real positions where the graph reads them; several
accept an op only because passes/padded_positions.py rewrites it to address
the real end (the predicates they share are imported from there). The
layout rules (views, reductions, matmuls...) are in analysis/padding_rules.py,
whose :func:`~tpu_inductor.analysis.padding_rules.rule` registers both.
"""

from __future__ import annotations

import operator
from typing import Any, Optional, Sequence

import sympy
import torch
import torch.fx

from tpu_inductor.analysis.padding_rules import rule
from tpu_inductor.analysis.padding_safety import _ONE, Layout, _Analyzer, expr_of
from tpu_inductor.analysis.padding_safety import _arg, _equal, _free, _norm, _product, _sym_syms  # dim helpers
from tpu_inductor.decompositions.table import CPU_FLASH_ATTENTION, flash_attention_flags
from tpu_inductor.passes.padded_positions import concatenation_parts, index_put_rows, realigned_read

aten = torch.ops.aten


@rule(aten.slice.Tensor, reads_layout=True)
def _rule_slice(a: _Analyzer, node: torch.fx.Node, target) -> Optional[tuple[str, ...]]:
    source = a.source_layout(node)
    rank = len(source)
    d = _norm(_arg(node, "dim", 1, 0), rank)
    start = _arg(node, "start", 2, None)
    step = _arg(node, "step", 4, 1)
    out_size = expr_of(node.meta["val"].shape[d])
    layout = list(source)
    in_dim = source[d]
    if _equal(out_size, _product(in_dim)):
        a.layouts[node] = tuple(layout)  # the whole dim
        return ("end",)
    if len(in_dim) == 1 and realigned_read(node) is not None:
        # x[:, -k:] or x[:, i:i + k]: read at the real end (passes/padded_positions.py).
        layout[d] = (out_size,)
        a.layouts[node] = tuple(layout)
        return ("start", "end")
    if not _sym_syms(in_dim) and isinstance(out_size, sympy.Symbol) and start in (None, 0) and step == 1:
        # x[:, :s] of a static dim: position j is j; s must not outgrow the dim.
        limit = int(_product(in_dim))
        a.bounds[out_size] = min(a.bounds.get(out_size, limit), limit)
        layout[d] = (out_size,)
        a.layouts[node] = tuple(layout)
        return ("end",)
    static_start = isinstance(start, (int, type(None))) and (start or 0) >= 0 and step == 1
    if len(in_dim) == 1 and static_start and (_sym_syms(in_dim) or not out_size.free_symbols):
        # A static start: output position j is input position start + j at any
        # padded length, so the real positions stay a prefix (x[:, 1:], x[:, :-1]).
        layout[d] = a.dim_from_size(out_size, prefix=True)
        a.layouts[node] = tuple(layout)
        return ("end",)
    a.mark(_sym_syms(in_dim) | out_size.free_symbols, "slices it")
    layout[d] = (out_size,)
    a.layouts[node] = tuple(layout)
    return ()


@rule(aten.select.int, reads_layout=True)
def _rule_select(a: _Analyzer, node: torch.fx.Node, target) -> Optional[tuple[str, ...]]:
    source = a.source_layout(node)
    d = _norm(node.args[1], len(source))
    index = node.args[2]
    # A static position, or one counted from the real end (passes/padded_positions.py).
    if len(source[d]) != 1 or not (isinstance(index, int) or realigned_read(node) is not None):
        a.mark(_sym_syms(source[d]), "picks one position of it")
    a.layouts[node] = source[:d] + source[d + 1:]
    return ("index",)


@rule(aten.split.Tensor, aten.split_with_sizes.default, aten.unbind.int, reads_layout=True)
def _rule_split(a: _Analyzer, node: torch.fx.Node, target) -> Optional[tuple[str, ...]]:
    source = a.source_layout(node)
    index = 1 if target is aten.unbind.int else 2
    d = _norm(_arg(node, "dim", index, 0), len(source))
    a.mark(_sym_syms(source[d]), "splits it")
    outs = []
    for v in node.meta["val"]:
        layout = list(source)
        if target is aten.unbind.int:
            del layout[d]
        else:
            layout[d] = a.dim_from_size(v.shape[d])
        outs.append(tuple(layout))
    a.layouts[node] = outs
    return ()


@rule(aten.cat.default, aten.stack.default)
def _rule_cat(a: _Analyzer, node: torch.fx.Node, target) -> Optional[tuple[str, ...]]:
    out = node.meta["val"]
    if target is aten.cat.default:
        d, parts = concatenation_parts(node)
    else:
        d, parts = _norm(_arg(node, "dim", 1, 0), out.dim()), [p for p in node.args[0] if isinstance(p, torch.fx.Node)]
    layouts = [a.layout(p) for p in parts]
    if any(layout is None for layout in layouts) or not layouts:
        a._unknown(node)
        return ()
    result = []
    for k in range(out.dim()):
        if target is aten.cat.default and k == d:
            # Each part's real positions first, padding last: the parts are
            # put at their real offsets (passes/padded_positions.py).
            merged = [layout[k] for layout in layouts if len(layout[k]) > 1]
            a.mark(_free(f for dim in merged for f in dim), "concatenates dims that merge it with others")
            result.append(a.dim_from_size(out.shape[k], prefix=not merged))
            continue
        if target is aten.stack.default and k == d:
            result.append(a.dim_from_size(out.shape[k]))
            continue
        source_k = k if target is aten.cat.default or k < d else k - 1
        dims = [layout[source_k] for layout in layouts if len(layout) > source_k]
        dims = [x for x in dims if x != _ONE] or [_ONE]
        result.append(a.agreed_dim(dims, "concatenates differently laid out dims", out.shape[k]))
    a.layouts[node] = tuple(result)
    return ()


@rule(CPU_FLASH_ATTENTION)
def _rule_attention(a: _Analyzer, node: torch.fx.Node, target) -> Optional[tuple[str, ...]]:
    q, k, v = (a.layout(x) for x in node.args[:3])
    if q is None or k is None or v is None or not len(q) == len(k) == len(v) == 4:
        a._unknown(node)
        return ()
    dropout, is_causal = flash_attention_flags(node)
    mask = node.kwargs.get("attn_mask")
    for i in (0, 1):
        if not q[i] == k[i] == v[i]:
            a.mark(_sym_syms(q[i]) | _sym_syms(k[i]) | _sym_syms(v[i]), "pairs differently laid out heads")
    a.mark(_sym_syms(q[3]) | _sym_syms(k[3]), "contracts over it (attention scores)")
    # Padded keys are hidden from every query by the real key length
    # (passes/attention.py), causal or not, whatever the mask holds there.
    # Keys and values are one dim to attention: separately traced symbols
    # (a KV cache's keys and values) have equal real lengths, or eager raises.
    if len(k[2]) != 1 or len(v[2]) != 1:
        a.mark(_sym_syms(k[2]) | _sym_syms(v[2]), "attends over keys merged with another dim")
    if dropout:
        a.mark(_sym_syms(q[2]) | _sym_syms(k[2]), "drops attention at random along it")
    if any(u.target is operator.getitem and u.args[1] == 1 and u.users for u in node.users):
        # The decomposition that masks padded keys returns only the output.
        a.mark(_sym_syms(k[2]), "reads attention's logsumexp over it")
    if mask is not None:
        _check_attention_mask(a, a.layout(mask), q, k)
    a.layouts[node] = [(q[0], q[1], q[2], v[3]), (q[0], q[1], q[2])]
    return ()


def _check_attention_mask(a: _Analyzer, mask: Optional[Layout], q: Layout, k: Layout) -> None:
    """The mask's dims must be the queries' and keys' (or broadcast)."""
    if mask is None:
        a.mark(_sym_syms(q[2]) | _sym_syms(k[2]), "masks attention with a tensor of unknown layout")
        return
    targets = (q[0], q[1], q[2], k[2])[4 - len(mask):]
    for have, want in zip(mask, targets):
        if have != _ONE and have != want:
            a.mark(_sym_syms(have) | _sym_syms(want), "masks attention along a differently laid out dim")


def _mark_merged_inner_factors(a: _Analyzer, source: Layout, indices: Sequence[Any]) -> None:
    """A dim addressed by data indices and merged from several (a flattened
    ``[s0, s1]``): the index values count positions in the real ``s1``-wide
    rows, so only the outermost factor may be padded (its padded rows come
    after every real position); padding an inner one moves every real
    position after the first row (``x.flatten()[i]`` with ``s1`` 3 -> 4 read
    flat position 4 at 3)."""
    for k, index in enumerate(indices):
        if index is not None and k < len(source) and len(source[k]) > 1:
            a.mark(_free(source[k][1:]), "addresses positions of a dim merged from it by data indices")


def _index_rows(a: _Analyzer, node: torch.fx.Node, indices: Sequence[Any]) -> Optional[Layout]:
    """The broadcast layout of advanced-indexing tensors (None for a boolean
    mask or an index without a layout)."""
    tensors = [i for i in indices if isinstance(i, torch.fx.Node)]
    if not tensors or any(a.layout(i) is None for i in tensors):
        return None
    if any(i.meta["val"].dtype == torch.bool for i in tensors):
        return None
    shape = torch.broadcast_shapes(*[i.meta["val"].shape for i in tensors])
    return a.broadcast_layout(tensors, shape, "indexes with differently laid out index tensors")


@rule(aten.index.Tensor, reads_layout=True)
def _rule_index(a: _Analyzer, node: torch.fx.Node, target) -> Optional[tuple[str, ...]]:
    """``x[..., idx, ...]``: a gather. Indices are data: within the real
    size (eager raises otherwise; passes/wrap_negative_indices.py counts a
    negative one from the real end), so a padded source dim is only read at
    real positions; the output's rows are the index tensors' positions."""
    source = a.source_layout(node)
    indices = list(node.args[1])
    rows = _index_rows(a, node, indices)
    if rows is None:
        a._unknown(node)
        return ()
    _mark_merged_inner_factors(a, source, indices)
    positions = [k for k, i in enumerate(indices) if i is not None]
    others = [d for k, d in enumerate(source) if k not in positions]
    if positions == list(range(positions[0], positions[-1] + 1)):  # adjacent: rows go in their place
        layout = tuple(others[: positions[0]]) + rows + tuple(others[positions[0]:])
    else:  # PyTorch puts the rows first
        layout = rows + tuple(others)
    if len(layout) != node.meta["val"].dim():
        a._unknown(node)
        return ()
    a.layouts[node] = layout
    return ()


@rule(aten.index_put.default, aten._unsafe_index_put.default)
def _rule_index_put(a: _Analyzer, node: torch.fx.Node, target) -> Optional[tuple[str, ...]]:
    """``x[..., idx] = values``: positions of ``x`` are kept, and writes land
    at data positions within the real size (as for a gather). Padded rows of
    one 1-d index and its values write duplicates of the last real row (or
    add zeros) instead: passes/padded_positions.py."""
    source = a.source_layout(node)
    values = a.layout(node.args[2])
    if source is None or values is None:
        a._unknown(node)
        return ()
    indices = list(node.args[1])
    _mark_merged_inner_factors(a, source, indices)
    single = index_put_rows(node)
    if single is None:
        rows = _index_rows(a, node, indices)
        index_layouts = [a.layout(i) or () for i in indices if isinstance(i, torch.fx.Node)]
        a.mark(
            _free(f for layout in (rows or (), values, *index_layouts) for d in layout for f in d),
            "writes rows sized by it at data positions",
        )
    else:
        position, index = single
        index_dim = a.layout(index)[0]
        offset = len(source) - len(values)
        for k, dim in enumerate(values):
            target_dim = index_dim if k + offset == position else source[k + offset]
            if dim != _ONE and dim != target_dim:
                a.mark(_sym_syms(dim) | _sym_syms(target_dim), "writes values laid out differently from their rows")
    a.layouts[node] = source
    return ()
