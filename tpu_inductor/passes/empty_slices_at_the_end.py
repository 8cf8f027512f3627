"""Move an empty ``slice`` to the end of its dim: ``x[:0]`` as ``x[n:n]``.

Why: torch-mlir 20261001 reads a slice's end of 0 as the dim's size, so
``x[:0]`` of a ``[4]`` tensor lowers to all four elements, and the verifier
rejects it (``'stablehlo.slice' op inferred type(s) 'tensor<4xf32>' are
incompatible with return type(s) of operation 'tensor<0xf32>'``): the island
is split and the slice runs in eager. It comes from user code and from
decompositions (``unfold`` of a 0-d tensor with ``size`` 0 is
``x.reshape(1)[:0]``). The same empty result sliced at the dim's end
lowers; ``x[2:2]`` always did.

Before: ``slice(x, 0, 0, 0)``  (x: [4])
After:  ``slice(x, 0, 4, 4)``

Only static dims are moved; a symbolic dim keeps its slice.
"""

from __future__ import annotations

import torch
import torch.fx

aten = torch.ops.aten


def empty_slices_at_the_end(gm: torch.fx.GraphModule) -> torch.fx.GraphModule:
    changed = False
    for node in gm.graph.find_nodes(op="call_function", target=aten.slice.Tensor):
        base, result = node.args[0].meta.get("val"), node.meta.get("val")
        if not isinstance(base, torch.Tensor) or not isinstance(result, torch.Tensor) or base.dim() == 0:
            continue
        dim = node.args[1] if len(node.args) > 1 else node.kwargs.get("dim", 0)
        if not isinstance(dim, int):
            continue
        dim %= base.dim()
        size, kept = base.shape[dim], result.shape[dim]
        if isinstance(size, int) and isinstance(kept, int) and kept == 0:
            node.args = (node.args[0], dim, size, size, 1)
            node.kwargs = {}
            changed = True
    if changed:
        gm.recompile()
    return gm
