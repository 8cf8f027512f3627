"""Shape analysis: which symbolic dims may be padded up to a bucket.

Why: XLA compiles static shapes, so a graph whose batch or sequence length
changes every call would compile once per size. Padding the inputs up to a
few bucket sizes and slicing the outputs back is only correct along a dim
where no op lets a padded position influence a real one. This pass proves it,
op by op, for each symbol Dynamo gave the graph; every symbol it cannot prove
safe compiles at its exact size.

It tracks, for every tensor, each dim as a tuple of *factors* (sizes whose
product is the dim), so a view that merges ``[b, s, c] -> [b*s, c]`` and later
splits it back is followed exactly. A symbol is unsafe as soon as any op:

* reduces, normalises, scans, sorts, flips, rolls or contracts (matmul) over a
  dim carrying it, or selects, slices, pads or concatenates along it;
* uses its value as a number instead of a size (``x * x.shape[0]``, the
  ``1/s`` of a mean, an index like ``x[:, s - 1]``);
* has no rule below (unknown ops are never assumed safe), is random, or would
  return a view of a padded input.

Causal attention (``scaled_dot_product_attention(is_causal=True)``, kept whole
until after this pass) is safe along the sequence dim: a real query ``i < s``
attends keys ``j <= i < s`` only, so padded keys never reach a real row (the
attention decomposition also zeroes padded value rows, so even a non-finite
padded value cannot leak through ``0 * x``). Non-causal attention mixes every
key into every query and is unsafe along the key dim.

A prefix slice of a static dim by a symbol (``pos_emb[:, :T]``) is safe but
bounds the symbol: padding ``T`` past the parameter's size would read out of
range, so ``upper_bounds`` caps the bucket there.

Before: the graph (unchanged). After: ``gm.meta["padding_analysis"]`` holds a
:class:`PaddingAnalysis`, e.g. for an MLP ``safe = {s0}``; for
``x.softmax(0)``: ``unsafe = {s0: "aten._softmax.default normalises over it
(model.py:3)"}``.
"""

from __future__ import annotations

import dataclasses
import operator
from typing import Any, Callable, Iterable, Mapping, Optional, Sequence

import sympy
import torch
import torch.fx

from tpu_inductor.errors import user_source_line
from tpu_inductor.passes.decompositions import CPU_FLASH_ATTENTION, flash_attention_flags

aten = torch.ops.aten
prims = torch.ops.prims

Factor = sympy.Expr
Dim = tuple[Factor, ...]
Layout = tuple[Dim, ...]
_SYMBOLIC = (torch.SymInt, torch.SymFloat, torch.SymBool)
_ONE: Dim = (sympy.Integer(1),)


@dataclasses.dataclass(frozen=True)
class PaddingAnalysis:
    """The verdict for each symbol of a graph's input shapes."""

    symbols: frozenset
    """Every free symbol of the placeholders (tensor dims and SymInt args)."""
    unsafe: Mapping[sympy.Symbol, str]
    """Symbol -> the first reason it may not be padded (op and source line)."""
    upper_bounds: Mapping[sympy.Symbol, int]
    """Symbol -> the largest size it may be padded to."""

    @property
    def safe(self) -> frozenset:
        return frozenset(s for s in self.symbols if s not in self.unsafe)


def padding_safety(gm: torch.fx.GraphModule) -> torch.fx.GraphModule:
    """Record :func:`analyze_padding`'s verdict in ``gm.meta["padding_analysis"]``."""
    gm.meta["padding_analysis"] = analyze_padding(gm)
    return gm


def analyze_padding(gm: torch.fx.GraphModule) -> PaddingAnalysis:
    return _Analyzer(gm).run()


def expr_of(value: Any) -> sympy.Expr:
    """The sympy expression of a size (SymInt or int)."""
    if isinstance(value, _SYMBOLIC):
        node = value.node
        return node.shape_env.replace(node.expr) if node.shape_env is not None else node.expr
    return sympy.Integer(int(value))


def _free(exprs: Iterable[Any]) -> set:
    found: set = set()
    for e in exprs:
        if isinstance(e, sympy.Basic):
            found |= e.free_symbols
    return found


def _product(dim: Dim) -> sympy.Expr:
    return sympy.Mul(*dim) if dim else sympy.Integer(1)


def _equal(a: sympy.Expr, b: sympy.Expr) -> bool:
    return sympy.expand(a - b) == 0


