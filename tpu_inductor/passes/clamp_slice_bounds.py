"""Clamp ``slice_scatter`` bounds to the size of the dim they index.

Why: ``x[:, 8:] = y`` reaches the graph as ``slice_scatter(x, y, 1, 8,
9223372036854775807)`` (functionalisation keeps Python's open end), and
torch-mlir 20261001 sizes its lowering from the unclamped end: it asked for
so much memory that the process was killed (17 GB resident before the OOM
killer, Hugging Face's axk2), or failed with ``std::bad_alloc``. Clamped to
the dim (with Python's negative-index and empty-slice rules) the same op
lowers and computes the same values.

Before: ``slice_scatter(x, y, 1, 8, 9223372036854775807)``  (x: [2, 16])
After:  ``slice_scatter(x, y, 1, 8, 16)``; along a symbolic dim, ``x[:] = y``
becomes ``clone(y)`` and ``x[8:] = y`` ends at ``sym_size(x, 1)``.
"""

from __future__ import annotations

import torch
import torch.fx

aten = torch.ops.aten


def clamp_slice_bounds(gm: torch.fx.GraphModule) -> torch.fx.GraphModule:
    changed = False
    for node in list(gm.graph.find_nodes(op="call_function", target=aten.slice_scatter.default)):
        base = node.args[0].meta.get("val")
        dim, start, end, step = _arguments(node)
        size = base.shape[dim] if isinstance(base, torch.Tensor) else None
        if isinstance(size, torch.SymInt) and isinstance(start, int) and start >= 0 and isinstance(end, int) and end >= _OPEN_END:
            # A symbolic dim to Python's open end: its symbolic lowering hit the same
            # std::bad_alloc, and torch-mlir has no lowering for a non-constant end.
            with gm.graph.inserting_before(node):
                if start == 0 and step == 1:
                    # The whole dim (a sliding-window cache's ``keys[:] = new``): the source.
                    whole = gm.graph.call_function(aten.clone.default, (node.args[1],))
                    whole.meta = dict(node.meta)
                    node.replace_all_uses_with(whole)
                    gm.graph.erase_node(node)
                else:  # end at the dim's size, read off the base (an error, not a std::bad_alloc)
                    end_node = gm.graph.call_function(aten.sym_size.int, (node.args[0], dim))
                    end_node.meta["val"] = size
                    node.args = (node.args[0], node.args[1], dim, start, end_node, step)
                    node.kwargs = {}
            changed = True
            continue
        if not all(isinstance(v, int) for v in (size, start, end)):
            continue
        clamped = _clamp(start, size), _clamp(end, size)
        clamped = clamped[0], max(clamped)
        if clamped != (start, end):
            node.args = (node.args[0], node.args[1], dim, *clamped, step)
            node.kwargs = {}
            changed = True
    if changed:
        gm.recompile()
    return gm


_OPEN_END = 2**62
"""An end at least this large is Python's open end (``x[:, 8:]``)."""


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
