"""Inference attention kept whole through AOTAutograd and built from ATen ops
afterwards (passes/attention.py).

Compared with eager at 1e-5: the built attention does the math attention's
arithmetic; the flash kernel eager runs sums in another order.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import tpu_inductor.report as report

TOLERANCE = {"rtol": 1e-5, "atol": 1e-5}


class SelfAttention(torch.nn.Module):
    """q, k and v split from one projection: the flash kernel sees transposed views."""

    def __init__(self, dim: int = 32, heads: int = 4, **sdpa) -> None:
        super().__init__()
        self.heads, self.sdpa = heads, sdpa
        self.qkv = torch.nn.Linear(dim, 3 * dim)

    def forward(self, x, mask=None):
        batch, length, dim = x.shape
        q, k, v = self.qkv(x).view(batch, length, 3, self.heads, dim // self.heads).permute(2, 0, 3, 1, 4)
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, **self.sdpa)
        return out.transpose(1, 2).reshape(batch, length, dim)


def _island_ops() -> set[str]:
    return {op for graph in report.current().graphs for island in graph.islands for op in island.ops}


@pytest.mark.parametrize("sdpa", [{"is_causal": True}, {}, {"is_causal": True, "scale": 0.3}])
def test_built_attention_matches_eager(sdpa):
    torch.manual_seed(0)
    model = SelfAttention(**sdpa).eval()
    x = torch.randn(2, 12, 32)
    compiled = torch.compile(model, backend="tpu", options={"cache": False})
    with torch.no_grad():
        torch.testing.assert_close(compiled(x), model(x), **TOLERANCE)
    # Built directly: a plain softmax, not PyTorch's safe softmax (its all() over -inf rows).
    ops = _island_ops()
    assert "aten._softmax.default" in ops and "aten.all.dim" not in ops


def test_cross_attention_lengths_match_eager():
    torch.manual_seed(0)
    q, k, v = torch.randn(2, 4, 5, 8), torch.randn(2, 4, 9, 8), torch.randn(2, 4, 9, 16)
    compiled = torch.compile(lambda q, k, v: F.scaled_dot_product_attention(q, k, v, is_causal=True), backend="tpu")
    with torch.no_grad():
        torch.testing.assert_close(compiled(q, k, v), F.scaled_dot_product_attention(q, k, v, is_causal=True), **TOLERANCE)


def test_masked_attention_keeps_pytorchs_decomposition():
    """A boolean mask can hide a whole row: that needs PyTorch's safe softmax."""
    torch.manual_seed(0)
    model = SelfAttention().eval()
    x = torch.randn(2, 6, 32)
    mask = torch.ones(6, 6, dtype=torch.bool).tril()
    mask[0] = False  # a query that sees no key
    compiled = torch.compile(model, backend="tpu", options={"cache": False})
    with torch.no_grad():
        expected = model(x, mask)
        torch.testing.assert_close(compiled(x, mask), expected, **TOLERANCE)
