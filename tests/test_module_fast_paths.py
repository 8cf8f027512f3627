"""nn.TransformerEncoderLayer / nn.MultiheadAttention fast paths on the device
(decompositions/module_fast_paths.py).

In eval mode under no_grad both modules call one fused kernel
(``aten._transformer_encoder_layer_fwd``, ``aten._native_multi_head_attention``)
that torch-mlir cannot lower; decomposed, the layer runs in one island.
Compared with eager at the float32 defaults: the decomposition does the
kernel's arithmetic in its order (projections, scaled q, softmax, matmuls).
"""

from __future__ import annotations

import pytest
import torch
import torch.nn as nn

import tpu_inductor.report as report

OPTIONS = {"cache": False}
FAST_PATH_OPS = {"aten._transformer_encoder_layer_fwd.default", "aten._native_multi_head_attention.default"}
BATCH, LENGTH, DIM, HEADS = 3, 6, 32, 4


def _inputs() -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    torch.manual_seed(0)
    x = torch.randn(BATCH, LENGTH, DIM)
    padding = torch.zeros(BATCH, LENGTH, dtype=torch.bool)
    padding[1, 4:] = True
    padding[2, 2:] = True
    causal = torch.triu(torch.ones(LENGTH, LENGTH, dtype=torch.bool), 1)
    return x, padding, causal


def _assert_on_device() -> None:
    current = report.current()
    assert [g.kind for g in current.graphs] == ["inference"]
    assert current.islands()
    assert not [f for f in current.fallbacks() if f.op in FAST_PATH_OPS], current.fallbacks()
    assert current.fallbacks() == []


def _compare(module: nn.Module, *args, **kwargs):
    with torch.no_grad():
        expected = module(*args, **kwargs)
        actual = torch.compile(module, backend="tpu", options=OPTIONS)(*args, **kwargs)
    torch.testing.assert_close(actual, expected, equal_nan=True)
    return actual


@pytest.mark.parametrize("masks", ["none", "key_padding", "src_mask", "both"])
@pytest.mark.parametrize("activation, norm_first", [("relu", False), ("gelu", True)])
def test_encoder_layer_fast_path_runs_on_device(masks, activation, norm_first):
    x, padding, causal = _inputs()
    layer = nn.TransformerEncoderLayer(
        DIM, HEADS, 64, dropout=0.0, activation=activation, batch_first=True, norm_first=norm_first
    ).eval()
    kwargs = {
        "none": {},
        "key_padding": {"src_key_padding_mask": padding},  # mask_type 1
        "src_mask": {"src_mask": causal},  # mask_type 2, expanded to [B, H, L, L]
        "both": {"src_mask": causal, "src_key_padding_mask": padding},  # merged, float
    }[masks]
    _compare(layer, x, **kwargs)
    _assert_on_device()


def test_encoder_layer_gelu_module_takes_exact_gelu():
    """``GELU('tanh')`` counts as gelu for the fast path, whose kernel applies the exact one."""
    x, _, _ = _inputs()
    layer = nn.TransformerEncoderLayer(DIM, HEADS, 64, dropout=0.0, activation=nn.GELU("tanh"), batch_first=True)
    _compare(layer.eval(), x)
    _assert_on_device()


class FastPathAttention(nn.Module):
    """What ``nn.MultiheadAttention``'s fast path calls, called directly.

    Under Dynamo the module itself never takes its fast path (its
    ``_is_make_fx_tracing()`` check is true while Dynamo traces), so compiling
    ``nn.MultiheadAttention`` traces the unfused path; the fused op reaches
    the backend from code that calls it, as the encoder layer's kernel does.
    """

    def __init__(self, mha: nn.MultiheadAttention) -> None:
        super().__init__()
        self.mha = mha

    def forward(self, x, attn_mask=None, key_padding_mask=None, need_weights=True, average_attn_weights=True):
        mha = self.mha
        mask, mask_type = mha.merge_masks(attn_mask, key_padding_mask, x)
        return torch._native_multi_head_attention(
            x, x, x, mha.embed_dim, mha.num_heads, mha.in_proj_weight, mha.in_proj_bias,
            mha.out_proj.weight, mha.out_proj.bias, mask, need_weights, average_attn_weights, mask_type,
        )


def _float_mask(mask: torch.Tensor) -> torch.Tensor:
    """A bool mask as ``MultiheadAttention`` canonicalises it before the fast path."""
    return torch.zeros(mask.shape).masked_fill(mask, float("-inf"))


@pytest.mark.parametrize(
    "kwargs",
    [
        {},
        {"need_weights": False},
        {"average_attn_weights": False},
        {"key_padding_mask": "padding"},
        {"attn_mask": "causal"},
        {"attn_mask": "causal_3d"},
        {"attn_mask": "causal", "key_padding_mask": "padding", "average_attn_weights": False},
    ],
    ids=["weights", "no-weights", "per-head", "key-padding", "attn-mask", "attn-mask-3d", "both-masks"],
)
def test_native_multi_head_attention_runs_on_device(kwargs):
    """Compared with the module's own eager call, which takes the fast path."""
    x, padding, causal = _inputs()
    values = {"padding": padding, "causal": causal, "causal_3d": causal.expand(BATCH * HEADS, LENGTH, LENGTH)}
    kwargs = {k: values.get(v, v) if isinstance(v, str) else v for k, v in kwargs.items()}
    mha = nn.MultiheadAttention(DIM, HEADS, batch_first=True).eval()
    with torch.no_grad():
        expected = mha(x, x, x, **kwargs)
        masks = {k: _float_mask(v) for k, v in kwargs.items() if k.endswith("mask")}
        actual = torch.compile(FastPathAttention(mha), backend="tpu", options=OPTIONS)(x, **{**kwargs, **masks})
    torch.testing.assert_close(actual, expected)
    assert (actual[1] is None) == (kwargs.get("need_weights") is False)  # eager's None, not tensor([])
    _assert_on_device()


