"""Size expressions of a padded graph, evaluated at every call as compiled Python.

Why: each call of a dynamic-shape graph works sizes out of its symbols'
values: the bucket's sizes its inputs are padded to, the real sizes its
outputs are cut back to, its ``valid_<size>`` inputs and the sizes it
returns as numbers. Substituting into sympy expressions costs ~5 us an
expression (``xreplace`` and ``int``), about 20 of them a decode step of a
2-layer Llama: an eighth of the step, where Inductor pays nothing of the
kind. Here each graph's expressions are printed once as Python, by the
printer Dynamo's own guards are evaluated with (``torch_api.PythonPrinter``:
``FloorDiv`` as ``//``, ``Max`` as ``max``), and compiled into one function of
the symbols' values; an expression the printer does not know is substituted
as before.
"""

from __future__ import annotations

import math
from typing import Any, Callable, Mapping, Sequence

import sympy
import torch

from tpu_inductor import torch_api


class SizeFunction:
    """``exprs`` as one function of the values of their symbols."""

    def __init__(self, exprs: Sequence[sympy.Expr]) -> None:
        self.exprs = tuple(sympy.sympify(e) for e in exprs)
        self.symbols: tuple[sympy.Symbol, ...] = tuple(
            sorted(set().union(*(e.free_symbols for e in self.exprs)), key=str)
        )
        self._compiled = _compile(self.symbols, self.exprs)

    def __call__(self, values: Mapping[sympy.Symbol, int]) -> tuple[int, ...]:
        """Each expression's value (an int) at the symbols' ``values``."""
        if self._compiled is not None:
            return self._compiled(*[values[s] for s in self.symbols])
        substitution = {s: sympy.Integer(values[s]) for s in self.symbols}
        return tuple(int(e.xreplace(substitution)) for e in self.exprs)


def _compile(symbols: tuple[sympy.Symbol, ...], exprs: tuple[sympy.Expr, ...]) -> Callable[..., tuple] | None:
    """The generated function, or None where an expression does not print as
    Python over integers (it is then substituted)."""
    if not all(s.name.isidentifier() for s in symbols):
        return None
    try:
        printer = torch_api.PythonPrinter()
        body = ", ".join(f"int({printer.doprint(e)})" for e in exprs)
    except Exception:  # an expression this torch's printer does not know
        return None
    source = f"lambda {', '.join(s.name for s in symbols)}: ({body}{',' if exprs else ''})"
    namespace: dict[str, Any] = {"math": math, "torch": torch}
    try:
        return eval(source, namespace)  # noqa: S307 - our own printed sizes, no user text
    except SyntaxError:
        return None
