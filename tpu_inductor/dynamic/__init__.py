"""Dynamic shapes: one trace, one lowering, a few bucket executables, a budget.

When Dynamo hands over a graph with symbolic sizes, :mod:`.graph` lowers it
once with dynamic dims, pads inputs up to buckets (:mod:`.buckets`) along the
dims the padding analysis proves safe, specialises the one StableHLO module
per bucket by shape refinement (:mod:`.island`), slices outputs back
(:mod:`.padding`), and runs shapes past the recompile budget eagerly. This
module only answers "is this graph dynamic, and along which dims" and is
cheap to import.
"""

from __future__ import annotations

from typing import Any, Sequence

import torch

SYMBOLIC_TYPES = (torch.SymInt, torch.SymFloat, torch.SymBool)
"""The types of a symbolic size or number, for ``isinstance`` everywhere."""


def has_symbolic_inputs(example_inputs: Sequence[Any]) -> bool:
    """True when any input is a SymInt or has a symbolic size or stride."""
    for value in example_inputs:
        if isinstance(value, SYMBOLIC_TYPES):
            return True
        if isinstance(value, torch.Tensor) and any(
            isinstance(s, torch.SymInt) for s in (*value.shape, *value.stride())
        ):
            return True
    return False


def shape_env_of(values: Sequence[Any]):
    """The ShapeEnv behind the first symbolic size among ``values`` (or None)."""
    for value in values:
        sizes = value.shape if isinstance(value, torch.Tensor) else (value,)
        for size in sizes:
            if isinstance(size, SYMBOLIC_TYPES) and size.node.shape_env is not None:
                return size.node.shape_env
    return None


def symbol_source(shape_env, symbol) -> str:
    """Where a symbol comes from in user terms, e.g. ``L['x'].size()[0]``."""
    sources = getattr(shape_env, "var_to_sources", {}).get(symbol) if shape_env else None
    if not sources:
        return str(symbol)
    name = sources[0].name
    return name() if callable(name) else str(name)


def dynamic_dims(gm: torch.fx.GraphModule) -> dict[str, str]:
    """Symbol -> source for a Dynamo graph's symbolic placeholder sizes."""
    values = [n.meta.get("example_value") for n in gm.graph.find_nodes(op="placeholder")]
    shape_env = shape_env_of([v for v in values if v is not None])
    found: dict[str, str] = {}
    for value in values:
        sizes = value.shape if isinstance(value, torch.Tensor) else (value,)
        for size in sizes:
            if isinstance(size, SYMBOLIC_TYPES):
                for symbol in size.node.expr.free_symbols:
                    found.setdefault(str(symbol), symbol_source(shape_env, symbol))
    return found
