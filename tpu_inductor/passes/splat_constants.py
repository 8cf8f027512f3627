"""Pointwise ops on constants of one value, computed by PyTorch before torch-mlir.

Why: torch-mlir folds an elementwise op whose operands are splat literals
(``torch.ones``, ``torch.full``, ``full_like``) itself, and gets some of
them wrong (torch-mlir 20261001): a negative int is read as unsigned
(``torch.ones(4) + (-3)`` gave 1.8e19, so did ``* -3``), a comparison with
an int gives one answer whatever the values (``torch.ones(3) == 1`` gave
``False``, so ``cosine_embedding_loss`` with a target built in the graph
returned 0), and ``sign`` of a constant came back with the wrong sign. The
same ops on tensors computed at run time are right; only the folding is
wrong. So no such fold is left to it: every pointwise op (and dtype
conversion, copy, or view) whose tensor operands are all splat constants is
evaluated here by PyTorch on one element, with eager's arithmetic and type
promotion, and becomes a ``full`` of that value, which torch-mlir only
materializes.

Static shapes only: a splat sized by a symbol is left as it is. A 0-d
constant that is not a splat (a sum of an iota) and feeds a comparison is
computed on the host instead (placement/placement.py's
``constant_fold_hazards``); ``scalar_tensor_as_full`` runs first, so that
``scalar_tensor`` constants are splats here too.

Before: ``%c = full([4], 1.0); %e = eq.Scalar(%c, 1)``
After:  ``%e = full([4], True, dtype=bool)``
"""

from __future__ import annotations

from typing import Any, Optional

import torch
import torch.fx

from tpu_inductor.torch_api import unset_fake_temporarily
from tpu_inductor.passes.rewrite import replace_with_call

aten = torch.ops.aten

_SHAPE_ONLY = frozenset({
    aten._to_copy.default, aten.clone.default, aten.expand.default, aten.view.default,
    aten.reshape.default, aten._unsafe_view.default, aten.unsqueeze.default, aten.squeeze.dim,
    aten.squeeze.dims, aten.squeeze.default, aten.permute.default, aten.t.default,
    aten.transpose.int, aten.slice.Tensor, aten.alias.default,
})
"""Ops that keep a splat a splat of the same value (at most a new dtype or shape)."""


def _static_real_value(node: torch.fx.Node) -> Optional[torch.Tensor]:
    """``node``'s FakeTensor value where it is a tensor, not complex, of static shape."""
    value = node.meta.get("val")
    if not isinstance(value, torch.Tensor) or value.is_complex() or not all(isinstance(n, int) for n in value.shape):
        return None
    return value


def _element_shape(value: torch.Tensor) -> list[int]:
    """0-d for a 0-d value, else 1-d: the rank class eager's type promotion reads."""
    return [1] * min(value.dim(), 1)


def _splat_value(node: torch.fx.Node, value: torch.Tensor) -> Optional[torch.Tensor]:
    """A 1-element tensor holding the only value of ``node``, a ``full``, or None."""
    if node.target in (aten.full.default, aten.full_like.default):
        fill = node.args[1]
        if isinstance(fill, (bool, int, float)):
            with unset_fake_temporarily():
                return torch.full(_element_shape(value), fill, dtype=value.dtype)
    return None


def _evaluated(
    node: torch.fx.Node, value: torch.Tensor, splats: dict[torch.fx.Node, torch.Tensor]
) -> Optional[torch.Tensor]:
    """``node`` run by PyTorch on its splat operands' single elements."""
    target = node.target
    operands = [a for a in (*node.args, *node.kwargs.values()) if isinstance(a, torch.fx.Node)]
    if not operands or any(a not in splats for a in operands):
        return None
    shaped = _element_shape(value)
    with unset_fake_temporarily():
        if target in _SHAPE_ONLY:
            return splats[operands[0]].reshape(-1)[0].to(value.dtype).reshape(shaped)
        if (
            not isinstance(target, torch._ops.OpOverload)
            or torch.Tag.pointwise not in target.tags
            or torch.Tag.nondeterministic_seeded in target.tags
            or target._schema.is_mutable  # an in-place op's target must stay written
        ):
            return None
        if any(isinstance(a, (list, tuple)) for a in node.args):
            return None
        args = [splats[a] if isinstance(a, torch.fx.Node) else a for a in node.args]
        kwargs = {k: splats[v] if isinstance(v, torch.fx.Node) else v for k, v in node.kwargs.items()}
        result = target(*args, **kwargs)
        if not isinstance(result, torch.Tensor) or result.numel() != 1 or result.dtype != value.dtype:
            return None
        return result.reshape(shaped)


def _full_of(value: torch.Tensor, element: torch.Tensor) -> tuple[tuple, dict[str, Any]]:
    kwargs = {"dtype": value.dtype, "device": value.device, "pin_memory": False}
    with unset_fake_temporarily():
        return (list(value.shape), element.item()), kwargs


def splat_constants(gm: torch.fx.GraphModule) -> torch.fx.GraphModule:
    splats: dict[torch.fx.Node, torch.Tensor] = {}
    changed = False
    for node in list(gm.graph.nodes):
        value = _static_real_value(node) if node.op == "call_function" else None
        if value is None:
            continue
        element = _splat_value(node, value)
        if element is None:
            element = _evaluated(node, value, splats)
            if element is None:
                continue
            node = replace_with_call(gm, node, aten.full.default, *_full_of(value, element))
            changed = True
        splats[node] = element
    if changed:
        gm.recompile()  # the constants left without users go in remove_dead_code
    return gm