def _norm(dim: int, rank: int) -> int:
    return dim + rank if dim < 0 else dim


def _tensor_val(node: Any) -> Optional[torch.Tensor]:
    if isinstance(node, torch.fx.Node):
        val = node.meta.get("val")
        if isinstance(val, torch.Tensor):
            return val
    return None


# Ops whose output has its input's layout (values change, positions do not).
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
_ALIASING = frozenset(
    {
        aten.view.default,
        aten.reshape.default,
        aten.expand.default,
        aten.permute.default,
        aten.t.default,
        aten.transpose.int,
        aten.unsqueeze.default,
        aten.squeeze.dim,
        aten.squeeze.dims,
        aten.squeeze.default,
        aten.slice.Tensor,
        aten.select.int,
        aten.alias.default,
        aten.detach.default,
        aten.split.Tensor,
        aten.split_with_sizes.default,
        aten.unbind.int,
        aten.as_strided.default,
        operator.getitem,
    }
)
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
    aten.cumsum.default: ("dim", 1, 0, "scans along it"),
    aten.cumprod.default: ("dim", 1, 0, "scans along it"),
    aten.logcumsumexp.default: ("dim", 1, 0, "scans along it"),
    aten.cummax.default: ("dim", 1, 0, "scans along it"),
    aten.cummin.default: ("dim", 1, 0, "scans along it"),
    aten.sort.default: ("dim", 1, -1, "sorts along it"),
    aten.sort.stable: ("dim", None, -1, "sorts along it"),
    aten.argsort.default: ("dim", 1, -1, "sorts along it"),
    aten.argsort.stable: ("dim", None, -1, "sorts along it"),
    aten.flip.default: ("dims", 1, (), "reverses it"),
    aten.roll.default: ("dims", 2, (), "rolls along it"),
}
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


