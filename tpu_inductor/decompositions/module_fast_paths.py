"""Decompositions of the fused kernels PyTorch's module fast paths call.

Why: in eval mode under ``no_grad``, ``nn.TransformerEncoderLayer`` and
``nn.MultiheadAttention`` call one fused native kernel for the whole layer
(``aten._transformer_encoder_layer_fwd``, ``aten._native_multi_head_attention``),
which torch-mlir cannot lower, so the whole layer ran in eager PyTorch.
Here each kernel becomes the ATen ops its C++ implementation calls
(``aten/src/ATen/native/transformers/{transformer,attention}.cpp``): linear
projections, a masked softmax over the scaled scores, layer norms, the
feed-forward block; all of them lower.

Nested-tensor inputs (``TransformerEncoder(enable_nested_tensor=True)``
packs padded batches into one) are left to the kernels: Dynamo does not
trace ``_nested_tensor_from_mask``, so that path runs eagerly as a whole.
"""

from __future__ import annotations

from typing import Optional

import torch
import torch.nn.functional as F

aten = torch.ops.aten

# ``mask_type`` values of the fast paths (``MultiheadAttention.merge_masks``).
_SRC_MASK = 0  # [L, L], shared by every batch entry and head
_KEY_PADDING_MASK = 1  # [B, L], True where the key is padding
# 2, or None: a mask that broadcasts to the scores' [B, H, L, S]


def _masked_softmax(scores: torch.Tensor, mask: Optional[torch.Tensor], mask_type: Optional[int]) -> torch.Tensor:
    """Softmax over the last dim of ``[B, H, L, S]`` scores, as ``aten._masked_softmax`` computes it.

    The kernel first converts the mask to bool, so any nonzero entry (the
    ``-inf`` of a float mask made from a bool one, but also any other value)
    removes that key; a row whose every key is removed comes out NaN, as
    eager's does. Low-precision scores are normalised in float32, as the CPU
    kernel accumulates them.
    """
    dtype = scores.dtype
    if mask is not None:
        masked = mask.to(torch.bool)
        batch, _, queries, keys = scores.shape
        if mask_type == _SRC_MASK:
            masked = masked.view(1, 1, queries, keys)
        elif mask_type == _KEY_PADDING_MASK:
            masked = masked.view(batch, 1, 1, keys)
        scores = scores.masked_fill(masked, float("-inf"))
    return torch.softmax(scores.to(torch.promote_types(dtype, torch.float32)), -1).to(dtype)


def _native_multi_head_attention(
    query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, embed_dim: int, num_head: int,
    qkv_weight: torch.Tensor, qkv_bias: torch.Tensor, proj_weight: torch.Tensor, proj_bias: torch.Tensor,
    mask: Optional[torch.Tensor] = None, need_weights: bool = True, average_attn_weights: bool = True,
    mask_type: Optional[int] = None,
):
    """``aten._native_multi_head_attention`` as projections, a masked softmax and matmuls.

    torch-mlir has no lowering for the fused kernel that
    ``nn.MultiheadAttention``'s fast path calls. As the kernel does: ``q``,
    ``k``, ``v`` are the three row blocks of ``qkv_weight`` applied to query,
    key and value, plus their biases, ``q`` divided by ``sqrt(head_dim)``;
    the scores go through :func:`_masked_softmax`, weight ``v``, and the
    heads, concatenated, go through the output projection. The second result
    is the attention weights (averaged over heads when asked) or, without
    ``need_weights``, ``None``, the undefined tensor eager returns (the meta
    function's empty tensor would reach the user as ``tensor([])``).
    Nested-tensor queries stay the kernel (``NotImplemented``).
    """
    if query.is_nested or key.is_nested or value.is_nested:
        return NotImplemented
    batch, length, _ = query.shape
    head_dim = embed_dim // num_head
    if query.numel() == 0:
        return torch.empty_like(query), None
    w_q, w_k, w_v = qkv_weight.chunk(3)
    b_q, b_k, b_v = qkv_bias.chunk(3)

    def heads(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
        return (torch.matmul(x, weight.t()) + bias).view(batch, -1, num_head, head_dim).transpose(1, 2)

    q = heads(query, w_q, b_q) * (1.0 / head_dim**0.5)
    k, v = heads(key, w_k, b_k), heads(value, w_v, b_v)
    weights = _masked_softmax(torch.matmul(q, k.transpose(-2, -1)), mask, mask_type)
    context = torch.matmul(weights, v).transpose(1, 2).reshape(batch, length, embed_dim)
    out = F.linear(context, proj_weight, proj_bias)
    if not need_weights:
        return out, None
    return out, weights.sum(1) / num_head if average_attn_weights else weights


def _transformer_encoder_layer_fwd(
    src: torch.Tensor, embed_dim: int, num_heads: int,
    qkv_weight: torch.Tensor, qkv_bias: torch.Tensor, proj_weight: torch.Tensor, proj_bias: torch.Tensor,
    use_gelu: bool, norm_first: bool, eps: float,
    norm_weight_1: torch.Tensor, norm_bias_1: torch.Tensor, norm_weight_2: torch.Tensor, norm_bias_2: torch.Tensor,
    ffn_weight_1: torch.Tensor, ffn_bias_1: torch.Tensor, ffn_weight_2: torch.Tensor, ffn_bias_2: torch.Tensor,
    mask: Optional[torch.Tensor] = None, mask_type: Optional[int] = None,
) -> torch.Tensor:
    """``aten._transformer_encoder_layer_fwd`` as attention, layer norms and the feed-forward block.

    torch-mlir has no lowering for the fused kernel that
    ``nn.TransformerEncoderLayer``'s fast path calls. As the kernel does:
    self-attention (:func:`_native_multi_head_attention`, without weights),
    residual, layer norm; feed-forward ``linear -> relu`` (or exact ``gelu``:
    the kernel's ``use_gelu`` is ``approximate='none'`` even for a
    ``GELU('tanh')`` module) ``-> linear``, residual, layer norm; with
    ``norm_first`` each norm moves before its block. Empty inputs come back
    as a copy, nested ones stay the kernel (``NotImplemented``).
    """
    if src.is_nested:
        return NotImplemented
    if src.numel() == 0:
        return src.clone()

    def norm(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
        return F.layer_norm(x, (embed_dim,), weight, bias, eps)

    x = norm(src, norm_weight_1, norm_bias_1) if norm_first else src
    x, _ = _native_multi_head_attention(
        x, x, x, embed_dim, num_heads, qkv_weight, qkv_bias, proj_weight, proj_bias,
        mask, False, True, mask_type,
    )
    x = x + src
    if not norm_first:
        x = norm(x, norm_weight_1, norm_bias_1)
    residual = x
    if norm_first:
        x = norm(x, norm_weight_2, norm_bias_2)
    hidden = F.linear(x, ffn_weight_1, ffn_bias_1)
    hidden = F.gelu(hidden) if use_gelu else F.relu(hidden)
    x = F.linear(hidden, ffn_weight_2, ffn_bias_2) + residual
    if not norm_first:
        x = norm(x, norm_weight_2, norm_bias_2)
    return x


FAST_PATH_DECOMPOSITIONS: dict = {
    aten._native_multi_head_attention.default: _native_multi_head_attention,
    aten._transformer_encoder_layer_fwd.default: _transformer_encoder_layer_fwd,
}
