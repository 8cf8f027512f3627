"""Graphs that only update their inputs in place run as Dynamo traced them.

Why: an optimizer step (``param.add_(grad, alpha=-lr)`` for every
parameter) is elementwise arithmetic written into tensors the graph does not
return. XLA cannot write into torch's memory: it fills new buffers, and
AOTAutograd copies each back into its parameter, so every byte crosses
memory three times instead of once. In the MLP training step of
``benchmarks/perf.py`` (3x1024, CPU client) the SGD graph took 3.4-6 ms on the
device against 0.56 ms for eager's in-place update.

Only on a device that shares memory with torch (see
``Config.eager_kernels``): on a TPU the parameters live on the device, and
so does their update. A graph with any non-elementwise op (a matmul, a
reduction) or a tensor output is lowered as usual.
"""

from __future__ import annotations

import functools
import operator
from typing import Optional

import torch
import torch.fx

from tpu_inductor import torch_api

_ARITHMETIC = frozenset(
    {operator.add, operator.sub, operator.mul, operator.truediv, operator.neg, operator.pow,
     operator.iadd, operator.isub, operator.imul, operator.itruediv, operator.getitem}
)
_GRAD_MODE = frozenset({torch_api.SET_GRAD_ENABLED})


def in_place_update_reason(gm: torch.fx.GraphModule) -> Optional[str]:
    """Why ``gm`` should run eagerly in place, or None when it should be lowered."""
    updates = 0
    for node in gm.graph.nodes:
        if node.op == "output":
            if any(isinstance(getattr(n, "meta", {}).get("example_value"), torch.Tensor)
                   for n in node.all_input_nodes):
                return None
        elif node.op in ("call_function", "call_method"):
            if isinstance(node.target, torch._ops.OpOverload):  # prims.fma from Dynamo's lerp_
                if torch.Tag.pointwise not in node.target.tags:
                    return None
                continue
            name = node.target if node.op == "call_method" else getattr(node.target, "__name__", "")
            if _is_in_place(name):
                updates += 1
            elif node.target not in _ARITHMETIC | _GRAD_MODE and not _is_pointwise(name):
                return None
        elif node.op == "call_module":
            return None
    if not updates:
        return None
    return (
        f"the graph only updates its inputs in place ({updates} in-place ops, such as an "
        "optimizer step): eager writes them in place, a device would write new buffers to copy back"
    )


def _is_in_place(name: str) -> bool:
    if not name.endswith("_") or name.endswith("__"):
        return False
    return name == "copy_" or _is_pointwise(name.rstrip("_"))  # copy_ is untagged


@functools.cache
def _is_pointwise(name: str) -> bool:
    """Whether ATen's op of this name is elementwise (foreach ops are, per tensor)."""
    name = name.removeprefix("_foreach_")
    packet = getattr(torch.ops.aten, name, None)
    if not isinstance(packet, torch._ops.OpOverloadPacket):
        return False
    return any(torch.Tag.pointwise in getattr(packet, o).tags for o in packet.overloads())
