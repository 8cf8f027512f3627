"""Lower an ATen island with symbolic shapes to StableHLO once, with dynamic dims.

Why: re-tracing and re-lowering a graph for every concrete shape is what
makes dynamic shapes expensive on XLA backends. torch-mlir imports a graph
whose placeholders carry SymInt sizes as ``tensor<?x...>`` arguments (and
SymInt placeholders as ``i64`` scalars); the result is lowered once here and
each bucket's static module is derived from it by StableHLO shape refinement
(:mod:`tpu_inductor.lowering.refine`).

Scalar arguments: XLA cannot take a bare ``i64`` argument, so the positions
of SymInt placeholders are recorded; refinement replaces them with the
bucket's constant value (the bucket key already fixes every symbol, so this
costs no extra executable).
"""

from __future__ import annotations

import dataclasses
import time

import torch
import torch.fx

from tpu_inductor.dynamic import SYMBOLIC_TYPES
from tpu_inductor.lowering.constant_sizes import constant_sizes_as_ints
from tpu_inductor.lowering.half_floats_in_float32 import compute_half_floats_in_float32
from tpu_inductor.lowering.pipelines import to_stablehlo

_NUMBERS = (*SYMBOLIC_TYPES, int, float, bool)


@dataclasses.dataclass
class SymbolicModule:
    """StableHLO text with ``?`` dims for one island, and how to call it."""

    text: str
    scalar_positions: tuple[int, ...]
    """Placeholder positions that are SymInts (module ``i64`` arguments)."""
    seconds: float


def lower_symbolic(gm: torch.fx.GraphModule, name: str = "main", *, isolate: bool = True) -> SymbolicModule:
    """Lower ``gm`` (tensor and SymInt placeholders, tensor outputs) once;
    ``isolate``: torch-mlir's pipelines in the helper process (pipelines.py)."""
    from torch_mlir import fx as torch_mlir_fx

    started = time.perf_counter()
    compute_half_floats_in_float32(gm)  # eager's one rounding per op
    # A size specialised mid-trace must read as one static dim everywhere
    # (constant_sizes.py), or torch-mlir mixes ``?`` and ``7`` on one dim.
    with constant_sizes_as_ints(gm):
        module = torch_mlir_fx.stateless_fx_import(gm, output_type="raw", model_name=name)
    lowered = to_stablehlo(module, isolate=isolate, fix_up=False, text=True, label=" (dynamic shapes)")
    return SymbolicModule(
        text=lowered["text"],
        scalar_positions=scalar_positions(gm),
        seconds=time.perf_counter() - started,
    )


def scalar_positions(gm: torch.fx.GraphModule) -> tuple[int, ...]:
    """Positions of ``gm``'s placeholders that are numbers (module ``i64`` arguments)."""
    placeholders = gm.graph.find_nodes(op="placeholder")
    return tuple(i for i, n in enumerate(placeholders) if isinstance(n.meta.get("val"), _NUMBERS))