class _Analyzer:
    def __init__(self, gm: torch.fx.GraphModule) -> None:
        self.gm = gm
        self.layouts: dict[torch.fx.Node, Any] = {}
        self.aliases_input: set[torch.fx.Node] = set()
        self.unsafe: dict[sympy.Symbol, str] = {}
        self.bounds: dict[sympy.Symbol, int] = {}
        self.symbols: set = set()
        self.node: Optional[torch.fx.Node] = None

    # -- bookkeeping -------------------------------------------------------

    def run(self) -> PaddingAnalysis:
        for node in self.gm.graph.nodes:
            self.node = node
            if node.op == "placeholder":
                self._placeholder(node)
            elif node.op == "output":
                self._outputs(node)
            elif node.op == "call_function":
                self._call(node)
            else:  # get_attr constants, call_module: no symbolic dims of their own
                val = _tensor_val(node)
                if val is not None:
                    self.layouts[node] = self._plain(val.shape)
        return PaddingAnalysis(
            symbols=frozenset(self.symbols),
            unsafe=dict(self.unsafe),
            upper_bounds=dict(self.bounds),
        )

    def mark(self, symbols: Iterable, why: str) -> None:
        node = self.node
        where = user_source_line(node) if node is not None else None
        op = _op_name(node) if node is not None else "the graph"
        for symbol in symbols:
            if symbol not in self.unsafe:
                self.unsafe[symbol] = f"{op} {why}" + (f" ({where})" if where else "")

    def dim_from_size(self, size: Any) -> Dim:
        expr = expr_of(size) if not isinstance(size, sympy.Basic) else size
        if expr.free_symbols and not isinstance(expr, sympy.Symbol):
            # A compound size (s0 + 1, 2*s0 from a cat...): positions are not tracked.
            self.mark(expr.free_symbols, f"makes a dim of size {expr}")
        return (expr,)

    def _plain(self, shape: Sequence[Any]) -> Layout:
        return tuple(self.dim_from_size(s) for s in shape)

    def layout(self, node: Any) -> Optional[Layout]:
        found = self.layouts.get(node)
        return found if isinstance(found, tuple) and (not found or isinstance(found[0], tuple)) else None

    def source_layout(self, node: torch.fx.Node) -> Optional[Layout]:
        """The layout of ``node``'s first argument; when it has none, ``node``
        is treated as an op without a rule (its dims are not proven safe)."""
        source = self.layout(node.args[0])
        if source is None:
            self._unknown(node)
        return source

    # -- node kinds --------------------------------------------------------

    def _placeholder(self, node: torch.fx.Node) -> None:
        val = node.meta.get("val")
        if isinstance(val, torch.Tensor):
            self.symbols |= _free(expr_of(s) for s in val.shape)
            self.layouts[node] = self._plain(val.shape)
            self.aliases_input.add(node)
        elif isinstance(val, _SYMBOLIC):
            self.symbols |= expr_of(val).free_symbols

    def _outputs(self, node: torch.fx.Node) -> None:
        outputs = node.args[0]
        outputs = outputs if isinstance(outputs, (list, tuple)) else (outputs,)
        for out in outputs:
            if not isinstance(out, torch.fx.Node):
                continue
            val = out.meta.get("val")
            if isinstance(val, _SYMBOLIC):
                if out.op != "placeholder":  # an input returned as is stays exact
                    self.mark(expr_of(val).free_symbols, "returns it as a number")
                continue
            layout = self.layout(out)
            if layout is None:
                continue
            if out in self.aliases_input and out.op != "placeholder":
                # (An input returned as is is handed back unpadded: see dynamic/padding.py.)
                self.mark(_free(f for d in layout for f in d), "returns a view of an input")
            for dim in layout:
                if len([f for f in dim if f != 1]) > 1:
                    self.mark(_free(dim), "returns a dim that merges it with others")

    def _call(self, node: torch.fx.Node) -> None:
        target = node.target
        val = node.meta.get("val")
        if target is operator.getitem:
            source, index = node.args
            outs = self.layouts.get(source)
            if isinstance(outs, list) and index < len(outs):
                self.layouts[node] = outs[index]
            elif isinstance(val, torch.Tensor):
                self._unknown(node)
            if source in self.aliases_input:
                self.aliases_input.add(node)
            return
        if not isinstance(target, torch._ops.OpOverload):
            if _has_tensor(val):
                self._unknown(node)
            return  # SymInt arithmetic: its uses are judged where they land
        if not _has_tensor(val):
            return  # sym_size and friends
        size_args = self._apply_rule(node)
        self._check_number_uses(node, size_args)
        if target in _ALIASING and any(a in self.aliases_input for a in node.all_input_nodes):
            self.aliases_input.add(node)

    def _check_number_uses(self, node: torch.fx.Node, size_args: Iterable[str]) -> None:
        """A symbolic value used as anything but a size makes its symbols unsafe."""
        allowed = set(size_args)
        for name, value in _named_args(node).items():
            if name in allowed:
                continue
            for item in _flatten(value):
                sym = item.meta.get("val") if isinstance(item, torch.fx.Node) else item
                if isinstance(sym, _SYMBOLIC):
                    self.mark(expr_of(sym).free_symbols, f"uses {expr_of(sym)} as a value ({name})")

    def _unknown(self, node: torch.fx.Node, why: str = "has no padding rule") -> None:
        symbols = set()
        for arg in node.all_input_nodes:
            symbols |= _symbols_of(arg.meta.get("val"))
        symbols |= _symbols_of(node.meta.get("val"))
        self.mark(symbols, why)
        self._set_plain(node)

    def _set_plain(self, node: torch.fx.Node) -> None:
        val = node.meta.get("val")
        if isinstance(val, torch.Tensor):
            self.layouts[node] = self._plain(val.shape)
        elif isinstance(val, (list, tuple)):
            self.layouts[node] = [
                self._plain(v.shape) if isinstance(v, torch.Tensor) else None for v in val
            ]

    # -- rules -------------------------------------------------------------

    def _apply_rule(self, node: torch.fx.Node) -> tuple[str, ...]:
        """Set the node's layout; return the argument names that hold sizes."""
        target = node.target
        # The attention op is tagged random for its dropout; its rule checks dropout_p.
        if torch.Tag.nondeterministic_seeded in target.tags and target is not CPU_FLASH_ATTENTION:
            self._unknown(node, "is random: padded shapes would draw different numbers")
            return ()
        if target._schema.is_mutable:
            # Writes into its argument: into our padded copy, not the caller's tensor.
            self._unknown(node, "writes in place into a tensor sized by it")
            return ()
        if target is aten.copy.default:
            self._pointwise(node)
            return ()
        for rule in _RULES:
            handled = rule(self, node, target)
            if handled is not None:
                return handled
        if torch.Tag.pointwise in target.tags and isinstance(node.meta.get("val"), torch.Tensor):
            self._pointwise(node)
            return ()
        self._unknown(node)
        return ()

    def _pointwise(self, node: torch.fx.Node, inputs: Optional[Sequence] = None) -> None:
        val = node.meta["val"]
        rank = val.dim()
        tensors = [a for a in (inputs or _flatten_nodes(node)) if self.layout(a) is not None]
        layout = []
        for k in range(rank):
            candidates = []
            for arg in tensors:
                arg_layout = self.layout(arg)
                index = k - (rank - len(arg_layout))
                if index >= 0 and arg_layout[index] != _ONE:
                    candidates.append(arg_layout[index])
            if not candidates:
                layout.append(self.dim_from_size(val.shape[k]))
            elif all(c == candidates[0] for c in candidates):
                layout.append(candidates[0])
            else:
                self.mark(_free(f for c in candidates for f in c), "combines differently laid out dims")
                layout.append(self.dim_from_size(val.shape[k]))
        self.layouts[node] = tuple(layout)


