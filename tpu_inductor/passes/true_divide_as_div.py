"""Rewrite ``aten.true_divide`` as ``aten.div``, the same op by another name.

Why: under ``torch.compile(..., dynamic=True)`` Dynamo traces a Python
float's arithmetic symbolically and then writes it as 0-d float64 tensor ops
(``torch.fx.passes._tensorify_python_scalars``), a division as
``true_divide``, which torch-mlir has no pattern for. It failed a lowering (a
warning and a reproducer on the user's terminal) and ran eagerly, splitting
the island: GPT-2's GELU (``math.sqrt(2.0 / math.pi)``) did so in every
graph. The nodes come after AOTAutograd's decompositions, so this is a pass.

Before: ``%q = aten.true_divide.Tensor(%a, %b)``
After:  ``%q = aten.div.Tensor(%a, %b)``
"""

from __future__ import annotations

import torch
import torch.fx

from tpu_inductor.passes.rewrite import replace_with_call

aten = torch.ops.aten

_AS_DIV = {aten.true_divide.Tensor: aten.div.Tensor, aten.true_divide.Scalar: aten.div.Scalar}


def true_divide_as_div(gm: torch.fx.GraphModule) -> torch.fx.GraphModule:
    changed = False
    for node in list(gm.graph.nodes):
        if node.op == "call_function" and node.target in _AS_DIV:
            replace_with_call(gm, node, _AS_DIV[node.target], node.args, dict(node.kwargs))
            changed = True
    if changed:
        gm.recompile()
    return gm
