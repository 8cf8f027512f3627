"""Let attention read grouped key/value heads in place instead of repeated.

Why: in grouped-query attention each key/value head serves ``g`` query heads.
Models that predate SDPA's own support for that (transformers' ``repeat_kv``,
which its SDPA attention uses whenever an attention mask is passed) copy every
key and value head ``g`` times before attention. The CPU attention op takes
fewer key/value heads than query heads as they are, and
passes/attention.py computes such attention per key/value head, so the copies
are pure memory traffic: ``2 * g`` times the key/value cache, every call.

Before::

    k_rep = view(clone(expand(unsqueeze(k, 2), [B, Hk, g, S, D])), [B, Hk * g, S, D])
    v_rep = ...same for v...
    out = _scaled_dot_product_flash_attention_for_cpu(q, k_rep, v_rep, attn_mask=m)

After::

    out = _scaled_dot_product_flash_attention_for_cpu(q, k, v, attn_mask=m)

Query head ``h`` reads key/value head ``h // g`` either way. Only static
shapes, and only when key and value are repeated alike.
"""

from __future__ import annotations

from typing import Optional

import torch
import torch.fx

from tpu_inductor.decompositions.table import CPU_FLASH_ATTENTION

aten = torch.ops.aten

_MERGES = frozenset({aten.view.default, aten._unsafe_view.default, aten.reshape.default})


def read_kv_heads_in_place(gm: torch.fx.GraphModule) -> torch.fx.GraphModule:
    """Point each CPU attention at the key/value heads its inputs repeat."""
    changed = False
    for node in gm.graph.find_nodes(op="call_function", target=CPU_FLASH_ATTENTION):
        key, value = (_unrepeated(arg) for arg in node.args[1:3])
        if key is None or value is None or key[1] != value[1]:
            continue
        node.args = (node.args[0], key[0], value[0], *node.args[3:])
        changed = True
    if changed:
        gm.graph.eliminate_dead_code()
        gm.recompile()
    return gm


def _unrepeated(node: torch.fx.Node) -> Optional[tuple[torch.fx.Node, int]]:
    """``(x, g)`` where ``node`` is ``x``'s heads each repeated ``g`` times
    (the pattern in the module docstring), else None."""
    if node.op != "call_function" or node.target not in _MERGES:
        return None
    expanded = node.args[0]
    if expanded.op == "call_function" and expanded.target is aten.clone.default:
        expanded = expanded.args[0]
    if expanded.op != "call_function" or expanded.target is not aten.expand.default:
        return None
    unsqueezed = expanded.args[0]
    if unsqueezed.op != "call_function" or unsqueezed.target is not aten.unsqueeze.default:
        return None
    source, dim = unsqueezed.args
    value, result = source.meta.get("val"), node.meta.get("val")
    if dim != 2 or not isinstance(value, torch.Tensor) or value.dim() != 4:
        return None
    sizes = [*value.shape, *result.shape, *expanded.args[1]]
    if not all(isinstance(s, int) for s in sizes):
        return None
    batch, heads, length, head_dim = value.shape
    group = expanded.args[1][2]
    if list(expanded.args[1]) != [batch, heads, group, length, head_dim]:
        return None
    if list(result.shape) != [batch, heads * group, length, head_dim]:
        return None
    return source, group