def _named_args(node: torch.fx.Node) -> dict[str, Any]:
    schema = node.target._schema
    named = {}
    for argument, value in zip(schema.arguments, node.args):
        named[argument.name] = value
    named.update(node.kwargs)
    return named


def _flatten(value: Any) -> list:
    if isinstance(value, (list, tuple)):
        return [x for v in value for x in _flatten(v)]
    return [value]


def _flatten_nodes(node: torch.fx.Node) -> list[torch.fx.Node]:
    return [
        x
        for v in (*node.args, *node.kwargs.values())
        for x in _flatten(v)
        if isinstance(x, torch.fx.Node) and isinstance(x.meta.get("val"), torch.Tensor)
    ]


def _has_tensor(val: Any) -> bool:
    return any(isinstance(v, torch.Tensor) for v in _flatten(val))


def _symbols_of(val: Any) -> set:
    found: set = set()
    for v in _flatten(val):
        if isinstance(v, torch.Tensor):
            found |= _free(expr_of(s) for s in v.shape)
        elif isinstance(v, _SYMBOLIC):
            found |= expr_of(v).free_symbols
    return found


def _op_name(node: torch.fx.Node) -> str:
    if node.op == "placeholder":
        return f"input {node.name}"
    if node.op == "output":
        return "the graph"
    target = node.target
    if isinstance(target, torch._ops.OpOverload):
        return str(target)
    return getattr(target, "__name__", str(target))


def _arg(node: torch.fx.Node, name: str, index: int, default: Any = None) -> Any:
    if name in node.kwargs:
        return node.kwargs[name]
    return node.args[index] if index < len(node.args) else default


def _sym_syms(dim: Optional[Dim]) -> set:
    return _free(dim or ())


# Each rule: (analyzer, node, target) -> size argument names, or None if not its op.
Rule = Callable[[_Analyzer, torch.fx.Node, Any], Optional[tuple[str, ...]]]


def _rule_same_layout(a: _Analyzer, node: torch.fx.Node, target) -> Optional[tuple[str, ...]]:
    if target not in _SAME_LAYOUT:
        return None
    source = a.source_layout(node)
    if source is not None:
        a.layouts[node] = source
    return ()


def _rule_view(a: _Analyzer, node: torch.fx.Node, target) -> Optional[tuple[str, ...]]:
    if target not in _VIEWS:
        return None
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


def _rule_permute(a: _Analyzer, node: torch.fx.Node, target) -> Optional[tuple[str, ...]]:
    if target not in (aten.permute.default, aten.t.default, aten.transpose.int):
        return None
    source = a.source_layout(node)
    if source is None:
        return ()
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


def _rule_squeeze(a: _Analyzer, node: torch.fx.Node, target) -> Optional[tuple[str, ...]]:
    if target not in (
        aten.unsqueeze.default, aten.squeeze.dim, aten.squeeze.dims, aten.squeeze.default,
        prims.squeeze.default,
    ):
        return None
    source = a.source_layout(node)
    if source is None:
        return ()
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


def _rule_expand(a: _Analyzer, node: torch.fx.Node, target) -> Optional[tuple[str, ...]]:
    if target is not aten.expand.default:
        return None
    source = a.source_layout(node)
    out = node.meta["val"].shape
    if source is None:
        return ("size",)
    layout = []
    for k, size in enumerate(out):
        index = k - (len(out) - len(source))
        if index < 0 or (source[index] == _ONE and size != 1):
            layout.append(a.dim_from_size(size))  # broadcast: every position a copy
        else:
            layout.append(source[index])
    a.layouts[node] = tuple(layout)
    return ("size",)


