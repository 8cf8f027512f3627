"""Put values where the real positions are, not where the padded shapes put them.

Why: padding a dim to its bucket keeps every real position in place only if
no op addresses positions from the *end* of that dim. Generation does so at
every step: a KV cache grows by ``cat([cache, new], dim=-2)`` (the new key
lands after the padding, not at the real length), the logits are taken at
``hidden[:, -1:]`` (a padded position), a sliding-window cache keeps
``keys[:, :, -w + 1:]``, and positions are counted from the cache length
(``arange(past, past + n)``). Each such op is rewritten here to address the
real end, read at run time from a ``valid_<size>`` input
(analysis/real_lengths.py), so that the padding analysis
(analysis/padding_safety.py), which accepts exactly these ops
(:func:`realigned_read`, :func:`concatenation_parts`, :func:`counted_from`,
:func:`real_valued_arguments`),
may pad the dim:

* ``cat([a, b], d)`` with ``a`` padded along ``d``: ``b`` is written at
  ``a``'s real length (an ``index_put`` of ``b``'s rows), so the real
  positions stay a prefix and the padding stays at the end;
* ``x[..., -k:]`` / ``x[..., -k]`` / ``x[..., i:i + k]`` with ``i`` a size:
  an ``index_select`` at ``real_length - k`` (or the real ``i``);
* ``arange(start, end)`` with ``start`` a size: ``arange(end - start) +
  real start``;
* ``index_put`` of a 1-d index with padded rows (a static cache written
  at ``cache_position``): the padded rows rewrite the last real row with
  its own value (or add zeros, when accumulating);
* a size used as a number by an elementwise op (``kv_arange + kv_offset``
  in a sliding-window mask): the real value, as a 0-d tensor input.

Runs only on symbolic graphs, after the analysis, and only on the ops whose
sizes involve a symbol the analysis let be padded.

Before (decode step, cache length ``s0`` padded)::

    cat = aten.cat([cache, new_key], -2)                   # [1, H, s0 + 1, D]

After::

    buffer = aten.cat([cache, new_key], -2)                # padded: new key at the end
    rows = aten.add(valid_s0, arange(1))                   # the real end of the cache
    cat = movedim(index_put(movedim(buffer), [rows], movedim(new_key)))
"""

from __future__ import annotations

import dataclasses
import operator
from typing import Any, Optional, Sequence

import sympy
import torch
import torch.fx

from tpu_inductor.analysis.padding_safety import _arg, _norm, expr_of
from tpu_inductor.analysis.real_lengths import RealLengths
from tpu_inductor.passes.rewrite import GraphBuilder, inline_replacement, trace_replacement

aten = torch.ops.aten

_SLICE_TO_END = (None, torch.iinfo(torch.int64).max)


# -- which ops address positions from the end (read by the padding analysis too) --


def concatenation_parts(node: torch.fx.Node) -> tuple[int, list[torch.fx.Node]]:
    """``(dim, parts)`` of a ``cat``: the parts that take part in it (PyTorch
    skips legacy 1-d empty tensors, such as a KV cache before its first update)."""
    rank = node.meta["val"].dim()
    dim = _norm(_arg(node, "dim", 1, 0), rank)
    parts = [p for p in node.args[0] if isinstance(p, torch.fx.Node) and p.meta["val"].dim() == rank]
    return dim, parts


@dataclasses.dataclass(frozen=True)
class RealignedRead:
    """A slice or select whose first position is counted from the real end
    (``from_end``, negative) or is a size expression (``start``)."""

    dim: int
    length: int
    from_end: Optional[int] = None
    start: Optional[sympy.Expr] = None
    squeeze: bool = False


def realigned_read(node: torch.fx.Node) -> Optional[RealignedRead]:
    """The read a slice/select does, if it is one :func:`padded_positions` rewrites:
    step 1, a static number of positions, counted from the end or from a size."""
    if node.target not in (aten.slice.Tensor, aten.select.int):
        return None
    source = node.args[0].meta["val"]
    dim = _norm(_arg(node, "dim", 1, 0), source.dim())
    if node.target is aten.select.int:
        index = node.args[2]
        if isinstance(index, int):
            return RealignedRead(dim, 1, from_end=index, squeeze=True) if index < 0 else None
        value = index.meta.get("val") if isinstance(index, torch.fx.Node) else None
        if isinstance(value, torch.SymInt):
            return RealignedRead(dim, 1, start=expr_of(value), squeeze=True)
        return None
    start, end, step = _arg(node, "start", 2), _arg(node, "end", 3), _arg(node, "step", 4, 1)
    length = node.meta["val"].shape[dim]
    if step != 1 or not isinstance(length, int):
        return None
    if isinstance(start, int) and start < 0 and (end in _SLICE_TO_END or (isinstance(end, int) and start < end <= 0)):
        return RealignedRead(dim, length, from_end=start)
    value = start.meta.get("val") if isinstance(start, torch.fx.Node) else None
    if isinstance(value, torch.SymInt):
        return RealignedRead(dim, length, start=expr_of(value))
    return None


