"""Decompose scaled-dot-product attention that inference graphs keep whole.

Why: inference graphs are traced with the CPU attention op
(``_scaled_dot_product_flash_attention_for_cpu``) left whole, for two reasons.
With dynamic shapes, :mod:`~tpu_inductor.analysis.padding_safety` can then see
``is_causal`` instead of a softmax over the key dim, which would look unsafe.
And building the attention here is cheaper than AOTAutograd tracing PyTorch's
decomposition of it through fake tensors (the perf.py decoder's capture went
from 0.207 to 0.140 s, for 0.028 s in this pass). torch-mlir cannot lower the
op itself, so this pass replaces it with plain ATen ops:

* float32 attention with static shapes, unmasked or masked, grouped-query
  or not (the common cases): built node by node, the math attention's
  arithmetic, with grouped key/value heads read in place
  (:func:`_build_attention`);
* other attention whose key dim is not padded: PyTorch's own decomposition,
  traced with make_fx;
* where the key dim is padded (any attention: causal or not, masked or
  not): attention that hides every key at or past the real length, on top
  of the model's own mask, and zeroes the value rows there; it reads the
  real length from an extra 0-d int64 input ``valid_<size>``
  (analysis/real_lengths.py). A real query never weighs a padded key (its
  probability is exactly 0), and with the value rows zeroed, ``0 *
  garbage`` cannot turn into NaN either, whatever the padded positions
  hold; one executable serves every length in the bucket. This is what
  makes a growing KV cache's length padding-safe.

Before::

    attn = aten._scaled_dot_product_flash_attention_for_cpu(q, k, v, 0.0, True)
    out = attn[0]

After (key dim ``s0 + 1`` padded, a decode step over a KV cache)::

    valid_s0_1 = placeholder()                    # appended input: the real s0 + 1
    scores = bmm(q * c, k^T * c); scores = where(j < valid_s0_1, scores, -inf)
    out = bmm(softmax(scores), where(arange(S) < valid_s0_1, v, 0))
"""

from __future__ import annotations

import functools
import math
import operator
from typing import Any, Optional

import torch
import torch.fx

from tpu_inductor.passes.causal_masks import causal_masks_as_is_causal
from tpu_inductor.decompositions.table import (
    ATTENTION_OPS,
    CPU_FLASH_ATTENTION,
    decomposition_table,
    flash_attention_flags,
)
from tpu_inductor.analysis.padding_safety import expr_of
from tpu_inductor.analysis.real_lengths import RealLengths
from tpu_inductor.passes.repeated_kv_heads import read_kv_heads_in_place
from tpu_inductor.passes.rewrite import GraphBuilder, inline_replacement, trace_replacement

aten = torch.ops.aten

def decompose_attention(
    gm: torch.fx.GraphModule, padded: frozenset, real_lengths: RealLengths
) -> torch.fx.GraphModule:
    """Replace kept-whole attention; where the key dim is padded, with one
    that reads the real key length from ``real_lengths``' inputs."""
    gm = read_kv_heads_in_place(causal_masks_as_is_causal(gm))
    graph = gm.graph
    nodes = [n for n in graph.nodes if n.op == "call_function" and n.target in ATTENTION_OPS]
    if not nodes:
        return gm
    for node in nodes:
        query, key, value = (a.meta["val"] for a in node.args[:3])
        key_len = expr_of(key.shape[-2])
        if _built_directly(node):
            with graph.inserting_before(node):
                _build_attention(GraphBuilder(graph, node))
        elif key_len.free_symbols & padded and node.target is CPU_FLASH_ATTENTION:
            valid = real_lengths.node(key_len, query)
            mask = node.kwargs.get("attn_mask")
            _, is_causal = flash_attention_flags(node)
            scale = node.kwargs.get("scale")
            inputs = [*node.args[:3], valid] + ([mask] if mask is not None else [])
            replacement = trace_replacement(
                lambda q, k, v, n, *m: _attention_masking_padded_keys(
                    q, k, v, n, m[0] if m else None, is_causal, scale
                ),
                tuple(x.meta["val"] for x in inputs),
            )
            inline_replacement(gm, node, replacement, inputs)
        else:
            # Every tensor argument is a traced input: attn_mask too, not only q, k, v.
            inputs = list(node.all_input_nodes)
            replacement = trace_replacement(
                functools.partial(_decomposed, node, inputs), tuple(n.meta["val"] for n in inputs)
            )
            inline_replacement(gm, node, replacement, inputs)
    graph.eliminate_dead_code()  # the decompositions' unused second outputs
    graph.lint()
    gm.recompile()
    return gm


