"""Symbols from a call's arguments; inputs padded up to buckets; outputs sliced back.

Why: a dynamic graph's executables are keyed by its symbols' (bucketed)
values, so each call first reads those values off its arguments: a tensor dim
that *is* a symbol gives it directly, a SymInt argument gives its own. Inputs
are then zero-padded along the padded symbols' dims (zeros: a valid index for
embeddings, a harmless value everywhere else; the analysis guarantees no real
position reads a padded one), and every output dim that is a padded symbol is
cut back to the real size, so callers never see a padded shape.
"""

from __future__ import annotations

from typing import Any, Mapping, Optional, Sequence

import sympy
import torch
import torch.fx

from tpu_inductor.dynamic import SYMBOLIC_TYPES
from tpu_inductor.dynamic.device_caches import DeviceCaches
from tpu_inductor.dynamic.kept_padding import KeptPadding
from tpu_inductor.dynamic.size_functions import SizeFunction
from tpu_inductor.errors import LoweringError
from tpu_inductor.runtime import result_shards
from tpu_inductor.runtime.threads import on_calling_thread
from tpu_inductor.analysis.padding_safety import expr_of


@on_calling_thread
def _zero_extended(tensor: torch.Tensor, widths: list[int]) -> torch.Tensor:
    """``tensor`` zero-extended by ``widths`` (``constant_pad_nd``'s), on the
    calling thread alone. A copy gains nothing from a second thread (33x1024
    floats to 64 rows: 10.6 us on two threads, 11.2 on one), and the OpenMP
    workers it would start spin on the cores the island right after it runs
    on: perf.py's dynamic MLP (batch sizes 1..64, warm) took 238-280 ms a pass
    with them, 148-153 ms without (a padded batch of 33 ran 3.7-4.8 ms, the
    unpadded 64 in the same bucket 2.8-3.3)."""
    return torch.constant_pad_nd(tensor, widths, 0)