def real_valued_arguments(node: torch.fx.Node) -> dict[str, sympy.Expr]:
    """Sizes an elementwise op takes as numbers in a Tensor argument
    (``kv_arange + kv_offset``), by argument name: read at their real value."""
    target = node.target
    if not isinstance(target, torch._ops.OpOverload) or torch.Tag.pointwise not in target.tags:
        return {}
    found = {}
    for argument, value in zip(target._schema.arguments, node.args):
        if not isinstance(argument.type, torch.TensorType) or not isinstance(value, torch.fx.Node):
            continue
        if isinstance(value.meta.get("val"), torch.SymInt):
            found[argument.name] = expr_of(value.meta["val"])
    return found


def index_put_rows(node: torch.fx.Node) -> Optional[tuple[int, torch.fx.Node]]:
    """``(dim, index)`` of an ``index_put`` with one 1-d integer index (a
    cache written at ``cache_position``), else None."""
    if node.target not in (aten.index_put.default, aten._unsafe_index_put.default):
        return None
    indices = list(node.args[1])
    tensors = [(k, i) for k, i in enumerate(indices) if i is not None]
    if len(tensors) != 1 or not isinstance(tensors[0][1], torch.fx.Node):
        return None
    value = tensors[0][1].meta.get("val")
    if not isinstance(value, torch.Tensor) or value.dim() != 1 or value.dtype == torch.bool:
        return None
    return tensors[0]


def counted_from(node: torch.fx.Node) -> Optional[sympy.Expr]:
    """The size an ``arange(start, end)`` with step 1 counts from, if symbolic."""
    if node.target not in (aten.arange.start, aten.arange.start_step):
        return None
    step = _arg(node, "step", 2, 1)
    start = node.args[0]
    value = start.meta.get("val") if isinstance(start, torch.fx.Node) else None
    if step != 1 or not isinstance(value, torch.SymInt):
        return None
    return expr_of(value)


# -- the rewrite ---------------------------------------------------------------------


def padded_positions(gm: torch.fx.GraphModule, padded: frozenset, real_lengths: RealLengths) -> torch.fx.GraphModule:
    """Rewrite every op that addresses a padded dim from its end (see the module doc)."""
    if not padded:
        return gm
    changed = False
    for node in list(gm.graph.nodes):
        if node.op != "call_function":
            continue
        if node.target is aten.cat.default:
            changed |= _realign_cat(gm, node, padded, real_lengths)
        elif node.target in (aten.slice.Tensor, aten.select.int):
            changed |= _realign_read(gm, node, padded, real_lengths)
        elif node.target in (aten.arange.start, aten.arange.start_step):
            changed |= _realign_count(gm, node, padded, real_lengths)
        elif node.target in (aten.index_put.default, aten._unsafe_index_put.default):
            changed |= _realign_index_put(gm, node, padded, real_lengths)
        else:
            changed |= _read_real_values(node, padded, real_lengths)
    if changed:
        gm.graph.eliminate_dead_code()
        gm.graph.lint()
        gm.recompile()
    return gm


def _padded(size, padded: frozenset) -> bool:
    return bool(expr_of(size).free_symbols & padded)


def _realign_cat(gm, node, padded, real_lengths: RealLengths) -> bool:
    dim, parts = concatenation_parts(node)
    if not any(_padded(p.meta["val"].shape[dim], padded) for p in parts[:-1]):
        return False
    like = node.meta["val"]
    # A static part's length is a constant; a symbolic one's is read at run time.
    sizes = [expr_of(p.meta["val"].shape[dim]) for p in parts[:-1]]
    lengths = [real_lengths.node(s, like) for s in sizes if s.free_symbols]
    inputs = [*parts, *lengths]
    count = len(parts)

    def concatenate(*args):
        read = iter(args[count:])
        return _cat_at_real_offsets(dim, args[:count], [next(read) if s.free_symbols else int(s) for s in sizes])

    replacement = trace_replacement(concatenate, tuple(x.meta["val"] for x in inputs))
    inline_replacement(gm, node, replacement, inputs)
    return True


def _cat_at_real_offsets(dim: int, parts: Sequence[torch.Tensor], lengths: Sequence[Any]) -> torch.Tensor:
    """``cat(parts, dim)`` with part ``i + 1`` starting at the real end of part
    ``i`` (``lengths[i]``); the padding of every part ends up after the last."""
    buffer = torch.cat(list(parts), dim).movedim(dim, 0)
    offset = lengths[0]
    for i, part in enumerate(parts[1:], start=1):
        rows = offset + torch.arange(part.size(dim), device=buffer.device)
        buffer = buffer.index_put((rows,), part.movedim(dim, 0))
        if i < len(lengths):
            offset = offset + lengths[i]
    return buffer.movedim(0, dim)


