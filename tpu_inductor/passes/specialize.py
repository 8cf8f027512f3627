"""Re-trace a graph with symbolic shapes at one concrete input signature.

Why: XLA compiles static shapes. When Dynamo hands us a graph with SymInt
sizes or SymInt arguments, each distinct concrete signature gets its own
static ATen graph, traced from the symbolic one under FakeTensor (no compute)
with node metadata, including user stack traces, carried over.
Before: ``view(x, [s0, 4])`` with ``s0`` a placeholder; after, for
``x: [8, 4]``: ``view(x, [8, 4])`` and the SymInt argument is a constant.
"""

from __future__ import annotations

from typing import Any, Sequence

import torch
import torch.fx
from torch.fx import traceback as fx_traceback
from torch.fx.experimental.proxy_tensor import make_fx


def has_symbolic_inputs(example_inputs: Sequence[Any]) -> bool:
    for value in example_inputs:
        if isinstance(value, torch.SymInt | torch.SymFloat | torch.SymBool):
            return True
        if isinstance(value, torch.Tensor) and any(
            isinstance(s, torch.SymInt) for s in (*value.shape, *value.stride())
        ):
            return True
    return False


def specialize(gm: torch.fx.GraphModule, concrete_inputs: Sequence[Any]) -> torch.fx.GraphModule:
    """A static graph computing ``gm`` for inputs shaped like ``concrete_inputs``."""
    interpreter = torch.fx.Interpreter(gm)
    with fx_traceback.preserve_node_meta():
        static = make_fx(interpreter.run, tracing_mode="fake")(*concrete_inputs)
    static.graph.eliminate_dead_code()
    static.recompile()
    return static
