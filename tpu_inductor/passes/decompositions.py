"""The decomposition table AOTAutograd applies while tracing ATen graphs.

Why: torch-mlir lowers core ATen, not the long tail of composite ops. We take
torch-mlir's own table (PyTorch's core ATen decompositions minus those whose
output torch-mlir cannot lower, plus the overloads it needs) so what reaches
the importer is what it was built for. Before: ``aten.native_layer_norm(x, ..)``;
after: ``mean``/``var``/``rsqrt``/``mul``/``add`` that lower one-to-one.
"""

from __future__ import annotations

import functools
from typing import Callable

import torch

aten = torch.ops.aten

# Ops we keep whole although core ATen would decompose them, because the
# decomposition produces something worse for XLA or for the fallback.
_KEEP: tuple = ()


@functools.cache
def decomposition_table() -> dict[torch._ops.OperatorBase, Callable]:
    from torch_mlir.extras.fx_decomp_util import get_decomposition_table

    table = dict(get_decomposition_table())
    for op in _KEEP:
        table.pop(op, None)
    return table
