"""topk over tied values: eager's CPU kernel decides the order, so it runs there.

PyTorch's CPU ``topk`` breaks ties however libstdc++'s ``partial_sort`` or
``nth_element`` leaves them (``analysis/tie_sensitive_ops.py``), and zero- or
constant-initialised weights tie everything: ``afmoe``'s router (every expert
scores 0.5) and the RT-DETR family's query selection (``d_fine``, ``deimv2``,
``pp_doclayout_v3``: all encoder scores equal ``-log 2``) picked other experts
and queries on the device than in eager, and every output differed.

The first half checks :func:`tie_order_reason` and :func:`keep_unsorted_topk`
on traced graphs and eager kernels alone. The second compiles, and needs them
wired into the backend (the support table and the decomposition table).
"""

from __future__ import annotations

import pytest
import torch
from torch.fx.experimental.proxy_tensor import make_fx

import tpu_inductor.report as report
from tpu_inductor.analysis.tie_sensitive_ops import keep_unsorted_topk, tie_order_reason

aten = torch.ops.aten


def topk_node(fn, *args) -> torch.fx.Node:
    gm = make_fx(fn)(*args)
    (node,) = [n for n in gm.graph.nodes if n.target is aten.topk.default]
    return node


X8 = torch.randn(3, 8)
X256 = torch.randn(3, 256)


# ---------------------------------------------------------------- the rule


def test_indices_read_runs_on_the_kernel():
    reason = tie_order_reason(topk_node(lambda x: torch.topk(x, 4), X8))
    assert reason is not None and "indices" in reason
    assert tie_order_reason(topk_node(lambda x: torch.topk(x, 2)[1] + 1, X256)) is not None
    assert tie_order_reason(topk_node(lambda x: torch.topk(x, 1, dim=0, largest=False)[1], X8)) is not None


def test_sorted_values_alone_lower():
    assert tie_order_reason(topk_node(lambda x: torch.topk(x, 4)[0].sum(-1), X8)) is None
    assert tie_order_reason(topk_node(lambda x: torch.topk(x, 3, largest=False).values, X256)) is None


def test_unsorted_values_in_nth_element_order_run_on_the_kernel():
    reason = tie_order_reason(topk_node(lambda x: torch.topk(x, 4, sorted=False)[0], X8))
    assert reason is not None and "nth_element" in reason
    # k * 64 <= n: eager's partial_sort returns them sorted, which lowers.
    assert tie_order_reason(topk_node(lambda x: torch.topk(x, 4, sorted=False)[0], X256)) is None
    assert tie_order_reason(topk_node(lambda x: torch.topk(x, 1, sorted=False)[0], X8)) is None


def test_nothing_to_order():
    assert tie_order_reason(topk_node(lambda x: torch.topk(x, 0), X8)) is None
    assert tie_order_reason(topk_node(lambda x: torch.topk(x, 1, dim=0), torch.randn(1, 5))) is None
    gm = make_fx(lambda x: torch.sort(x)[1] + x.argmax(-1, keepdim=True))(X8)
    assert all(tie_order_reason(n) is None for n in gm.graph.nodes)


def test_eager_tie_order_is_neither_stable_nor_first_index():
    """Why no decomposition is attempted: the pins of the module docstring."""
    assert torch.topk(torch.zeros(8), 4).indices.tolist() == [6, 5, 4, 7]
    assert torch.topk(torch.zeros(4), 1).indices.tolist() == [2]
    assert torch.topk(torch.zeros(128), 1).indices.tolist() == [0]
    g = torch.Generator().manual_seed(0)
    x = torch.randint(0, 3, (50, 128), generator=g).float()
    stable = torch.sort(x, descending=True, stable=True).indices[:, :2]
    assert not torch.equal(torch.topk(x, 2).indices, stable)  # partial_sort path too


# ---------------------------------------------------------------- sorted=False


@pytest.mark.parametrize("n,k", [(64, 1), (128, 2), (256, 4), (1000, 15)])
def test_sorted_rewrite_is_exact_on_the_partial_sort_path(n, k):
    """k * 64 <= n: eager ignores sorted=False, indices and ties included."""
    g = torch.Generator().manual_seed(n + k)
    for largest in (True, False):
        for _ in range(20):
            x = torch.randint(0, 4, (3, n), generator=g).float()
            want = torch.topk(x, k, largest=largest, sorted=False)
            got = keep_unsorted_topk(x, k, -1, largest, False)
            assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])


