"""Dead-code elimination.

Why: AOTAutograd leaves nodes whose results nobody reads (shape queries,
views of saved tensors that the partitioner dropped). Each one would become an
island input, an output, or an eager call for nothing.
Before: ``%v = aten.view(%x, [4]) (no users)``; after: gone.
Impure ops (in-place, random) are kept by FX's own purity check.
"""

from __future__ import annotations

import torch.fx


def remove_dead_code(gm: torch.fx.GraphModule) -> torch.fx.GraphModule:
    if gm.graph.eliminate_dead_code():
        gm.recompile()
    return gm
