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
from typing import Any, Iterable, Mapping, Optional, Sequence

import sympy
import torch
import torch.fx

from tpu_inductor.dynamic import SYMBOLIC_TYPES
from tpu_inductor.errors import user_source_line
from tpu_inductor.decompositions.table import CPU_FLASH_ATTENTION
from tpu_inductor.analysis.real_lengths import is_extent

aten = torch.ops.aten
prims = torch.ops.prims

Factor = sympy.Expr
Dim = tuple[Factor, ...]
Layout = tuple[Dim, ...]
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
    if isinstance(value, SYMBOLIC_TYPES):
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

    def dim_from_size(self, size: Any, prefix: bool = False) -> Dim:
        """A fresh dim of ``size``. ``prefix``: the op keeps real positions
        first and padding last along it (an input padded at the end, a fill,
        ``arange``, a cache after ``cat``), so a compound size like
        ``s0 + 1`` is an extent whose real part is a prefix."""
        expr = expr_of(size) if not isinstance(size, sympy.Basic) else size
        if expr.free_symbols and not isinstance(expr, sympy.Symbol) and not (prefix and is_extent(expr)):
            # A compound size (2*s0 from a view...): positions are not tracked.
            self.mark(expr.free_symbols, f"makes a dim of size {expr}")
        return (expr,)

    def agreed_dim(self, dims: Sequence[Dim], why: str, size: Any) -> Dim:
        """The layout every one of ``dims`` has, or else a fresh dim of ``size``
        with the symbols of them all marked unsafe for ``why``."""
        if all(d == dims[0] for d in dims):
            return dims[0]
        self.mark(_free(f for d in dims for f in d), why)
        return self.dim_from_size(size)
    def _plain(self, shape: Sequence[Any], prefix: bool = False) -> Layout:
        return tuple(self.dim_from_size(s, prefix) for s in shape)

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
            # Inputs are padded at the end of each padded dim (dynamic/padding.py).
            self.layouts[node] = self._plain(val.shape, prefix=True)
            self.aliases_input.add(node)
        elif isinstance(val, SYMBOLIC_TYPES):
            self.symbols |= expr_of(val).free_symbols

    def _outputs(self, node: torch.fx.Node) -> None:
        outputs = node.args[0]
        outputs = outputs if isinstance(outputs, (list, tuple)) else (outputs,)
        for out in outputs:
            if not isinstance(out, torch.fx.Node):
                continue
            val = out.meta.get("val")
            if isinstance(val, SYMBOLIC_TYPES):
                continue  # a size returned as a number is computed from the real sizes (dynamic/padding.py)
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
        from tpu_inductor.passes.padded_positions import real_valued_arguments  # it imports this module

        allowed = set(size_args) | set(real_valued_arguments(node))
        for name, value in _named_args(node).items():
            if name in allowed:
                continue
            for item in _flatten(value):
                sym = item.meta.get("val") if isinstance(item, torch.fx.Node) else item
                if isinstance(sym, SYMBOLIC_TYPES):
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
        # The rules read this module; importing both registers every rule.
        from tpu_inductor.analysis import padding_rules, padding_rules_positions  # noqa: F401

        rule = padding_rules.RULES.get(target)
        if rule is not None:
            return rule(self, node, target)
        if torch.Tag.pointwise in target.tags and isinstance(node.meta.get("val"), torch.Tensor):
            self._pointwise(node)
            return ()
        self._unknown(node)
        return ()

    def _pointwise(self, node: torch.fx.Node, inputs: Optional[Sequence] = None) -> None:
        tensors = [a for a in (inputs or _flatten_nodes(node)) if self.layout(a) is not None]
        self.layouts[node] = self.broadcast_layout(
            tensors, node.meta["val"].shape, "combines differently laid out dims"
        )

    def broadcast_layout(self, tensors: Sequence[torch.fx.Node], shape: Sequence[Any], why: str) -> Layout:
        """The layout of ``tensors`` broadcast together to ``shape`` (their
        dims aligned from the right; differing dims are unsafe for ``why``)."""
        rank = len(shape)
        layout = []
        for k in range(rank):
            candidates = []
            for arg in tensors:
                arg_layout = self.layout(arg)
                index = k - (rank - len(arg_layout))
                if index >= 0 and arg_layout[index] != _ONE:
                    candidates.append(arg_layout[index])
            if not candidates:
                layout.append(self.dim_from_size(shape[k]))
            else:
                layout.append(self.agreed_dim(candidates, why, shape[k]))
        return tuple(layout)


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
        elif isinstance(v, SYMBOLIC_TYPES):
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


__all__ = ["PaddingAnalysis", "analyze_padding", "expr_of", "padding_safety"]