def test_native_multi_head_attention_fully_masked_row_is_nan_as_eager():
    """Every key padded: eager's masked softmax gives NaN; so does the decomposition."""
    x, padding, _ = _inputs()
    padding[0] = True
    mha = nn.MultiheadAttention(DIM, HEADS, batch_first=True).eval()
    with torch.no_grad():
        expected = mha(x, x, x, key_padding_mask=padding)
        out, _ = torch.compile(FastPathAttention(mha), backend="tpu", options=OPTIONS)(
            x, key_padding_mask=_float_mask(padding)
        )
    torch.testing.assert_close(out, expected[0], equal_nan=True)
    assert out[0].isnan().all() and not out[1:].isnan().any()
    _assert_on_device()


@pytest.mark.parametrize("mask_type", [0, 1, None])
def test_native_multi_head_attention_mask_types(mask_type):
    """The op's own mask forms: ``[L, L]`` (type 0), ``[B, L]`` (type 1), or
    one of the scores' shape (None); bool here, True meaning masked."""
    x, padding, causal = _inputs()
    scores_shaped = padding.view(BATCH, 1, 1, LENGTH).expand(BATCH, HEADS, LENGTH, LENGTH)
    mask = {0: causal, 1: padding, None: scores_shaped}[mask_type]
    mha = nn.MultiheadAttention(DIM, HEADS, batch_first=True).eval()
    params = (mha.in_proj_weight, mha.in_proj_bias, mha.out_proj.weight, mha.out_proj.bias)

    def attention(x, mask):
        return torch._native_multi_head_attention(x, x, x, DIM, HEADS, *params, mask, True, False, mask_type)

    with torch.no_grad():
        expected = attention(x, mask)
        actual = torch.compile(attention, backend="tpu", options=OPTIONS)(x, mask)
    torch.testing.assert_close(actual, expected)
    _assert_on_device()


def test_multihead_attention_module_matches_eager():
    """The module compiled (its unfused path) against eager's fast path."""
    x, padding, _ = _inputs()
    mha = nn.MultiheadAttention(DIM, HEADS, batch_first=True).eval()
    _compare(mha, x, x, x, key_padding_mask=padding)
    _assert_on_device()


def _encoder(**kwargs) -> nn.TransformerEncoder:
    torch.manual_seed(1)
    layer = nn.TransformerEncoderLayer(DIM, HEADS, 64, dropout=0.0, batch_first=True)
    return nn.TransformerEncoder(layer, 2, enable_nested_tensor=True, **kwargs).eval()


def test_encoder_padding_mask_matches_eager_where_not_padded():
    """Eager packs the padded batch into a nested tensor; under torch.compile
    PyTorch skips that (``mask_check enabled with torch.compile``) and runs the
    layers with the padding mask. Real positions agree with eager; padded
    ones are what that path computes (eager's nested path returns zeros
    there), the same numbers as Dynamo without a backend."""
    x, padding, _ = _inputs()
    encoder = _encoder()
    with torch.no_grad():
        expected = encoder(x, src_key_padding_mask=padding)
        dynamo_only = torch.compile(encoder, backend="eager")(x, src_key_padding_mask=padding)
        torch._dynamo.reset()
        actual = torch.compile(encoder, backend="tpu", options=OPTIONS)(x, src_key_padding_mask=padding)
    torch.testing.assert_close(actual[~padding], expected[~padding])
    torch.testing.assert_close(actual, dynamo_only)
    _assert_on_device()


def test_encoder_nested_tensor_path_keeps_eager_values():
    """``mask_check=False``: the encoder converts to a nested tensor, which
    Dynamo does not trace; the call runs eagerly and returns eager's values
    exactly, zeros at the padded positions included."""
    x, padding, _ = _inputs()
    encoder = _encoder(mask_check=False)
    with torch.no_grad():
        expected = encoder(x, src_key_padding_mask=padding)
        actual = torch.compile(encoder, backend="tpu", options=OPTIONS)(x, src_key_padding_mask=padding)
    torch.testing.assert_close(actual, expected, rtol=0, atol=0)
    assert not [f for f in report.current().fallbacks() if f.op in FAST_PATH_OPS]


def test_nested_tensor_input_keeps_eager_values():
    torch.manual_seed(0)
    layer = nn.TransformerEncoderLayer(DIM, HEADS, 64, dropout=0.0, batch_first=True).eval()
    nested = torch.nested.nested_tensor([torch.randn(5, DIM), torch.randn(3, DIM)])
    with torch.no_grad():
        expected = layer(nested)
        actual = torch.compile(layer, backend="tpu", options=OPTIONS)(nested)
    assert actual.is_nested
    for got, want in zip(actual.unbind(), expected.unbind()):
        torch.testing.assert_close(got, want)