def test_unsorted_topk_kept_where_eager_does_not_sort():
    assert keep_unsorted_topk(X8, 4, -1, True, False) is NotImplemented
    assert keep_unsorted_topk(X256, 4, -1, True, True) is NotImplemented
    x = torch.tensor([5.0, 1, 7, 3, 8, 2, 6, 4])
    assert torch.topk(x, 4, sorted=False).values.tolist() == [7.0, 8.0, 6.0, 5.0]  # not sorted


# ---------------------------------------------------------------- compiled


def compiled(fn):
    return torch.compile(fn, backend="tpu", options={"cache": False}, dynamic=False)


def fallback_ops() -> list[str]:
    return [f.op for f in report.current().fallbacks()]


def every_topk(k: int):
    def fn(x):
        return tuple(
            torch.topk(x, k, dim=-1, largest=largest, sorted=is_sorted)
            for largest in (True, False)
            for is_sorted in (True, False)
        )

    return fn


@pytest.mark.parametrize("n,k", [(4, 2), (8, 4), (84, 30), (16, 1), (7, 7), (200, 3)])
def test_tied_topk_matches_eager(n, k):
    fn = compiled(every_topk(k))
    g = torch.Generator().manual_seed(n * 100 + k)
    inputs = [torch.zeros(5, n), torch.full((5, n), 0.5)]
    inputs += [torch.randint(0, levels, (5, n), generator=g).float() for levels in (2, 3, 5) for _ in range(3)]
    for x in inputs:
        got, want = fn(x), every_topk(k)(x)
        for (gv, gi), (wv, wi) in zip(got, want):
            assert torch.equal(gv, wv) and torch.equal(gi, wi), (x, gi, wi)


def test_tied_integer_topk_matches_eager():
    fn = compiled(every_topk(3))
    x = torch.randint(0, 3, (6, 20), generator=torch.Generator().manual_seed(1))
    for (gv, gi), (wv, wi) in zip(fn(x), every_topk(3)(x)):
        assert torch.equal(gv, wv) and torch.equal(gi, wi)


def test_sorted_values_alone_stay_on_the_device():
    fn = lambda x: torch.topk(x, 4, dim=-1)[0].mean(-1)  # noqa: E731 - d_fine's distribution stats
    x = torch.zeros(3, 8)
    torch.testing.assert_close(compiled(fn)(x), fn(x))
    assert fallback_ops() == []


class ZeroRouter(torch.nn.Module):
    """afmoe's token-choice router: a zero-initialised gate ties all experts."""

    def __init__(self, hidden: int = 16, experts: int = 4, top_k: int = 2):
        super().__init__()
        self.gate = torch.nn.Linear(hidden, experts, bias=False)
        torch.nn.init.zeros_(self.gate.weight)
        self.experts = torch.nn.Parameter(torch.randn(experts, hidden, hidden) * 0.1)
        self.top_k = top_k

    def forward(self, x):
        scores = torch.sigmoid(self.gate(x))
        _, chosen = torch.topk(scores, self.top_k, dim=-1)
        weights = scores.gather(-1, chosen)
        weights = weights / weights.sum(-1, keepdim=True)
        per_expert = torch.einsum("th,ehd->ted", x, self.experts)
        picked = per_expert.gather(1, chosen[..., None].expand(-1, -1, x.shape[-1]))
        return (picked * weights[..., None]).sum(1)


def test_zero_initialised_router_matches_eager():
    router = ZeroRouter().eval()
    x = torch.randn(8, 16)
    with torch.no_grad():
        torch.testing.assert_close(compiled(router)(x), router(x))


def test_tied_query_selection_matches_eager():
    """RT-DETR's two-stage query selection over all-equal encoder scores."""
    head = torch.nn.Linear(8, 3)

    def select(memory):
        scores = head(memory * 0)  # every token scores the bias
        _, index = torch.topk(scores.max(-1).values, 30, dim=1)
        return memory.gather(1, index.unsqueeze(-1).repeat(1, 1, memory.shape[-1]))

    memory = torch.randn(2, 84, 8)
    with torch.no_grad():
        torch.testing.assert_close(compiled(select)(memory), select(memory))
