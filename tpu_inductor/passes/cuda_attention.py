"""CUDA's fused attention ops as the CPU attention op the attention pass builds.

Why: an inference graph keeps scaled-dot-product attention whole through
tracing (decompositions/table.py), and passes/attention.py builds it from
ATen ops, for the CPU op ``_scaled_dot_product_flash_attention_for_cpu``.
Traced with CUDA tensors, the same attention is one of CUDA's kernels
instead -- memory-efficient, flash or cuDNN attention, chosen by dtype and
GPU -- which nothing lowers, and whose dropout arguments made placement keep
it in eager as a random op. On the H200 every attention of the model suite
ran eagerly that way, and in generation the eager kernel then refused the
mask an island had produced ("attn_bias is not correctly aligned": eager
SDPA pads the mask's rows before calling the kernel, the graph does not).
Without dropout, and with only the attention output read (inference: the
logsumexp and RNG state outputs feed a backward), each of them computes what
the CPU op computes from the same arguments, so it becomes that op and
every later pass (causal masks, padded keys, grouped key/value heads)
treats it as it treats CPU attention.

Before: ``attn = _scaled_dot_product_efficient_attention(q, k, v, bias, False, 0.0, True, scale=s); out = attn[0]``
After:  ``attn = _scaled_dot_product_flash_attention_for_cpu(q, k, v, 0.0, True, attn_mask=bias, scale=s); out = attn[0]``
"""

from __future__ import annotations

import operator
from typing import Any, Optional

import torch
import torch.fx

from tpu_inductor.decompositions.table import CPU_FLASH_ATTENTION
from tpu_inductor.passes.rewrite import replace_with_call

aten = torch.ops.aten

# Each CUDA op -> the positions of attn_bias (None: it takes none), dropout_p
# and is_causal in its schema; the schema's names are the same for all three.
_POSITIONS: dict[Any, tuple[Optional[int], int, int]] = {
    # (q, k, v, attn_bias, compute_log_sumexp, dropout_p=0.0, is_causal=False, *, scale=None)
    aten._scaled_dot_product_efficient_attention.default: (3, 5, 6),
    # (q, k, v, attn_bias, compute_log_sumexp, dropout_p=0.0, is_causal=False, return_debug_mask=False, *, scale=None)
    aten._scaled_dot_product_cudnn_attention.default: (3, 5, 6),
    # (q, k, v, dropout_p=0.0, is_causal=False, return_debug_mask=False, *, scale=None)
    aten._scaled_dot_product_flash_attention.default: (None, 3, 4),
}


def _argument(node: torch.fx.Node, position: Optional[int], name: str, default: Any) -> Any:
    """An argument passed by position or by name, else its default."""
    if position is not None and len(node.args) > position:
        return node.args[position]
    return node.kwargs.get(name, default)


def _reads_only_the_output(node: torch.fx.Node) -> bool:
    return all(user.target is operator.getitem and user.args[1] == 0 for user in node.users)


def cuda_attention_as_cpu_attention(gm: torch.fx.GraphModule) -> torch.fx.GraphModule:
    changed = False
    for node in list(gm.graph.nodes):
        positions = _POSITIONS.get(node.target) if node.op == "call_function" else None
        if positions is None:
            continue
        bias_at, dropout_at, causal_at = positions
        bias = _argument(node, bias_at, "attn_bias", None) if bias_at is not None else None
        dropout_p = _argument(node, dropout_at, "dropout_p", 0.0)
        is_causal = _argument(node, causal_at, "is_causal", False)
        if dropout_p != 0.0 or not _reads_only_the_output(node):
            continue  # training: its backward reads the other outputs
        kwargs = {"attn_mask": bias, "scale": node.kwargs.get("scale")}
        attention = replace_with_call(
            gm, node, CPU_FLASH_ATTENTION, (*node.args[:3], 0.0, is_causal),
            {name: value for name, value in kwargs.items() if value is not None},
        )
        if isinstance(attention.meta.get("val"), (tuple, list)):
            attention.meta["val"] = tuple(attention.meta["val"][:2])  # (output, logsumexp), as the CPU op returns
        changed = True
    if changed:
        gm.graph.lint()
        gm.recompile()
    return gm
