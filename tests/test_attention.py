"""Inference attention kept whole through AOTAutograd and built from ATen ops
afterwards (passes/attention.py).

Compared with eager at 1e-5: the built attention does the math attention's
arithmetic; the flash kernel eager runs sums in another order.
"""

from __future__ import annotations

import operator

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


@pytest.mark.parametrize("kind", ["bool", "float"])
def test_masked_attention_gives_hidden_rows_zeros(kind):
    """A mask can hide a whole row: it gets zeros, as PyTorch's safe softmax gives it."""
    torch.manual_seed(0)
    model = SelfAttention().eval()
    x = torch.randn(2, 6, 32)
    mask = torch.ones(6, 6, dtype=torch.bool).tril()
    mask[0] = False  # a query that sees no key
    if kind == "float":
        mask = torch.zeros(6, 6).masked_fill(~mask, float("-inf"))
    compiled = torch.compile(model, backend="tpu", options={"cache": False})
    with torch.no_grad():
        expected = model(x, mask)
        assert expected[:, 0].abs().max() == 0
        torch.testing.assert_close(compiled(x, mask), expected, **TOLERANCE)
    ops = _island_ops()
    assert "aten.amax.default" in ops and "aten.all.dim" not in ops  # built, not PyTorch's decomposition


def _repeat_kv(x: torch.Tensor, group: int) -> torch.Tensor:
    """transformers' repeat_kv."""
    batch, heads, length, head_dim = x.shape
    return x[:, :, None].expand(batch, heads, group, length, head_dim).reshape(batch, heads * group, length, head_dim)


class GroupedQueryAttention(torch.nn.Module):
    """8 query heads over 2 key/value heads, grouped by SDPA or repeated first."""

    def __init__(self, repeat: bool) -> None:
        super().__init__()
        self.repeat = repeat
        self.q, self.kv = torch.nn.Linear(32, 32), torch.nn.Linear(32, 16)

    def forward(self, x, mask=None):
        batch, length, _ = x.shape
        q = self.q(x).view(batch, length, 8, 4).transpose(1, 2)
        k, v = self.kv(x).view(batch, length, 2, 2, 4).permute(2, 0, 3, 1, 4)
        if self.repeat:
            k, v = _repeat_kv(k, 4), _repeat_kv(v, 4)
        out = F.scaled_dot_product_attention(
            q, k, v, attn_mask=mask, is_causal=mask is None, enable_gqa=not self.repeat
        )
        return out.transpose(1, 2).reshape(batch, length, 32)


@pytest.mark.parametrize("repeat", [False, True], ids=["enable_gqa", "repeat_kv"])
@pytest.mark.parametrize("masked", [False, True], ids=["causal", "masked"])
def test_grouped_query_attention_matches_eager(repeat, masked):
    """Grouped key/value heads (once a crash when unmasked: the built attention
    assumed as many key heads as query heads)."""
    torch.manual_seed(0)
    model = GroupedQueryAttention(repeat).eval()
    x = torch.randn(2, 10, 32)
    mask = torch.randn(2, 1, 10, 10) if masked else None
    compiled = torch.compile(model, backend="tpu", options={"cache": False})
    with torch.no_grad():
        torch.testing.assert_close(compiled(x, mask), model(x, mask), **TOLERANCE)
    assert not [f for graph in report.current().graphs for f in graph.fallbacks]


def test_repeated_kv_heads_are_read_in_place():
    from torch.fx.experimental.proxy_tensor import make_fx

    from tpu_inductor.passes.repeated_kv_heads import read_kv_heads_in_place

    def attention(q, k, v, mask):
        return F.scaled_dot_product_attention(q, _repeat_kv(k, 4), _repeat_kv(v, 4), attn_mask=mask)

    torch.manual_seed(0)
    q, k, v, mask = torch.randn(2, 8, 5, 4), torch.randn(2, 2, 7, 4), torch.randn(2, 2, 7, 4), torch.randn(5, 7)
    gm = make_fx(attention, tracing_mode="fake")(q, k, v, mask)
    expected = attention(q, k, v, mask)
    gm = read_kv_heads_in_place(gm)
    (flash,) = gm.graph.find_nodes(op="call_function", target=torch.ops.aten._scaled_dot_product_flash_attention_for_cpu.default)
    placeholders = gm.graph.find_nodes(op="placeholder")
    assert flash.args[1:3] == (placeholders[1], placeholders[2])
    assert not gm.graph.find_nodes(op="call_function", target=torch.ops.aten.expand.default)
    torch.testing.assert_close(gm(q, k, v, mask), expected, **TOLERANCE)