def _rule_reduction(a: _Analyzer, node: torch.fx.Node, target) -> Optional[tuple[str, ...]]:
    if target not in _REDUCTIONS:
        return None
    source = a.source_layout(node)
    if source is None:
        return ()
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


def _rule_mixes_along(a: _Analyzer, node: torch.fx.Node, target) -> Optional[tuple[str, ...]]:
    if target not in _MIXES_ALONG:
        return None
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


def _rule_windowed(a: _Analyzer, node: torch.fx.Node, target) -> Optional[tuple[str, ...]]:
    if target not in _WINDOWED:
        return None
    source = a.source_layout(node)
    if source is None:
        return ()
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


def _rule_layer_norm(a: _Analyzer, node: torch.fx.Node, target) -> Optional[tuple[str, ...]]:
    if target is not aten.native_layer_norm.default:
        return None
    source = a.source_layout(node)
    if source is None:
        return ()
    n = len(node.args[1])
    for dim in source[len(source) - n:]:
        a.mark(_sym_syms(dim), "normalises over it")
    stats = source[: len(source) - n] + (_ONE,) * n
    a.layouts[node] = [source, stats, stats]
    return ()


def _rule_batch_norm(a: _Analyzer, node: torch.fx.Node, target) -> Optional[tuple[str, ...]]:
    if target not in (
        aten._native_batch_norm_legit_no_training.default,
        aten._native_batch_norm_legit.default,
        aten.native_batch_norm.default,
        aten._native_batch_norm_legit_functional.default,
    ):
        return None
    source = a.source_layout(node)
    if source is None:
        return ()
    if target is not aten._native_batch_norm_legit_no_training.default:
        for i, dim in enumerate(source):
            if i != 1:
                a.mark(_sym_syms(dim), "normalises over it (batch statistics)")
    if len(source) > 1:
        a.mark(_sym_syms(source[1]), "has per-channel parameters along it")
    rest = [a._plain(v.shape) if isinstance(v, torch.Tensor) else None for v in node.meta["val"][1:]]
    a.layouts[node] = [source, *rest]
    return ()


def _rule_matmul(a: _Analyzer, node: torch.fx.Node, target) -> Optional[tuple[str, ...]]:
    if target not in (aten.mm.default, aten.addmm.default, aten.bmm.default, aten.baddbmm.default):
        return None
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


def _rule_embedding(a: _Analyzer, node: torch.fx.Node, target) -> Optional[tuple[str, ...]]:
    if target is not aten.embedding.default:
        return None
    weight, indices = a.layout(node.args[0]), a.layout(node.args[1])
    if weight is None or indices is None:
        a._unknown(node)
        return ()
    a.mark(_sym_syms(weight[0]), "looks rows up in a table sized by it")
    a.layouts[node] = indices + (weight[-1],)
    return ()


def _rule_arange(a: _Analyzer, node: torch.fx.Node, target) -> Optional[tuple[str, ...]]:
    if target not in (aten.arange.default, aten.arange.start, aten.arange.start_step):
        return None
    if target is aten.arange.default:
        start, step = 0, 1
    else:
        start = node.args[0]
        step = node.args[2] if target is aten.arange.start_step and len(node.args) > 2 else 1
    size = node.meta["val"].shape[0]
    if isinstance(start, int) and start == 0 and isinstance(step, int) and step == 1:
        # Position j holds j: the real prefix is the same at any padded length.
        a.layouts[node] = (a.dim_from_size(size),)
        return ("end",)
    a.mark(expr_of(size).free_symbols, "counts with an offset or step along it")
    a._set_plain(node)
    return ()


def _rule_factory(a: _Analyzer, node: torch.fx.Node, target) -> Optional[tuple[str, ...]]:
    if target not in _FACTORIES:
        return None
    a._set_plain(node)  # a fill is the same at every position
    return _FACTORIES[target]