def _realign_read(gm, node, padded, real_lengths: RealLengths) -> bool:
    read = realigned_read(node)
    if read is None:
        return False
    source = node.args[0]
    size = source.meta["val"].shape[read.dim]
    like = node.meta["val"]
    if read.from_end is not None:
        if not _padded(size, padded):
            return False
        first = real_lengths.node(expr_of(size), like)
        offset = read.from_end
    else:
        if not read.start.free_symbols & padded:
            return False
        first = real_lengths.node(read.start, like)
        offset = 0
    inputs = [source, first]
    replacement = trace_replacement(
        lambda x, n: _read_at(x, n + offset, read), tuple(x.meta["val"] for x in inputs)
    )
    inline_replacement(gm, node, replacement, inputs)
    return True


def _read_at(x: torch.Tensor, first: torch.Tensor, read: RealignedRead) -> torch.Tensor:
    rows = x.index_select(read.dim, first + torch.arange(read.length, device=x.device))
    return rows.squeeze(read.dim) if read.squeeze else rows


def _realign_count(gm, node, padded, real_lengths: RealLengths) -> bool:
    start = counted_from(node)
    if start is None or not start.free_symbols & padded:
        return False
    like = node.meta["val"]
    first = real_lengths.node(start, like)
    with gm.graph.inserting_before(node):
        build = GraphBuilder(gm.graph, node)
        count = build.call(operator.sub, node.args[1], node.args[0])
        positions = build.call(aten.arange.default, count, dtype=torch.int64)
        result = build.call(aten.add.Tensor, positions, first)
        if like.dtype != torch.int64:
            result = build.call(torch.ops.prims.convert_element_type.default, result, like.dtype)
        build.replace_anchor(result)
    return True


def _realign_index_put(gm, node, padded, real_lengths: RealLengths) -> bool:
    found = index_put_rows(node)
    if found is None:
        return False
    dim, index = found
    count = index.meta["val"].shape[0]
    if not _padded(count, padded):
        return False
    source, _, values = node.args[:3]
    accumulate = bool(_arg(node, "accumulate", 3, False))
    real = real_lengths.node(expr_of(count), node.meta["val"])
    values_dim = dim - (source.meta["val"].dim() - values.meta["val"].dim())
    broadcast = values_dim < 0 or values.meta["val"].shape[values_dim] == 1
    inputs = [source, index, values, real]
    replacement = trace_replacement(
        lambda x, i, v, n: _put_real_rows(x, dim, i, v, n, None if broadcast else values_dim, accumulate),
        tuple(x.meta["val"] for x in inputs),
    )
    inline_replacement(gm, node, replacement, inputs)
    return True


def _put_real_rows(x, dim: int, index, values, real, values_dim: Optional[int], accumulate: bool):
    """``index_put`` of only the first ``real`` rows of ``index`` and ``values``:
    padded rows add zeros, or rewrite the last real row with its own value
    (duplicates of one write, so their order cannot matter)."""
    rows = torch.arange(index.size(0), device=x.device)
    indices = [None] * dim
    if accumulate:
        # Every padded row adds zero: broadcast values first, so that each row has its own.
        rows_shape = [*x.shape[:dim], index.size(0), *x.shape[dim + 1:]]
        values = values.expand(rows_shape)
        shape = [1] * len(rows_shape)
        shape[dim] = -1
        values = torch.where((rows < real).reshape(shape), values, 0)
        return torch.ops.aten.index_put(x, [*indices, index], values, True)
    rows = torch.minimum(rows, real - 1)
    if values_dim is not None:
        values = values.index_select(values_dim, rows)
    return torch.ops.aten.index_put(x, [*indices, index.index_select(0, rows)], values)


def _read_real_values(node: torch.fx.Node, padded: frozenset, real_lengths: RealLengths) -> bool:
    """Sizes used as numbers by an elementwise op: the real value, as a 0-d
    int64 tensor (a 0-d tensor promotes like the Python number it replaces)."""
    sizes = {name: expr for name, expr in real_valued_arguments(node).items() if expr.free_symbols & padded}
    if not sizes:
        return False
    like = next(a.meta["val"] for a in node.all_input_nodes if isinstance(a.meta.get("val"), torch.Tensor))
    names = [argument.name for argument in node.target._schema.arguments]
    node.args = tuple(
        real_lengths.node(sizes[names[i]], like) if i < len(names) and names[i] in sizes else value
        for i, value in enumerate(node.args)
    )
    return True