class ShapeBinding:
    """The symbols of one dynamic graph and where its arguments carry them."""

    def __init__(
        self,
        placeholders: Sequence[torch.fx.Node],
        outputs: Sequence[Any],
        padded: frozenset,
    ) -> None:
        """``outputs``: the graph's output nodes (or constants), in order."""
        self.padded = padded
        self._dims: list[tuple[int, int, sympy.Symbol]] = []
        self._compound: list[tuple[int, int, sympy.Expr]] = []
        self._scalars: list[tuple[int, sympy.Expr]] = []
        pad: dict[int, list[tuple[int, sympy.Expr]]] = {}
        symbols: set = set()
        for index, node in enumerate(placeholders):
            val = node.meta.get("val")
            if isinstance(val, torch.Tensor):
                for dim, size in enumerate(val.shape):
                    expr = expr_of(size)
                    symbols |= expr.free_symbols
                    if isinstance(expr, sympy.Symbol):
                        self._dims.append((index, dim, expr))
                        if expr in padded:
                            pad.setdefault(index, []).append((dim, expr))
                    elif expr.free_symbols:
                        self._compound.append((index, dim, expr))
                        if expr.free_symbols & padded:
                            pad.setdefault(index, []).append((dim, expr))
            elif isinstance(val, SYMBOLIC_TYPES):
                expr = expr_of(val)
                symbols |= expr.free_symbols
                self._scalars.append((index, expr))
        self.symbols: tuple[sympy.Symbol, ...] = tuple(sorted(symbols, key=str))
        # Outputs that are inputs returned as they are (saved for backward):
        # handed back from the call's own arguments, never padded.
        position = {node: index for index, node in enumerate(placeholders)}
        self._passthrough = {i: position[o] for i, o in enumerate(outputs) if o in position}
        # What pad() works out per call: each padded dim's bucket size, each padded scalar.
        padded_scalars = [(i, e) for i, e in self._scalars if e.free_symbols & padded]
        self._padded_dims = [(index, [dim for dim, _ in dims]) for index, dims in pad.items()]
        self._padded_scalars = [i for i, _ in padded_scalars]
        self._bucket_sizes = SizeFunction(
            [size for dims in pad.values() for _, size in dims] + [e for _, e in padded_scalars]
        )
        self._compile_real_sizes(outputs)

    def _compile_real_sizes(self, outputs: Sequence[Any]) -> None:
        """What unpad() works out per call: each size returned as a number
        (from the real sizes, never the bucket's), then the real shape of each
        output with a padded dim."""
        numbers: list[tuple[int, sympy.Expr]] = []
        cut: list[tuple[int, tuple[sympy.Expr, ...]]] = []
        for index, node in enumerate(outputs):
            val = node.meta.get("val") if isinstance(node, torch.fx.Node) else None
            if index in self._passthrough:
                continue
            if isinstance(val, torch.SymInt):
                numbers.append((index, expr_of(val)))
            elif isinstance(val, torch.Tensor):
                shape = tuple(expr_of(size) for size in val.shape)
                if any(e.free_symbols & self.padded for e in shape):
                    cut.append((index, shape))
        self._number_outputs = [i for i, _ in numbers]
        self._cut_outputs = [(i, len(shape)) for i, shape in cut]
        self._real_sizes = SizeFunction([e for _, e in numbers] + [e for _, shape in cut for e in shape])

    def bind(self, args: Sequence[Any]) -> dict[sympy.Symbol, int]:
        """Each symbol's value in this call."""
        env: dict[sympy.Symbol, int] = {}
        for index, dim, symbol in self._dims:
            env[symbol] = int(args[index].shape[dim])
        for index, expr in self._scalars:
            if isinstance(expr, sympy.Symbol):
                value = args[index]
                env[expr] = value if isinstance(value, float) else int(value)
        if len(env) < len(self.symbols):
            self._solve_rest(args, env)
        return env

    def _solve_rest(self, args: Sequence[Any], env: dict) -> None:
        """Symbols that only occur inside expressions (``2*s0``): solve for them."""
        pending = [(expr, int(args[i].shape[d])) for i, d, expr in self._compound]
        pending += [(expr, int(args[i])) for i, expr in self._scalars]
        progress = True
        while progress and len(env) < len(self.symbols):
            progress = False
            for expr, value in pending:
                unknown = [s for s in expr.free_symbols if s not in env]
                if len(unknown) != 1:
                    continue
                solutions = sympy.solve(sympy.Eq(expr.xreplace(env), value), unknown[0])
                integral = [int(x) for x in solutions if x.is_integer]
                if integral:
                    env[unknown[0]] = integral[0]
                    progress = True
        missing = [str(s) for s in self.symbols if s not in env]
        if missing:
            raise LoweringError(f"cannot read the sizes {missing} off the graph's arguments")

    def pad(
        self,
        args: Sequence[Any],
        bucket: Mapping[sympy.Symbol, int],
        kept: Optional[KeptPadding] = None,
        device_caches: Optional[DeviceCaches] = None,
    ) -> list[Any]:
        """``args`` with padded dims zero-extended and SymInt arguments at bucket
        values; ``kept``: padded copies of inputs written in place, reused while
        unchanged (dynamic/kept_padding.py); ``device_caches``: padded device
        copies of grown caches, handed on in their place (dynamic/device_caches.py)."""
        padded = list(args)
        values = iter(self._bucket_sizes(bucket))
        for index, dims in self._padded_dims:
            tensor = padded[index]
            extra = {dim: next(values) - int(tensor.shape[dim]) for dim in dims}
            # Before the check below: a cache that fills its bucket exactly has a kept copy too.
            if device_caches is not None and index in device_caches.inputs:
                on_device = device_caches.padded_copy(tensor, _padded_shape(tensor, extra))
                if on_device is not None:
                    padded[index] = on_device
                    continue
            if not any(extra.values()):
                continue
            keeping = kept is not None and index in kept.positions
            if keeping:
                reused = kept.reuse(index, tensor, _padded_shape(tensor, extra))
                if reused is not None:
                    padded[index] = reused
                    continue
            widths: list[int] = []
            for dim in reversed(range(tensor.dim())):
                widths += [0, extra.get(dim, 0)]
            padded[index] = _zero_extended(tensor, widths)
            if keeping:
                kept.keep(index, tensor, padded[index])
        for index in self._padded_scalars:
            padded[index] = next(values)
        return padded

    def unpad(
        self, outputs: Sequence[Any], sizes: Mapping[sympy.Symbol, int], args: Sequence[Any]
    ) -> list[Any]:
        """Outputs cut back to the real sizes along padded dims."""
        result = list(outputs)
        for index, arg_index in self._passthrough.items():
            result[index] = args[arg_index]
        values = iter(self._real_sizes(sizes))
        for index in self._number_outputs:
            result[index] = next(values)
        for index, rank in self._cut_outputs:
            real = [next(values) for _ in range(rank)]
            value = result[index]
            if not isinstance(value, torch.Tensor) or list(value.shape) == real:
                continue
            if value.dim() != rank or any(r > p for r, p in zip(real, value.shape)):
                raise LoweringError(
                    f"output {index} came back {tuple(value.shape)}, which cannot hold the "
                    f"expected {tuple(real)}"
                )
            padded = value
            for dim, size in enumerate(real):
                if value.shape[dim] != size:
                    value = value.narrow(dim, 0, size)
            result[index] = value.contiguous()
            result_shards.note_cut(padded, result[index])
        return result


def _padded_shape(tensor: torch.Tensor, extra: Mapping[int, int]) -> list[int]:
    """``tensor``'s shape with ``extra`` positions added per dim."""
    return [size + extra.get(dim, 0) for dim, size in enumerate(tensor.shape)]
