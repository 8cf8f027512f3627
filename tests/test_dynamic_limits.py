"""Where dynamic shapes meet a limit: the recompile budget (sizes per dim),
Dynamo's guards on a bucket, and ops torch-mlir lowers only at static sizes.

Results are compared with eager at torch.testing's float32 defaults; where a
test is about the device path, ``strict`` makes any op left to eager an error
or the report's dynamic graphs are read for calls in eager.
"""

from __future__ import annotations

import pytest
import torch

import tpu_inductor.report as report
from tpu_inductor.dynamic.buckets import BucketPolicy
from tpu_inductor.errors import RecompileBudgetWarning

OPTIONS = {"cache": False}


def compiled(fn, dynamic=None, **options):
    return torch.compile(fn, backend="tpu", options={**OPTIONS, **options}, dynamic=dynamic)


def _normalise_both(x, y):
    return x.softmax(0).sum(0) + y.softmax(0).sum(0)  # two dims at exact sizes


def test_recompile_budget_counts_sizes_per_dim():
    """Two dims that change independently (a source length and a cache length)
    compile their sizes' product; a third size of one dim is what the budget stops."""
    fn = compiled(_normalise_both, dynamic=True, recompile_budget=2)
    for rows_x, rows_y in ((4, 5), (6, 5), (4, 7), (6, 7)):
        x, y = torch.randn(rows_x, 3), torch.randn(rows_y, 3)
        torch.testing.assert_close(fn(x, y), _normalise_both(x, y))
    assert [r.outcome for r in report.current().recompiles] == ["compiled"] * 4
    x, y = torch.randn(10, 3), torch.randn(5, 3)
    with pytest.warns(RecompileBudgetWarning) as caught:
        torch.testing.assert_close(fn(x, y), _normalise_both(x, y))
    message = str(caught[0].message)
    assert "L['x'].size()[0] (" in message and "L['y'].size()[0] (" not in message, message  # only x kept changing
    assert report.current().recompiles[-1].outcome == "eager: recompile budget of 2 reached"


def test_buckets_bounded_by_an_exact_size_are_lowered_to_keep_the_guard():
    """A sliding-window cache whose window is a symbol compiled at its exact
    size (s1 = 32): its guard s0 + 2 < s1 holds until the window fills, so the
    cache's bucket 32 breaks it; the buckets are lowered to 29 together, not
    left at each exact size (one executable per length)."""
    import sympy
    from types import SimpleNamespace

    from tpu_inductor.dynamic.buckets import choose_buckets

    s0, s1, s2 = sympy.symbols("s0 s1 s2", positive=True, integer=True)
    guards = [sympy.Lt(s0 + 2, s1), sympy.Eq(s0, s2)]
    env = SimpleNamespace(guards=[SimpleNamespace(expr=g) for g in guards], var_to_range={})
    for length in (17, 23, 29):
        chosen = choose_buckets({s0: length, s2: length, s1: 32}, frozenset({s0, s2}), {}, BucketPolicy(), env)
        assert chosen == {s0: 29, s2: 29, s1: 32}
    assert choose_buckets({s0: 9, s2: 9, s1: 32}, frozenset({s0, s2}), {}, BucketPolicy(), env) == {s0: 16, s2: 16, s1: 32}


def _positions_and_order(mask, x):
    positions = (mask.cumsum(-1) - 1).clamp(min=0)  # OPT's and RoBERTa's positions from the mask
    return x * positions.unsqueeze(-1), x.sum(-1).argsort(-1)


def test_ops_torch_mlir_lowers_only_at_static_sizes_run_on_the_device():
    """``cumsum`` and ``sort`` along a dynamic dim fail torch-mlir's dynamic-shape
    lowering; their island is lowered per bucket at static sizes
    (dynamic/island.py, ``PerBucketIsland``) instead of leaving them to eager.
    strict: any op in eager is an error."""
    fn = compiled(_positions_and_order, strict=True)
    for length in (7, 5, 9, 12):
        mask = torch.ones(2, length, dtype=torch.long)
        mask[1, : length // 3] = 0
        x = torch.randn(2, length, 3)
        got, want = fn(mask, x), _positions_and_order(mask, x)
        torch.testing.assert_close(got[0], want[0])
        assert torch.equal(got[1], want[1])
    (dynamic,) = report.current().dynamic_graphs
    assert dynamic.device_calls == 3 and dynamic.eager_calls == 0
    assert {i.lower_source for g in report.current().graphs for i in g.islands} >= {"torch-mlir"}


def test_an_island_lowered_per_bucket_starts_warm_without_torch_mlir(tmp_path, monkeypatch):
    """A restarted process finds the per-bucket island's verdict and its static
    lowerings in the graph cache: no torch-mlir run, not even the failing one."""
    from tpu_inductor.lowering import cache

    options = {"cache": True, "cache_dir": str(tmp_path), "strict": True}
    symbolic_lowerings = []

    def counted(*args, **kwargs):
        symbolic_lowerings.append(args[0])
        return lower_symbolic(*args, **kwargs)

    lower_symbolic = cache.lower_symbolic
    monkeypatch.setattr(cache, "lower_symbolic", counted)

    def run_once() -> list[str]:
        fn = compiled(_positions_and_order, **options)
        for length in (7, 5, 9):
            mask = torch.ones(2, length, dtype=torch.long)
            x = torch.randn(2, length, 3)
            torch.testing.assert_close(fn(mask, x)[0], _positions_and_order(mask, x)[0])
        return [i.lower_source for g in report.current().graphs for i in g.islands]

    assert "torch-mlir" in run_once() and symbolic_lowerings
    torch._dynamo.reset()
    report.reset()
    symbolic_lowerings.clear()
    assert "torch-mlir" not in run_once()
    assert symbolic_lowerings == []
