"""Higher-order ops in the ATen graph run on the device, not in eager.

``flex_attention`` (FlexAttention: attention with a score modification and a
mask written as Python functions) and ``invoke_subgraph``
(``torch.compiler.nested_compile_region``) reach the backend as calls of
subgraphs, which no lowering knows: they ran in eager PyTorch. Each test
asserts the numbers against eager and that nothing ran in eager.

Tolerance: torch.testing's float32 defaults. FlexAttention's eager reference
on CPU is PyTorch's math implementation, the same arithmetic the rewrite
traces (float32 scores, softmax, two matmuls); only XLA's summation order
differs, a few ULPs of values of order 1.
"""

from __future__ import annotations

import pytest
import torch
from torch.nn.attention.flex_attention import create_block_mask, flex_attention

import tpu_inductor.report as report
from tpu_inductor.passes.rewrite import inline_replacement, trace_replacement

OPTIONS = {"cache": False, "strict": True}

BATCH, HEADS, KV_HEADS, LENGTH, HEAD_DIM = 2, 4, 2, 64, 16
HEAD_SLOPES = torch.tensor([0.5, 0.25, 0.125, 0.0625])
DOCUMENTS = torch.tensor([0] * 20 + [1] * 30 + [2] * 14)


def alibi(score, b, h, q_idx, kv_idx):
    """A score modification that reads a captured tensor per head (ALiBi)."""
    return score - HEAD_SLOPES[h] * (q_idx - kv_idx).abs()


def causal_within_document(b, h, q_idx, kv_idx):
    """A mask that reads a captured tensor (document masking of packed sequences)."""
    return (DOCUMENTS[q_idx] == DOCUMENTS[kv_idx]) & (q_idx >= kv_idx)


def first_rows_see_nothing(b, h, q_idx, kv_idx):
    return (q_idx >= 8) & (kv_idx <= q_idx)


def _inputs() -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    torch.manual_seed(0)
    return (torch.randn(BATCH, HEADS, LENGTH, HEAD_DIM), torch.randn(BATCH, KV_HEADS, LENGTH, HEAD_DIM),
            torch.randn(BATCH, KV_HEADS, LENGTH, HEAD_DIM))


def _assert_on_device(expected_islands: int = 1) -> None:
    current = report.current()
    assert current.fallbacks() == [], [(f.op, f.reason) for f in current.fallbacks()]
    assert len(current.islands()) == expected_islands


@pytest.mark.parametrize("mask_mod", [causal_within_document, first_rows_see_nothing])
def test_flex_attention_runs_on_the_device(mask_mod):
    """Grouped-query heads, a score modification and a mask that read captured
    tensors; rows the mask hides entirely give zeros (eager's safe softmax), not NaN."""
    block_mask = create_block_mask(mask_mod, None, None, LENGTH, LENGTH, device="cpu")

    def attention(q, k, v):
        return flex_attention(q, k, v, score_mod=alibi, block_mask=block_mask, enable_gqa=True)

    q, k, v = _inputs()
    expected = attention(q, k, v)
    report.reset()
    actual = torch.compile(attention, backend="tpu", options=OPTIONS)(q, k, v)
    torch.testing.assert_close(actual, expected)
    if mask_mod is first_rows_see_nothing:
        assert not actual[:, :, :8].any()
    _assert_on_device()


def test_flex_attention_log_sum_exp():
    def attention(q, k, v):
        out, lse = flex_attention(q, k, v, enable_gqa=True, return_lse=True)
        return out, lse

    q, k, v = _inputs()
    expected = attention(q, k, v)
    report.reset()
    actual = torch.compile(attention, backend="tpu", options=OPTIONS)(q, k, v)
    torch.testing.assert_close(actual, expected)
    _assert_on_device()


def _eager_and_compiled_step(loss, x: torch.Tensor, weight: torch.Tensor) -> tuple[tuple, tuple]:
    """``(loss, its gradient for weight)`` in eager, then under backend="tpu" (report reset before)."""
    expected = loss(x)
    (expected_grad,) = torch.autograd.grad(expected, weight)
    report.reset()
    actual = torch.compile(loss, backend="tpu", options=OPTIONS)(x)
    (actual_grad,) = torch.autograd.grad(actual, weight)
    return (expected, expected_grad), (actual, actual_grad)


