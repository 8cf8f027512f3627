"""FlexAttention as the attention arithmetic it stands for.

Why: ``torch.nn.attention.flex_attention`` reaches the ATen graph as one
higher-order op, ``flex_attention(q, k, v, score_mod, block_mask, ...)``, whose
``score_mod`` and ``mask_mod`` are subgraphs over scalars. Inductor turns it
into a fused kernel; no other backend can run it as it is, so it ran in eager
PyTorch on its unfused reference code (and warned the user to compile it).
Transformers' ``attn_implementation="flex_attention"`` and document-masked
training loops write attention this way.

PyTorch's own CPU implementation (``sdpa_dense``: ``math_attention``, then a
copy strided like the query) is plain tensor arithmetic: the scores ``q @ k^T
* scale``, ``score_mod`` and ``mask_mod`` applied to every (batch, head, query,
key) position through ``vmap``, a softmax that gives fully masked rows zeros,
and ``@ v``. Traced through make_fx, ``math_attention`` is ATen ops that lower,
with eager's arithmetic, so XLA fuses the modifications into the score
computation (its result is contiguous; no copy). Like eager, it reads only the
mask function: the block mask's sparse block lists let a kernel skip blocks.

Before::

    score_mod_0 = get_attr[target=score_mod_0]; mask_fn_0 = get_attr[target=mask_fn_0]
    flex = flex_attention(q, k, v, score_mod_0, (64, 64, kv_num_blocks, ..., mask_fn_0), 0.25, {...}, (), ())
    out = flex[0]

After::

    scores = bmm(q, k^T) * 0.25; scores = where(ge(q_idx, kv_idx), scores + (q_idx - kv_idx) * 0.1, -inf)
    out = bmm(_safe_softmax(scores), v)

Its backward (``flex_attention_backward``) needs CUDA in eager PyTorch
(FlexAttention refuses gradients on CPU) and is left to it.
"""

from __future__ import annotations

import logging
from typing import Any

import torch
import torch.fx

from tpu_inductor import torch_api
from tpu_inductor.passes.rewrite import drop_inlined_subgraphs, inline_replacement, trace_replacement

log = logging.getLogger(__name__)


def flex_attention_as_math(gm: torch.fx.GraphModule) -> torch.fx.GraphModule:
    nodes = [n for n in gm.graph.nodes if n.op == "call_function" and n.target is torch_api.flex_attention_op]
    for node in nodes:
        _replace(gm, node)
    if nodes:
        drop_inlined_subgraphs(gm)
        log.debug("flex_attention as math attention: %d call(s)", len(nodes))
    return gm


def _replace(gm: torch.fx.GraphModule, node: torch.fx.Node) -> None:
    inputs = _value_arguments(node)

    def math_attention(*values: Any) -> tuple[torch.Tensor, ...]:
        given = iter(values)
        args, kwargs = torch.fx.map_arg(
            (node.args, node.kwargs), lambda arg: getattr(gm, arg.target) if arg.op == "get_attr" else next(given)
        )
        return torch_api.flex_attention_math(*args, **kwargs)

    replacement = trace_replacement(math_attention, [arg.meta["val"] for arg in inputs])
    inline_replacement(gm, node, replacement, inputs)


def _value_arguments(node: torch.fx.Node) -> list[torch.fx.Node]:
    """``node``'s arguments that are values (tensors, sizes), in ``map_arg``'s
    order. Subgraphs (score_mod, mask_mod: get_attr) are called by the trace,
    not passed to it."""
    values: list[torch.fx.Node] = []

    def visit(arg: torch.fx.Node) -> torch.fx.Node:
        if arg.op != "get_attr":
            values.append(arg)
        return arg

    torch.fx.map_arg((node.args, node.kwargs), visit)
    return values