def _built_directly(node: torch.fx.Node) -> bool:
    """Float32 CPU attention with static shapes whose logsumexp is unused,
    unmasked or with a boolean or float32 mask: the inference cases, built node
    by node (:func:`_build_attention`) rather than traced through PyTorch's
    decomposition, which took ~20 ms of make_fx per attention on the decoder's
    cold compile and repeats grouped key/value heads in memory."""
    if node.target is not CPU_FLASH_ATTENTION:
        return False
    dropout, is_causal = flash_attention_flags(node)
    mask = node.kwargs.get("attn_mask")
    values = [a.meta.get("val") for a in node.args[:3]]
    if dropout != 0.0 or not all(isinstance(v, torch.Tensor) and v.dtype == torch.float32 for v in values):
        return False
    if not all(v.dim() == 4 and all(isinstance(d, int) for d in v.shape) for v in values):
        return False
    if values[0].shape[1] % values[1].shape[1]:
        return False
    if mask is not None:
        mask_value = mask.meta.get("val")
        if is_causal or not isinstance(mask_value, torch.Tensor) or mask_value.dtype not in _MASK_DTYPES:
            return False
        if mask_value.dim() > 4 or not all(isinstance(d, int) for d in mask_value.shape):
            return False
    return all(user.target is operator.getitem and user.args[1] == 0 for user in node.users)


_MASK_DTYPES = frozenset({torch.bool, torch.float32})


def _build_attention(build: GraphBuilder) -> None:
    """PyTorch's math attention (both sides scaled by the square root of the
    scale, mask or causal mask by position, safe softmax), its output stored
    the way the flash kernel stores it so that the graph's later views stay
    valid.

    Grouped-query attention (``g`` query heads per key/value head, as the
    flash kernel accepts them) is computed per key/value head over ``g * L``
    query rows, so the key and value heads are never repeated in memory:

        scores[B*Hk, g*L, S] = q[B, Hk, g, L, D] @ k[B, Hk, D, S]

    A mask broadcasts over the ``(Hk, g)`` split of its head dim. A row that
    the mask hides entirely gets zeros, as PyTorch's safe softmax gives it;
    without a mask no row is all -inf (a causal row keeps key 0) and the plain
    softmax is the same."""
    node = build.anchor
    q, k, v = node.args[:3]
    _, is_causal = flash_attention_flags(node)
    mask = node.kwargs.get("attn_mask")
    batch, heads, queries, head_dim = q.meta["val"].shape
    key_heads, keys, value_dim = v.meta["val"].shape[1:]
    group = heads // key_heads
    scale = node.kwargs.get("scale")
    root = math.sqrt(scale if scale is not None else 1.0 / math.sqrt(head_dim))

    def batched(x: torch.fx.Node, rows: int, columns: int) -> torch.fx.Node:
        dense = build.call(aten.clone.default, x, memory_format=torch.contiguous_format)
        return build.call(aten.view.default, dense, [batch * key_heads, rows, columns])

    scaled_q = build.call(aten.mul.Tensor, q, root)
    scaled_k = build.call(aten.transpose.int, build.call(aten.mul.Tensor, k, root), 2, 3)
    scores = build.call(
        aten.bmm.default, batched(scaled_q, group * queries, head_dim), batched(scaled_k, head_dim, keys)
    )
    scores = build.call(aten.view.default, scores, [batch, key_heads, group, queries, keys])
    hidden = build.call(aten.full.default, [], float("-inf"), dtype=torch.float32)
    if is_causal:
        rows = build.call(aten.view.default, build.arange(queries), [queries, 1])
        columns = build.call(aten.view.default, build.arange(keys), [1, keys])
        visible = build.call(aten.le.Tensor, columns, rows)
        scores = build.call(aten.where.self, visible, scores, hidden)
    if mask is not None:
        grouped_mask = _grouped(build, mask, key_heads, group)
        if mask.meta["val"].dtype == torch.bool:
            scores = build.call(aten.where.self, grouped_mask, scores, hidden)
        else:
            scores = build.call(aten.add.Tensor, scores, grouped_mask)
    probs = build.call(aten._softmax.default, scores, -1, False)
    if mask is not None:
        row_max = build.call(aten.amax.default, scores, [-1], True)
        all_hidden = build.call(aten.eq.Scalar, row_max, float("-inf"))
        zero = build.call(aten.full.default, [], 0.0, dtype=torch.float32)
        probs = build.call(aten.where.self, all_hidden, zero, probs)
    out = build.call(aten.bmm.default, batched(probs, group * queries, keys), batched(v, keys, value_dim))
    out = build.call(aten.view.default, out, [batch, heads, queries, value_dim])
    # The flash kernel's output strides follow its inputs' layout: match them.
    strides = node.meta["val"][0].stride()
    order = sorted(range(4), key=lambda d: -strides[d])
    stored = build.call(
        aten.clone.default, build.call(aten.permute.default, out, order), memory_format=torch.contiguous_format
    )
    out = build.call(aten.permute.default, stored, [order.index(d) for d in range(4)])
    for user in list(node.users):
        user.replace_all_uses_with(out)
        build.graph.erase_node(user)
    build.graph.erase_node(node)


