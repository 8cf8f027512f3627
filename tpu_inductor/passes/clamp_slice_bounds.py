"""Clamp ``slice_scatter`` bounds to the size of the dim they index.

Why: ``x[:, 8:] = y`` reaches the graph as ``slice_scatter(x, y, 1, 8,
9223372036854775807)`` (functionalisation keeps Python's open end), and
torch-mlir 20261001 sizes its lowering from the unclamped end: it asked for
so much memory that the process was killed (17 GB resident before the OOM
killer, Hugging Face's axk2), or failed with ``std::bad_alloc``. Clamped to
the dim (with Python's negative-index and empty-slice rules) the same op
lowers and computes the same values.

Before: ``slice_scatter(x, y, 1, 8, 9223372036854775807)``  (x: [2, 16])
After:  ``slice_scatter(x, y, 1, 8, 16)``
"""

from __future__ import annotations

import torch
import torch.fx

aten = torch.ops.aten


def clamp_slice_bounds(gm: torch.fx.GraphModule) -> torch.fx.GraphModule:
    changed = False
    for node in gm.graph.find_nodes(op="call_function", target=aten.slice_scatter.default):
        base = node.args[0].meta.get("val")
        dim, start, end, step = _arguments(node)
        size = base.shape[dim] if isinstance(base, torch.Tensor) else None
        if not all(isinstance(v, int) for v in (size, start, end)):
            continue  # symbolic: refinement fixes these once sizes are known
        clamped = _clamp(start, size), _clamp(end, size)
        clamped = clamped[0], max(clamped)
        if clamped != (start, end):
            node.args = (node.args[0], node.args[1], dim, *clamped, step)
            node.kwargs = {}
            changed = True
    if changed:
        gm.recompile()
    return gm


def _arguments(node: torch.fx.Node) -> tuple:
    """(dim, start, end, step) with the schema's defaults filled in."""
    names = ("dim", "start", "end", "step")
    defaults = (0, None, None, 1)
    values = list(node.args[2:]) + [None] * (4 - len(node.args[2:]))
    filled = [node.kwargs.get(n, v if v is not None else d) for n, v, d in zip(names, values, defaults)]
    dim, start, end, step = filled
    base = node.args[0].meta.get("val")
    if isinstance(base, torch.Tensor) and isinstance(dim, int) and dim < 0:
        dim += base.dim()
    return dim, 0 if start is None else start, 2**63 - 1 if end is None else end, step


def _clamp(index: int, size: int) -> int:
    if index < 0:
        index += size
    return min(max(index, 0), size)