def _causal_bool(length: int, diagonal: int = 0) -> torch.Tensor:
    return torch.ones(length, length, dtype=torch.bool).tril(diagonal)


@pytest.mark.parametrize(
    "make_mask, becomes_causal",
    [
        (lambda n: _causal_bool(n), True),
        (lambda n: torch.zeros(n, n).masked_fill(~_causal_bool(n), float("-inf"))[None, None], True),
        (lambda n: _causal_bool(n, diagonal=1), False),  # one key too many: not causal
        (lambda n: torch.zeros(n, n).masked_fill(~_causal_bool(n), -1e4), False),  # not -inf
    ],
    ids=["bool", "float-4d", "shifted", "finite"],
)
def test_materialised_causal_mask_becomes_is_causal(make_mask, becomes_causal):
    def attend(q, k, v):
        return F.scaled_dot_product_attention(q, k, v, attn_mask=make_mask(q.shape[-2]))

    torch.manual_seed(0)
    q, k, v = torch.randn(2, 4, 6, 8), torch.randn(2, 4, 6, 8), torch.randn(2, 4, 6, 8)
    with torch.no_grad():
        torch.testing.assert_close(torch.compile(attend, backend="tpu")(q, k, v), attend(q, k, v), **TOLERANCE)
    # A causal build needs no guard against rows the mask hides entirely.
    assert ("aten.amax.default" not in _island_ops()) == becomes_causal


def test_mask_from_an_input_is_left_alone():
    torch.manual_seed(0)
    q, mask = torch.randn(2, 4, 6, 8), _causal_bool(6)
    attend = lambda q, mask: F.scaled_dot_product_attention(q, q, q, attn_mask=mask)  # noqa: E731
    with torch.no_grad():
        torch.testing.assert_close(torch.compile(attend, backend="tpu")(q, mask), attend(q, mask), **TOLERANCE)
    assert "aten.amax.default" in _island_ops()


def test_grouped_query_attention_over_changing_lengths_matches_eager():
    """Symbolic lengths take the padded-keys attention: it must broadcast the
    key/value heads over their query heads too (it once raised)."""
    torch.manual_seed(0)
    model = GroupedQueryAttention(repeat=False).eval()
    compiled = torch.compile(model, backend="tpu", options={"cache": False}, dynamic=True)
    with torch.no_grad():
        for length in (5, 7, 12, 9):
            x = torch.randn(2, length, 32)
            torch.testing.assert_close(compiled(x), model(x), **TOLERANCE)
    assert not [f for graph in report.current().graphs for f in graph.fallbacks]


def _cuda_attention_graph(op, *args, **kwargs) -> torch.fx.GraphModule:
    """``op(q, k, v, [bias], *args)[0]`` as an FX graph (built by hand: tracing on CPU never picks a CUDA kernel)."""
    graph = torch.fx.Graph()
    q, k, v, bias = (graph.placeholder(name) for name in ("q", "k", "v", "bias"))
    with_bias = op is not torch.ops.aten._scaled_dot_product_flash_attention.default
    attention = graph.call_function(op, (q, k, v, *((bias, False) if with_bias else ()), *args), kwargs)
    graph.output(graph.call_function(operator.getitem, (attention, 0)))
    return torch.fx.GraphModule(torch.nn.Module(), graph)