def _grouped(build: GraphBuilder, mask: torch.fx.Node, key_heads: int, group: int) -> torch.fx.Node:
    """``mask`` (broadcastable to [B, H, L, S]) as [B', Hk', g', L, S], to
    broadcast against grouped scores [B, Hk, g, L, S]."""
    shape = list(mask.meta["val"].shape)
    shape = [1] * (4 - len(shape)) + shape
    mask_batch, mask_heads, rows, columns = shape
    if mask_heads == 1:
        return build.call(aten.reshape.default, mask, [mask_batch, 1, 1, rows, columns])
    return build.call(aten.reshape.default, mask, [mask_batch, key_heads, group, rows, columns])


def _decomposed(node: torch.fx.Node, inputs: list[torch.fx.Node], *tensors: torch.Tensor) -> Any:
    """``node``'s op through our decomposition table, its tensor arguments replaced."""
    values = dict(zip(inputs, tensors))
    args = torch.fx.node.map_arg(node.args, values.__getitem__)
    kwargs = torch.fx.node.map_arg(node.kwargs, values.__getitem__)
    return decomposition_table()[node.target](*args, **kwargs)


def _attention_masking_padded_keys(q, k, v, valid_keys, mask, is_causal: bool, scale: Optional[float]):
    """Attention that ignores keys at or past ``valid_keys`` (the real key
    length), causal or not, with or without the model's mask.

    Same arithmetic as PyTorch's math attention (both sides scaled by the
    square root of the scale; a row the model's mask hides entirely gets
    zeros, as PyTorch's safe softmax gives it), with the output in the flash
    kernel's memory layout so the graph's later views stay valid. A real
    query never weighs a padded key, whatever the mask holds there: the key
    mask is applied on top of it.
    """
    head_dim = q.size(-1)
    if scale is not None:
        root = math.sqrt(scale)
    elif isinstance(head_dim, int):
        root = math.sqrt(1.0 / math.sqrt(head_dim))
    else:  # a symbolic head size: compute the scale on the device
        root = torch.rsqrt(torch.sqrt(torch.scalar_tensor(head_dim, dtype=q.dtype, device=q.device)))
    # Grouped key/value heads (fewer than the query heads) broadcast over
    # the query heads they serve: [B, Hk, g, L, D] against [B, Hk, 1, S, D].
    batch, heads, queries = q.shape[:3]
    key_heads = k.size(1)
    group = heads // key_heads
    grouped_q = q.reshape(batch, key_heads, group, queries, head_dim)
    scores = (grouped_q * root) @ (k.unsqueeze(2).transpose(-2, -1) * root)
    cols = torch.arange(k.size(-2), device=q.device)
    if mask is not None:
        # [B', H', L', S'] broadcasting against [B, H, L, S] -> against [B, Hk, g, L, S].
        mask = mask.reshape((1,) * (4 - mask.dim()) + tuple(mask.shape))
        mask_batch, mask_heads, mask_rows, mask_cols = mask.shape
        split = (key_heads, group) if mask_heads != 1 else (1, 1)
        mask = mask.reshape(mask_batch, *split, mask_rows, mask_cols)
        if mask.dtype == torch.bool:
            scores = torch.where(mask, scores, float("-inf"))
        else:
            scores = scores + mask
    if is_causal:
        rows = torch.arange(queries, device=q.device).unsqueeze(-1)
        scores = torch.where(cols.unsqueeze(0) <= rows, scores, float("-inf"))
    real_keys = cols < valid_keys
    scores = torch.where(real_keys, scores, float("-inf"))
    probs = torch.softmax(scores, dim=-1)
    if mask is not None:  # rows the mask hides entirely: zeros, not NaN
        probs = torch.where(scores.amax(-1, keepdim=True) == float("-inf"), 0.0, probs)
    out = (probs @ torch.where(real_keys.unsqueeze(-1), v, 0).unsqueeze(2)).reshape(batch, heads, queries, v.size(-1))
    return out.permute(2, 0, 1, 3).contiguous().permute(1, 2, 0, 3), probs.reshape(batch, heads, queries, -1)
