"""Replace a materialised lower-triangular attention mask with ``is_causal``.

Why: models that build their causal mask in ``forward``
(``torch.ones(L, L, dtype=torch.bool).tril()``, or the float form with
``-inf`` above the diagonal) hand attention a mask tensor where
``is_causal=True`` says the same. With the mask, passes/attention.py must add
it to every score and guard against rows it hides entirely (an ``amax`` and a
``where`` over the [B, H, L, S] scores); causal attention needs neither, and
it computes its mask from positions inside the fused attention.

A mask qualifies when it is computed from constants alone (no graph input
reaches it) and its value, evaluated once at compile time, is exactly
PyTorch's causal mask (``ones(L, S).tril()``, the upper-left alignment
``is_causal`` uses) along every broadcast dim: ``True``/``False`` for a
boolean mask, ``0``/``-inf`` for a float one. A mask that depends on an
input (a padding mask, a KV-cache offset) is left as it is.

Before::

    mask = where(le(arange(L)[None] - arange(L)[:, None], 0), 0.0, -inf)
    attn = _scaled_dot_product_flash_attention_for_cpu(q, k, v, attn_mask=mask)

After::

    attn = _scaled_dot_product_flash_attention_for_cpu(q, k, v, 0.0, True)
"""

from __future__ import annotations

from typing import Optional

import torch
import torch.fx
from tpu_inductor.torch_api import unset_fake_temporarily

from tpu_inductor.decompositions.table import CPU_FLASH_ATTENTION, flash_attention_flags

aten = torch.ops.aten

_MAX_MASK_ELEMENTS = 1 << 24
"""Larger masks are not evaluated at compile time (64 MiB of float32)."""


def causal_masks_as_is_causal(gm: torch.fx.GraphModule) -> torch.fx.GraphModule:
    """Turn each CPU attention's constant causal mask into ``is_causal=True``."""
    changed = False
    values: dict[torch.fx.Node, Optional[torch.Tensor]] = {}  # one evaluation per mask, shared by layers
    for node in gm.graph.find_nodes(op="call_function", target=CPU_FLASH_ATTENTION):
        mask = node.kwargs.get("attn_mask")
        dropout, is_causal = flash_attention_flags(node)
        if mask is None or is_causal:
            continue
        queries, keys = node.args[0].meta["val"].shape[-2], node.args[1].meta["val"].shape[-2]
        # Compilers run under the tracing fake mode: the evaluation is real.
        with unset_fake_temporarily():
            if mask not in values:
                values[mask] = _constant_value(gm, mask)
            if values[mask] is None or not _is_causal_mask(values[mask], queries, keys):
                continue
        node.args = (*node.args[:3], dropout, True)
        node.kwargs = {k: v for k, v in node.kwargs.items() if k not in ("attn_mask", "dropout_p", "is_causal")}
        changed = True
    if changed:
        gm.graph.eliminate_dead_code()
        gm.recompile()
    return gm


def _constant_value(gm: torch.fx.GraphModule, node: torch.fx.Node) -> Optional[torch.Tensor]:
    """``node``'s value when only constants reach it (small enough to evaluate), else None."""
    value = node.meta.get("val")
    if not isinstance(value, torch.Tensor) or not all(isinstance(s, int) for s in value.shape):
        return None
    if value.numel() > _MAX_MASK_ELEMENTS:
        return None
    ancestors: set[torch.fx.Node] = set()
    stack = [node]
    while stack:
        current = stack.pop()
        if current in ancestors:
            continue
        ancestors.add(current)
        if current.op == "get_attr":
            continue
        if current.op != "call_function" or not isinstance(current.target, torch._ops.OpOverload):
            return None  # a graph input, or symbolic-size arithmetic
        if torch.Tag.nondeterministic_seeded in current.target.tags:
            return None  # a random mask differs from call to call
        stack.extend(current.all_input_nodes)
    order = {n: i for i, n in enumerate(gm.graph.nodes)}
    values: dict[torch.fx.Node, object] = {}
    for current in sorted(ancestors, key=order.__getitem__):
        if current.op == "get_attr":
            values[current] = getattr(gm, current.target)
            continue
        args, kwargs = torch.fx.node.map_arg((current.args, current.kwargs), values.__getitem__)
        values[current] = current.target(*args, **kwargs)
    result = values[node]
    return result if isinstance(result, torch.Tensor) else None


def _is_causal_mask(value: torch.Tensor, queries: int, keys: int) -> bool:
    if value.dim() < 2 or tuple(value.shape[-2:]) != (queries, keys):
        return False
    visible = torch.ones(queries, keys, dtype=torch.bool).tril()
    if value.dtype == torch.bool:
        return bool((value == visible).all())
    if not value.is_floating_point():
        return False
    expected = torch.zeros(queries, keys, dtype=value.dtype).masked_fill(~visible, float("-inf"))
    return bool((value == expected).all())