@pytest.mark.parametrize("op, is_causal, by_name", [
    (torch.ops.aten._scaled_dot_product_efficient_attention.default, False, False),
    (torch.ops.aten._scaled_dot_product_efficient_attention.default, True, True),
    (torch.ops.aten._scaled_dot_product_cudnn_attention.default, True, False),
    (torch.ops.aten._scaled_dot_product_flash_attention.default, True, False),
])
def test_cuda_attention_becomes_the_cpu_attention_op(op, is_causal, by_name):
    """Traced with CUDA tensors, inference attention is one of CUDA's kernels;
    it becomes the CPU op passes/attention.py builds, with the same numbers."""
    from tpu_inductor.passes.cuda_attention import cuda_attention_as_cpu_attention

    torch.manual_seed(0)
    q, k, v = (torch.randn(2, 4, 6, 8) for _ in range(3))
    bias = torch.randn(2, 4, 6, 6)
    flash = op is torch.ops.aten._scaled_dot_product_flash_attention.default
    flags = ((), {"dropout_p": 0.0, "is_causal": is_causal}) if by_name else ((0.0, is_causal), {})
    gm = cuda_attention_as_cpu_attention(_cuda_attention_graph(op, *flags[0], **flags[1], scale=0.3))
    assert [n.target for n in gm.graph.nodes if n.op == "call_function"][0] is torch.ops.aten._scaled_dot_product_flash_attention_for_cpu.default
    expected = F.scaled_dot_product_attention(q, k, v, attn_mask=None if flash else bias, is_causal=is_causal, scale=0.3)
    torch.testing.assert_close(gm(q, k, v, bias), expected)


def test_cuda_attention_with_dropout_is_left_alone():
    from tpu_inductor.passes.cuda_attention import cuda_attention_as_cpu_attention

    op = torch.ops.aten._scaled_dot_product_efficient_attention.default
    gm = cuda_attention_as_cpu_attention(_cuda_attention_graph(op, 0.1, False))
    assert op in [n.target for n in gm.graph.nodes]


@pytest.mark.parametrize("masked", [False, True])
def test_attention_built_for_a_cuda_graph_stays_on_cuda(masked):
    """Tensors the built attention makes from nothing (the causal positions,
    -inf) are made on the graph's device: a CPU one beside CUDA scores failed
    FakeTensor propagation on the H200. Fake CUDA tensors need no GPU."""
    from torch._subclasses.fake_tensor import FakeTensor, FakeTensorMode

    from tpu_inductor.analysis.real_lengths import RealLengths
    from tpu_inductor.passes.attention import decompose_attention

    mode = FakeTensorMode()
    graph = torch.fx.Graph()
    shapes = {"q": (2, 4, 6, 8), "k": (2, 4, 6, 8), "v": (2, 4, 6, 8), **({"mask": (2, 1, 6, 6)} if masked else {})}
    inputs = {}
    for name, shape in shapes.items():
        inputs[name] = graph.placeholder(name)
        inputs[name].meta["val"] = FakeTensor(mode, torch.empty(shape, device="meta"), torch.device("cuda"))
    op = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu.default
    kwargs = {"attn_mask": inputs["mask"]} if masked else {}
    attention = graph.call_function(op, (inputs["q"], inputs["k"], inputs["v"], 0.0, not masked), kwargs)
    out = graph.call_function(operator.getitem, (attention, 0))
    with mode:
        attention.meta["val"] = op(*(inputs[n].meta["val"] for n in "qkv"), 0.0, not masked,
                                   **({"attn_mask": inputs["mask"].meta["val"]} if masked else {}))
    out.meta["val"] = attention.meta["val"][0]
    graph.output(out)
    gm = torch.fx.GraphModule(torch.nn.Module(), graph)
    gm = decompose_attention(gm, frozenset(), RealLengths(gm))
    assert op not in [n.target for n in gm.graph.nodes]
    devices = {n.meta["val"].device.type for n in gm.graph.nodes if isinstance(n.meta.get("val"), torch.Tensor)}
    assert devices == {"cuda"}