@torch.compiler.nested_compile_region
def _layer(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    return torch.tanh(x @ weight) + x


def test_nested_compile_region_is_inlined():
    """Inference and a training step: each graph one island, the region's
    calls (forward and backward) inlined."""
    torch.manual_seed(0)
    weight = torch.randn(16, 16, requires_grad=True)
    x = torch.randn(8, 16)

    def loss(x):
        return _layer(_layer(x, weight), weight).pow(2).sum()

    (expected, expected_grad), (actual, actual_grad) = _eager_and_compiled_step(loss, x, weight)
    torch.testing.assert_close(actual, expected)
    # Each gradient element sums 8 x 16 products of values up to ~30: a few
    # ULPs of that magnitude apart when XLA sums in another order.
    torch.testing.assert_close(actual_grad, expected_grad, rtol=1e-5, atol=1e-6 * expected_grad.abs().max().item())
    _assert_on_device(expected_islands=2)  # forward and backward


def test_inlined_constants_keep_their_own_values():
    """Two inlined replacements whose traces each hold a constant named
    ``_tensor_constant0``: the second must not overwrite the first (the names
    were once numbered by the graph's state_dict, which such constants did
    not enter)."""
    graph = torch.fx.Graph()
    x = graph.placeholder("x")
    first = graph.call_function(torch.ops.aten.neg.default, (x,))
    second = graph.call_function(torch.ops.aten.neg.default, (first,))
    graph.output(second)
    gm = torch.fx.GraphModule(torch.nn.Module(), graph)
    from torch._subclasses.fake_tensor import FakeTensorMode

    fake = FakeTensorMode().from_tensor(torch.zeros(3))
    for node in (x, first, second):
        node.meta["val"] = fake
    def adding(constant: list[float]):
        return lambda t: t + torch.tensor(constant)

    for node, constant in ((first, [1.0, 2.0, 3.0]), (second, [10.0, 20.0, 30.0])):
        replacement = trace_replacement(adding(constant), [fake])
        assert any(n.op == "get_attr" for n in replacement.graph.nodes)
        inline_replacement(gm, node, replacement, [node.args[0]])
    gm.recompile()
    torch.testing.assert_close(gm(torch.zeros(3)), torch.tensor([11.0, 22.0, 33.0]))


def _branchy(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """Data-dependent control flow: the log branch is NaN wherever the other is taken."""
    y = x @ w
    return torch.cond(y.sum() > 0, lambda y: y.log1p().sin(), lambda y: (y * 2).cos() + 1, (y,))


@pytest.mark.parametrize("sign", [1.0, -1.0], ids=["true-branch", "false-branch"])
def test_cond_runs_both_branches_on_the_device_and_selects(sign):
    torch.manual_seed(0)
    x, w = torch.randn(4, 8).abs() * sign, torch.rand(8, 8)
    expected = _branchy(x, w)
    report.reset()
    actual = torch.compile(_branchy, backend="tpu", options=OPTIONS)(x, w)
    torch.testing.assert_close(actual, expected)
    assert torch.isfinite(actual).all()  # the untaken branch's NaNs are not selected
    _assert_on_device()


def test_cond_trains_on_the_device():
    """The forward's conditional and the backward's (AOTAutograd's own cond
    over the branches' gradients), each selected."""
    torch.manual_seed(0)
    w = torch.rand(8, 8, requires_grad=True)

    def loss(x):
        return _branchy(x, w).pow(2).sum()

    for x in (torch.rand(4, 8), -torch.rand(4, 8)):
        torch._dynamo.reset()
        (expected, expected_grad), (actual, actual_grad) = _eager_and_compiled_step(loss, x, w)
        torch.testing.assert_close(actual, expected)
        torch.testing.assert_close(actual_grad, expected_grad)
        _assert_on_device(expected_islands=2)


def test_nested_cond():
    def nested(x):
        inner = lambda x: torch.cond(x.mean() > 0.5, lambda x: x + 1, lambda x: x - 1, (x,))
        return torch.cond(x.sum() > 0, inner, lambda x: x * 3, (x,))

    for x in (torch.rand(5), torch.rand(5) * 0.1, -torch.rand(5)):
        torch._dynamo.reset()
        report.reset()
        torch.testing.assert_close(torch.compile(nested, backend="tpu", options=OPTIONS)(x), nested(x))
        _assert_on_device()


def test_cond_whose_branch_draws_random_numbers_stays_eager():
    """Running the untaken branch would advance torch's generator where eager
    does not: the conditional runs in eager, named in the report. The draw
    sits in a nested conditional whose predicate holds, inside the branch not
    taken: selecting the outer conditional would run the inner one, and draw."""

    def noisy(x):
        inner = lambda x: torch.cond(x.mean() > 0.5, lambda x: x + torch.rand_like(x), lambda x: x * 2, (x,))
        return torch.cond(x[0] > 0, inner, lambda x: x.clone(), (x,))

    x = torch.tensor([-1.0, 2.0, 2.0, 2.0, 2.0, 2.0])  # outer: false; inner: true
    torch.manual_seed(1)
    expected, expected_next_draw = noisy(x), torch.rand(3)
    report.reset()
    compiled = torch.compile(noisy, backend="tpu", options={"cache": False, "fallback_random": True})
    torch.manual_seed(1)
    actual, next_draw = compiled(x), torch.rand(3)
    torch.testing.assert_close(actual, expected)
    torch.testing.assert_close(next_draw, expected_next_draw)  # the generator moved as in eager
    (fallback,) = report.current().fallbacks()
    assert fallback.op == "cond" and fallback.reason == "torch.cond stays eager: a branch draws random numbers"