def _rule_slice(a: _Analyzer, node: torch.fx.Node, target) -> Optional[tuple[str, ...]]:
    if target is not aten.slice.Tensor:
        return None
    source = a.source_layout(node)
    if source is None:
        return ()
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
    prefix = start in (None, 0) and step == 1
    if prefix and not _sym_syms(in_dim) and isinstance(out_size, sympy.Symbol):
        # x[:, :s] of a static dim: position j is j; s must not outgrow the dim.
        limit = int(_product(in_dim))
        a.bounds[out_size] = min(a.bounds.get(out_size, limit), limit)
        layout[d] = (out_size,)
        a.layouts[node] = tuple(layout)
        return ("end",)
    a.mark(_sym_syms(in_dim) | out_size.free_symbols, "slices it")
    layout[d] = (out_size,)
    a.layouts[node] = tuple(layout)
    return ()


def _rule_select(a: _Analyzer, node: torch.fx.Node, target) -> Optional[tuple[str, ...]]:
    if target is not aten.select.int:
        return None
    source = a.source_layout(node)
    if source is None:
        return ()
    d = _norm(node.args[1], len(source))
    a.mark(_sym_syms(source[d]), "picks one position of it")
    a.layouts[node] = source[:d] + source[d + 1:]
    return ()


def _rule_split(a: _Analyzer, node: torch.fx.Node, target) -> Optional[tuple[str, ...]]:
    if target not in (aten.split.Tensor, aten.split_with_sizes.default, aten.unbind.int):
        return None
    source = a.source_layout(node)
    if source is None:
        return ()
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


def _rule_cat(a: _Analyzer, node: torch.fx.Node, target) -> Optional[tuple[str, ...]]:
    if target not in (aten.cat.default, aten.stack.default):
        return None
    parts = [p for p in node.args[0] if isinstance(p, torch.fx.Node)]
    layouts = [a.layout(p) for p in parts]
    if any(layout is None for layout in layouts) or not layouts:
        a._unknown(node)
        return ()
    out = node.meta["val"]
    d = _norm(_arg(node, "dim", 1, 0), out.dim())
    result = []
    for k in range(out.dim()):
        if target is aten.cat.default and k == d:
            for layout in layouts:
                if len(layout) == out.dim():
                    a.mark(_sym_syms(layout[k]), "concatenates along it")
            result.append(a.dim_from_size(out.shape[k]))
            continue
        if target is aten.stack.default and k == d:
            result.append(a.dim_from_size(out.shape[k]))
            continue
        source_k = k if target is aten.cat.default or k < d else k - 1
        dims = [layout[source_k] for layout in layouts if len(layout) > source_k]
        dims = [x for x in dims if x != _ONE] or [_ONE]
        if all(x == dims[0] for x in dims):
            result.append(dims[0])
        else:
            a.mark(_free(f for x in dims for f in x), "concatenates differently laid out dims")
            result.append(a.dim_from_size(out.shape[k]))
    a.layouts[node] = tuple(result)
    return ()


def _rule_attention(a: _Analyzer, node: torch.fx.Node, target) -> Optional[tuple[str, ...]]:
    if target is not CPU_FLASH_ATTENTION:
        return None
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
    if k[2] != v[2]:
        a.mark(_sym_syms(k[2]) | _sym_syms(v[2]), "pairs differently laid out keys and values")
    if dropout:
        a.mark(_sym_syms(q[2]) | _sym_syms(k[2]), "drops attention at random along it")
    causal = is_causal and mask is None and q[2] == k[2]
    if any(u.target is operator.getitem and u.args[1] == 1 and u.users for u in node.users):
        # The decomposition that masks padded keys returns only the output.
        a.mark(_sym_syms(k[2]), "reads attention's logsumexp over it")
    if not causal:
        a.mark(_sym_syms(k[2]), "attends over it without a causal mask (every query reads every key)")
    a.layouts[node] = [(q[0], q[1], q[2], v[3]), (q[0], q[1], q[2])]
    return ()


_RULES: tuple[Rule, ...] = (
    _rule_same_layout,
    _rule_view,
    _rule_permute,
    _rule_squeeze,
    _rule_expand,
    _rule_reduction,
    _rule_mixes_along,
    _rule_windowed,
    _rule_layer_norm,
    _rule_batch_norm,
    _rule_matmul,
    _rule_embedding,
    _rule_arange,
    _rule_factory,
    _rule_slice,
    _rule_select,
    _rule_split,
    _rule_cat,
    _rule_attention,
)

__all__ = ["PaddingAnalysis", "analyze_padding", "expr_of", "padding_safety"]
