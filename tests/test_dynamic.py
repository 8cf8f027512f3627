"""Dynamic shapes: the padding-safety analysis, bounded lowerings and compiles,
buckets, the recompile budget, SymInt arguments, symbolic output shapes.

Compiled results are compared with eager at torch.testing's float32 defaults
(rtol 1.3e-6, atol 1e-5) for elementwise graphs and at rtol 1e-4 / atol 1e-5
for models with matmuls and softmax (XLA sums in a different order; padded
runs sum the same real terms, since padded ones are exact zeros or masked).
"""

from __future__ import annotations

import random

import pytest
import torch
import torch.nn.functional as F
from torch.fx.experimental.proxy_tensor import make_fx

import tpu_inductor.report as report
from models import GPT, MLP  # tests/ is on sys.path (pytest rootdir-relative import)
from tpu_inductor.config import Config
from tpu_inductor.dynamic.buckets import BucketPolicy
from tpu_inductor.errors import ConfigError, RecompileBudgetError, RecompileBudgetWarning
from tpu_inductor.decompositions.table import decomposition_table
from tpu_inductor.analysis.padding_safety import analyze_padding, expr_of

OPTIONS = {"cache": False}
MODEL_TOL = dict(rtol=1e-4, atol=1e-5)


def compiled(fn, dynamic=None, **options):
    return torch.compile(fn, backend="tpu", options={**OPTIONS, **options}, dynamic=dynamic)


def verdicts(fn, *inputs) -> dict[tuple[int, int], str]:
    """(input, dim) -> "safe" or the analysis' reason, on fn's symbolic ATen graph."""
    gm = make_fx(
        fn, decomposition_table=decomposition_table(keep_attention=True), tracing_mode="symbolic"
    )(*inputs)
    analysis = analyze_padding(gm)
    found = {}
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    for index, node in enumerate(placeholders):
        for dim, size in enumerate(node.meta["val"].shape):
            symbols = expr_of(size).free_symbols
            if symbols:
                (symbol,) = symbols
                found[(index, dim)] = "safe" if symbol in analysis.safe else analysis.unsafe[symbol]
    return found


def dynamic_records():
    return report.current().dynamic_graphs


def islands_of(graph_id: int):
    return next(g for g in report.current().graphs if g.graph_id == graph_id).islands


# --- the padding-safety analysis -------------------------------------------------


def _mlp(x, w):
    return torch.relu(x @ w).tanh() + 1


def _merge_split(x, w):
    b, t, c = x.shape
    return (x.reshape(b * t, c) @ w).view(b, t, -1).sigmoid()


def _causal(q, k, v):
    return F.scaled_dot_product_attention(q, k, v, is_causal=True) * 2


def _bidirectional(q, k, v):
    return F.scaled_dot_product_attention(q, k, v) * 2


def _embed(idx, table):
    return F.embedding(idx, table) * 2


Q = torch.randn(2, 3, 5, 4)


@pytest.mark.parametrize(
    "fn, inputs, safe",
    [
        (_mlp, (torch.randn(5, 7), torch.randn(7, 3)), [(0, 0), (1, 1)]),
        (_merge_split, (torch.randn(2, 5, 7), torch.randn(7, 3)), [(0, 0), (0, 1), (1, 1)]),
        (_causal, (Q, Q.clone(), Q.clone()), [(0, 0), (0, 1), (0, 2)]),
        (_embed, (torch.randint(0, 11, (2, 5)), torch.randn(11, 4)), [(0, 0), (0, 1), (1, 1)]),
        (lambda x: x.unsqueeze(0).expand(3, -1, -1).permute(2, 0, 1) * 2, (torch.randn(5, 7),), [(0, 0), (0, 1)]),
        # A prefix scan reads positions 0..j only: padding after them never reaches them.
        (lambda x: x.cumsum(0) * 2, (torch.randn(5, 7),), [(0, 0)]),
        # Padded keys are hidden by the real key length, causal or not (passes/attention.py).
        (_bidirectional, (Q, Q.clone(), Q.clone()), [(0, 2)]),
        # Read at the real end / put at the real offset (passes/padded_positions.py).
        (lambda x: x[-1] * 2, (torch.randn(5, 7),), [(0, 0)]),
        (lambda x: x[-2:] * 2, (torch.randn(5, 7),), [(0, 0)]),
        (lambda x: torch.cat([x, x]) * 2, (torch.randn(5, 7),), [(0, 0)]),
        (lambda x: x[1:] * 2, (torch.randn(5, 7),), [(0, 0)]),
    ],
    ids=["mlp-batch", "view-merge-split", "causal-attention-seq", "embedding-lookup", "expand-permute",
         "cumsum", "non-causal-attention", "select-last", "slice-last-two", "cat", "slice-from-one"],
)
def test_analysis_proves_position_preserving_dims_safe(fn, inputs, safe):
    found = verdicts(fn, *inputs)
    for key in safe:
        assert found[key] == "safe", (key, found[key])


@pytest.mark.parametrize(
    "fn, inputs, key, reason",
    [
        (lambda x: x.sum(0) + 1, (torch.randn(5, 7),), (0, 0), "reduces over it"),
        (lambda x: x.mean(0) + 1, (torch.randn(5, 7),), (0, 0), "reduces over it"),
        (lambda x: x.softmax(0), (torch.randn(5, 7),), (0, 0), "normalises over it"),
        (lambda x: F.layer_norm(x, x.shape[-1:]), (torch.randn(5, 7),), (0, 1), "over it"),
        (lambda x, w: x @ w, (torch.randn(5, 7), torch.randn(7, 3)), (0, 1), "contracts over it"),
        (lambda x: x.flip(0) * 2, (torch.randn(5, 7),), (0, 0), "reverses it"),
        (lambda x: x.sort(0).values, (torch.randn(5, 7),), (0, 0), "sorts along it"),
        (lambda x: x[::2] * 2, (torch.randn(5, 7),), (0, 0), "slices it"),
        (lambda x: F.pad(x, (0, 0, 0, 1)) * 2, (torch.randn(5, 7),), (0, 0), "no padding rule"),
        (lambda x: torch.cat([x.view(-1), x.view(-1)]) * 2, (torch.randn(5, 7),), (0, 0), "merge"),
        # Index values count real positions of the flattened rows: only the outer dim may pad.
        (lambda x, i: x.flatten()[i] * 2, (torch.randn(5, 7), torch.tensor([8, 0])), (0, 1), "by data indices"),
        (lambda x, i: x.flatten().index_put((i,), torch.ones(2)).view(x.shape),
         (torch.randn(5, 7), torch.tensor([8, 0])), (0, 1), "by data indices"),
    ],
    ids=["sum", "mean", "softmax", "layer_norm", "matmul-k", "flip", "sort", "strided-slice",
         "pad-at-end", "cat-of-merged-dims", "gather-from-flattened", "write-into-flattened"],
)
def test_analysis_rejects_dims_where_positions_mix(fn, inputs, key, reason):
    found = verdicts(fn, *inputs)
    assert found[key] != "safe"
    assert reason in found[key], found[key]


def test_flattened_rows_indexed_by_data_match_eager_at_every_size():
    """``dynamic=True`` padded the inner dim of ``x.flatten()[i]`` (3 -> 4):
    flat position 4 read the value at 3, and 3 read padding (before the fix:
    ``[3., 0., 0.]`` against eager's ``[4., 3., 0.]``)."""

    def gather_and_write(x, i):
        return x.flatten()[i], x.flatten().index_put((i,), torch.full(i.shape, -1.0)).view(x.shape)

    compiled = torch.compile(gather_and_write, backend="tpu", dynamic=True, options={"cache": False})
    for rows, columns in ((5, 3), (6, 3), (5, 7), (9, 5)):
        x = torch.arange(float(rows * columns)).view(rows, columns)
        i = torch.tensor([4, 3, 0, rows * columns - 1])
        for got, expected in zip(compiled(x, i), gather_and_write(x, i)):
            torch.testing.assert_close(got, expected, rtol=0, atol=0)


class _PositionEmbedding(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.pos = torch.nn.Parameter(torch.randn(1, 12, 4))

    def forward(self, x):
        return x + self.pos[:, : x.shape[1]]


def test_prefix_slice_of_a_parameter_bounds_the_bucket():
    model = _PositionEmbedding()
    fn = compiled(model)
    with torch.no_grad():
        for length in (5, 7, 11, 9):
            x = torch.randn(2, length, 4)
            torch.testing.assert_close(fn(x), model(x))
    (dynamic,) = dynamic_records()
    assert dynamic.padded  # safe, but never padded past the parameter's 12 rows
    assert _compiled_buckets() == [8, 12]


# --- bounded lowerings and compiles, results equal to eager ---------------------


def test_mlp_many_batch_sizes_one_lowering_one_compile_per_bucket():
    torch.manual_seed(0)
    model = MLP().eval()
    fn = compiled(model)
    sizes = random.Random(0).sample(range(2, 41), 24)
    with torch.no_grad():
        for size in sizes:
            x = torch.randn(size, 16)
            torch.testing.assert_close(fn(x), model(x), **MODEL_TOL)
    (dynamic,) = dynamic_records()
    assert dynamic.lowerings == 1 and list(dynamic.padded.values()) == ["L['x'].size()[0]"]
    buckets = {BucketPolicy().bucket(s) for s in sizes[1:]}  # the first call is traced static
    recompiles = report.current().recompiles
    assert {r.bucket[next(iter(r.bucket))] for r in recompiles} == buckets
    assert all(r.outcome == "compiled" for r in recompiles)
    assert len(islands_of(dynamic.graph_id)) == len(buckets)
    assert report.compile_counts()["dynamo_traces"] == 2


def test_causal_decoder_many_lengths_padded_along_the_sequence():
    torch.manual_seed(0)
    model = GPT(block_size=64).eval()
    fn = compiled(model)
    lengths = random.Random(1).sample(range(3, 65), 12)
    with torch.no_grad():
        for length in lengths:
            idx = torch.randint(0, 50, (2, length))
            torch.testing.assert_close(fn(idx), model(idx), **MODEL_TOL)
    (dynamic,) = dynamic_records()
    assert list(dynamic.padded.values()) == ["L['idx'].size()[1]"] and not dynamic.exact
    assert dynamic.lowerings == 1
    assert len(report.current().recompiles) == len({BucketPolicy().bucket(n) for n in lengths[1:]})
    assert report.compile_counts()["dynamo_traces"] == 2
    assert not report.current().fallbacks()


def test_padded_value_rows_never_leak_into_causal_attention():
    # log(0) = -inf in the padded rows of v: 0 * -inf would be NaN without the masking.
    def attend(q, k, v):
        return F.scaled_dot_product_attention(q, k, torch.log(v), is_causal=True)

    fn = compiled(attend, dynamic=True)
    for length in (5, 11, 3):
        q, k = torch.randn(1, 2, length, 4), torch.randn(1, 2, length, 4)
        v = torch.rand(1, 2, length, 4) + 0.5
        torch.testing.assert_close(fn(q, k, v), attend(q, k, v), **MODEL_TOL)
    (dynamic,) = dynamic_records()
    assert len(dynamic.padded) >= 1 and all("s" in k for k in dynamic.padded)
    assert any(r.bucket != r.sizes for r in report.current().recompiles)


def test_attention_with_a_mask_argument_under_dynamic_shapes():
    """attn_mask is a tensor argument of SDPA: it must be traced as an input when
    the dynamic path decomposes attention (it was passed as an FX node: jetmoe)."""

    def attend(x, mask):
        return F.scaled_dot_product_attention(x, x, x, attn_mask=mask) + 1

    fn = compiled(attend)
    for length in (4, 6, 9):
        x = torch.randn(1, 2, length, 8)
        mask = torch.randn(length, length) > -0.5
        mask |= torch.eye(length, dtype=torch.bool)
        torch.testing.assert_close(fn(x, mask), attend(x, mask), **MODEL_TOL)


def test_non_causal_attention_is_padded_with_the_keys_past_the_real_length_hidden():
    def attend(x):
        return F.scaled_dot_product_attention(x, x, torch.log(x.abs() + 0.5)) + 1

    fn = compiled(attend)
    for length in (4, 6, 9, 11):
        x = torch.randn(1, 2, length, 8)
        torch.testing.assert_close(fn(x), attend(x), **MODEL_TOL)
    (dynamic,) = dynamic_records()
    assert dynamic.padded and not dynamic.exact
    assert any(r.bucket != r.sizes for r in report.current().recompiles)
    assert dynamic.eager_calls == 0 and dynamic.device_calls == 3  # the first call ran the static graph


@pytest.mark.parametrize("mode", ["dynamic=True", "mark_dynamic"])
def test_one_symbolic_trace_with_dynamic_true_and_mark_dynamic(mode):
    model = MLP().eval()
    fn = compiled(model, dynamic=True if mode == "dynamic=True" else None)
    with torch.no_grad():
        for size in (3, 9, 5, 17, 12):
            x = torch.randn(size, 16)
            if mode == "mark_dynamic":
                torch._dynamo.mark_dynamic(x, 0)
            torch.testing.assert_close(fn(x), model(x), **MODEL_TOL)
    assert report.compile_counts()["dynamo_traces"] == 1
    (dynamic,) = dynamic_records()
    assert dynamic.lowerings == 1 and "L['x'].size()[0]" in dynamic.padded.values()
    assert _compiled_buckets() == [4, 8, 16, 32]  # of sizes 3, 9, 5, 17, 12


def test_training_step_with_dynamic_batch_matches_eager_gradients():
    torch.manual_seed(0)
    model, reference = MLP(), MLP()
    reference.load_state_dict(model.state_dict())
    fn = compiled(model)
    for size in (4, 6, 11, 13):
        x = torch.randn(size, 16)
        fn(x).square().sum().backward()
        reference(x).square().sum().backward()
    for got, expected in zip(model.parameters(), reference.parameters()):
        torch.testing.assert_close(got.grad, expected.grad, **MODEL_TOL)
    kinds = {d.kind: d for d in dynamic_records()}
    assert kinds["forward"].padded and "contracts over it" in next(iter(kinds["backward"].exact.values()))


def test_symint_arguments_become_constants_per_bucket():
    def f(x, n):
        return x * n + torch.arange(n).sum()

    fn = compiled(f, dynamic=True)
    for rows, n in [(4, 2), (5, 3), (7, 3), (9, 6)]:
        x = torch.randn(rows, 3)
        torch.testing.assert_close(fn(x, n), f(x, n))
    (dynamic,) = dynamic_records()
    assert any("reduces over it" in why for why in dynamic.exact.values())  # n sizes the arange summed
    assert "L['x'].size()[0]" in dynamic.padded.values()


def test_a_size_used_as_a_number_is_read_at_its_real_value():
    """``x * x.shape[0]`` with the dim padded: the bucket's size must not leak in."""

    def f(x):
        return x * x.shape[0] + x.shape[0]

    fn = compiled(f, dynamic=True)
    for rows in (3, 5, 6, 7):
        x = torch.randn(rows, 3)
        torch.testing.assert_close(fn(x), f(x))
    assert all(d.padded and not d.exact for d in dynamic_records())
    assert any(r.bucket != r.sizes for r in report.current().recompiles)


def test_output_shapes_that_depend_on_symbols():
    def f(x):
        return (
            x.reshape(-1) * 2,
            torch.cat([x, x]) + 1,
            x.new_zeros(x.shape[0] * 2) + x.sum(),
            x[: x.shape[0] // 2] - 1,
            x.unsqueeze(0).expand(3, -1, -1) * 3,
        )

    fn = compiled(f)
    for rows in (4, 6, 9, 13):
        x = torch.randn(rows, 3)
        got, expected = fn(x), f(x)
        assert [t.shape for t in got] == [t.shape for t in expected]
        torch.testing.assert_close(got, expected)

    def g(x):  # padded along rows, output shapes still the real ones
        return (x * 2).view(x.shape[0], -1, 1), x.t().relu()

    fn = compiled(g, dynamic=True)
    for rows in (3, 5, 6):
        x = torch.randn(rows, 4)
        torch.testing.assert_close(fn(x), g(x))
    assert dynamic_records()[-1].padded


# --- buckets and the recompile budget -------------------------------------------


def _compiled_buckets() -> list[int]:
    return sorted(next(iter(r.bucket.values())) for r in report.current().recompiles)


@pytest.mark.parametrize(
    "options, expected",
    [
        ({"bucket_sizes": [16, 64]}, [16, 64]),
        ({"bucket_step": 8}, [8, 16, 24]),
        ({"bucket_max": 8, "bucket_min": 4}, [4, 8, 12, 20]),
    ],
)
def test_bucket_options(options, expected):
    fn = compiled(lambda x: x * 2 + 1, dynamic=True, **options)
    for rows in (3, 7, 12, 20):
        x = torch.randn(rows, 2)
        torch.testing.assert_close(fn(x), x * 2 + 1)
    assert _compiled_buckets() == expected


def _normalise_rows(x):
    return x.softmax(0) * 2  # softmax over the dynamic dim: exact sizes only


def test_recompile_budget_warns_names_the_dim_and_runs_eagerly():
    fn = compiled(_normalise_rows, recompile_budget=2)
    sizes = (4, 6, 10, 13, 20)
    with pytest.warns(RecompileBudgetWarning) as caught:
        for rows in sizes:
            x = torch.randn(rows, 3)
            torch.testing.assert_close(fn(x), _normalise_rows(x))
    (warning,) = caught
    message = str(warning.message)
    assert "L['x'].size()[0]" in message and "recompile_budget" in message
    assert "normalises over it" in message
    outcomes = [r.outcome for r in report.current().recompiles]
    assert outcomes == ["compiled", "compiled", "eager: recompile budget of 2 reached", "eager: recompile budget of 2 reached"]


def test_recompile_budget_strict_raises():
    fn = compiled(_normalise_rows, recompile_budget=1, strict=True)
    fn(torch.randn(4, 3))
    fn(torch.randn(6, 3))  # the symbolic graph, compiled for 6
    with pytest.raises(RecompileBudgetError, match="recompile_budget"):
        fn(torch.randn(7, 3))


def test_bucket_options_from_config_and_environment():
    config = Config.load({"bucket_sizes": "64, 16"}, environ={"TPU_INDUCTOR_RECOMPILE_BUDGET": "3"})
    assert config.bucket_sizes == (16, 64) and config.recompile_budget == 3
    assert Config.load({}, environ={}).recompile_budget == 8
    with pytest.raises(ConfigError, match="bucket_max"):
        Config.load({"bucket_min": 9, "bucket_max": 4}, environ={})
    with pytest.raises(ConfigError, match="recompile_budget"):
        Config.load({"recompile_budget": "many"}, environ={})
    assert BucketPolicy(sizes=(16, 64)).bucket(70) == 70  # past the largest: exact
    assert BucketPolicy().bucket(100, upper_bound=120) == 120


def test_an_executable_returning_other_shapes_than_promised_runs_its_island_eagerly(monkeypatch):
    """A wrong shape from the device never reaches the user, nor fails the call:
    the island's ATen graph runs instead, and the report says why. (torch-mlir's
    dynamic ceil_mode average pool returned one window fewer per dim; the support
    table now keeps it off the device, so it is let through here to check the net.)"""
    from tpu_inductor.placement import support

    monkeypatch.setattr(support, "_known_bad_lowering", lambda node, key: None)
    fn = lambda x: torch.nn.functional.avg_pool2d(x, 3, 2, ceil_mode=True) * 2  # noqa: E731
    compiled = torch.compile(fn, backend="tpu", options={"cache": False}, dynamic=True)
    for batch in (2, 3):
        x = torch.randn(batch, 4, 10, 10)
        torch.testing.assert_close(compiled(x), fn(x))
    assert any("graph promises" in f.reason for f in report.current().fallbacks())


def test_dynamic_ceil_mode_average_pool_runs_eagerly_with_its_reason():
    fn = lambda x: torch.nn.functional.avg_pool2d(x, 3, 2, ceil_mode=True) * 2  # noqa: E731
    compiled = torch.compile(fn, backend="tpu", options={"cache": False}, dynamic=True)
    for batch in (2, 3):
        x = torch.randn(batch, 4, 10, 10)
        torch.testing.assert_close(compiled(x), fn(x))
    assert [f.op for f in report.current().fallbacks()] == ["aten.avg_pool2d.default"]


# --- ops that address a padded dim from its end (passes/padded_positions.py) -------


def _assert_padded_and_equal(fn, make_inputs, sizes, padded="", **tolerance):
    """``fn`` compiled with every dim dynamic matches eager at each size, and
    the dims whose source names ``padded`` (every dim, when empty) are padded."""
    compiled_fn = compiled(fn, dynamic=True)
    for size in sizes:
        inputs = make_inputs(size)
        got, expected = compiled_fn(*inputs), fn(*inputs)
        torch.testing.assert_close(got, expected, **tolerance)
    records = dynamic_records()
    for d in records:
        if padded:
            assert padded in d.padded.values(), (d.padded, d.exact)
        else:
            assert d.padded and not d.exact, (d.padded, d.exact)
    assert any(r.bucket != r.sizes for r in report.current().recompiles)  # really padded
    assert all(d.eager_calls == 0 for d in records)


def test_a_cache_grown_by_cat_attends_at_its_real_length():
    """A decode step: the new key is written at the cache's real length, padded
    keys are hidden, and the grown cache comes back at its real size."""

    def step(q, cache_k, cache_v, k, v):
        keys, values = torch.cat([cache_k, k], -2), torch.cat([cache_v, v], -2)
        return F.scaled_dot_product_attention(q, keys, values), keys, values

    def inputs(length):
        return (torch.randn(1, 2, 1, 8), torch.randn(1, 2, length, 8), torch.randn(1, 2, length, 8),
                torch.randn(1, 2, 1, 8), torch.randn(1, 2, 1, 8))

    # (The head dim, contracted, stays exact.)
    _assert_padded_and_equal(step, inputs, (5, 6, 9, 13), padded="L['cache_k'].size()[2]", **MODEL_TOL)


def test_the_last_positions_are_read_at_the_real_end():
    def last(x):
        return x[:, -1:] * 2, x[:, -3:].sum(1), x[:, -1] + 1

    _assert_padded_and_equal(last, lambda n: (torch.randn(2, n, 4),), (5, 6, 11))


def test_a_count_from_a_size_starts_at_its_real_value():
    def positions(x):
        start = x.shape[0]
        return torch.arange(start, start + 3) * 1.5, x * 2

    _assert_padded_and_equal(positions, lambda n: (torch.ones(n),), (3, 5, 6))


def test_padded_rows_of_a_cache_write_never_land_at_a_wrong_position():
    """``cache.index_copy_(1, positions, rows)`` with the rows padded: a padded
    row (index 0 after zero padding) would overwrite position 0."""

    def write(cache, rows, offset):
        positions = torch.arange(rows.shape[0]) + offset
        counts = torch.ops.aten.index_put(cache, [None, positions], torch.ones(()), True)  # broadcast values
        return cache.index_copy(1, positions, rows.t()), cache.index_add(1, positions, rows.t()), counts

    def inputs(length):
        return torch.randn(3, 40), torch.randn(length, 3) + 5, torch.tensor(4)

    _assert_padded_and_equal(write, inputs, (5, 6, 11))


def test_a_whole_symbolic_dim_assigned_in_place_lowers():
    """``y[:] = x`` on a symbolic dim is ``slice_scatter`` to Python's open end,
    which made torch-mlir's symbolic lowering throw std::bad_alloc."""

    def assign(x):
        y = torch.zeros_like(x)
        y[:] = x * 2
        return y + 1

    fn = compiled(assign, dynamic=True)
    for rows in (3, 5, 6):
        x = torch.randn(rows, 4)
        torch.testing.assert_close(fn(x), assign(x))
    assert not report.current().fallbacks()


def test_related_sizes_are_raised_to_buckets_that_keep_their_guards():
    """A mask at least as long as a cache plus a window (s1 >= s0 + 8): the
    buckets 16 and 16 break it, so one of them is raised a step."""
    import sympy
    from types import SimpleNamespace

    from tpu_inductor.dynamic.buckets import choose_buckets

    s0, s1 = sympy.symbols("s0 s1", positive=True, integer=True)
    env = SimpleNamespace(guards=[SimpleNamespace(expr=sympy.Ge(s1, s0 + 8))], var_to_range={})
    chosen = choose_buckets({s0: 9, s1: 17}, frozenset({s0, s1}), {}, BucketPolicy(), env)
    assert chosen == {s0: 16, s1: 32}
    assert chosen[s1] >= chosen[s0] + 8


def test_assignment_up_to_a_symbolic_end_compiles():
    """``y[:n - 1] = x`` is ``slice_scatter`` with a symbolic end (an FX node):
    comparing it with Python's open end raised a TypeError in the rewrite."""

    def assign(x):
        y = torch.zeros_like(x)
        y[: x.shape[0] - 1] = x[1:] * 2
        return y + 1

    fn = compiled(assign, dynamic=True)
    for rows in (3, 5, 6):
        x = torch.randn(rows, 4)
        torch.testing.assert_close(fn(x), assign(x))


def test_a_size_specialised_mid_trace_lowers_with_one_type_per_dim():
    """Mistral's batch-2 prefill (#20): its length is specialised to 7 after
    the rotary tables were traced, so ``cos`` holds ``SymInt(7)`` and its
    ``unsqueeze`` the int 7. torch-mlir typed the first ``?`` and the second
    ``7`` and failed with an unresolved target materialization."""
    from tpu_inductor.lowering.refine import refine_to_static
    from tpu_inductor.lowering.symbolic import lower_symbolic

    def rotary(x, w):
        c = x.cos()
        torch._check(x.shape[1] == 7)
        return w * c.unsqueeze(1)

    gm = make_fx(rotary, tracing_mode="symbolic")(torch.randn(2, 7, 16), torch.randn(2, 3, 7, 16))
    sizes = {n.name: n.meta["val"].shape for n in gm.graph.nodes if n.op != "output"}
    assert isinstance(sizes["cos"][1], torch.SymInt) and type(sizes["unsqueeze"][2]) is int

    lowered = lower_symbolic(gm, isolate=False)

    assert "tensor<?x7x?xf32>" in lowered.text.splitlines()[1]  # the constant dim is static
    for batch in (2, 5):
        assert "?" not in refine_to_static(lowered.text, [(batch, 7, 16), (batch, 3, 7, 16)], {})
    # Only the import saw the ints: the graph's metadata is as traced.
    assert isinstance(gm.graph.find_nodes(op="placeholder")[0].meta["val"].shape[1], torch.SymInt)


def test_a_graph_whose_every_size_was_specialised_mid_trace_lowers_on_the_static_path():
    """Mistral's full-window decode step (#20): the cache length is a symbol
    until a guard pins it to 30, after the cache's ``cat`` was traced. The
    graph is then static, but the ``cat`` still holds ``SymInt(31)`` and its
    ``clone`` the int 31; torch-mlir typed them ``?`` and ``31`` and failed to
    legalize the clone, sending it to eager."""
    from tpu_inductor.runtime import DeviceExecutable, compile_stablehlo, get_platform
    from tpu_inductor.lowering.stablehlo import lower_to_stablehlo

    def grow(cache, new):
        for dim, size in ((0, 1), (1, 4), (3, 8)):  # only the length is a symbol at the cat
            torch._check(cache.shape[dim] == size and new.shape[dim] == size)
        full = torch.cat([cache, new], 2)
        torch._check(cache.shape[2] == 30)
        return (full.clone(memory_format=torch.contiguous_format) * 2,)

    cache, new = torch.randn(1, 4, 30, 8), torch.randn(1, 4, 1, 8)
    gm = make_fx(grow, tracing_mode="symbolic")(cache, new)
    cat = next(n for n in gm.graph.nodes if n.target is torch.ops.aten.cat.default)
    assert isinstance(cat.meta["val"].shape[2], torch.SymInt)

    lowered = lower_to_stablehlo(gm, isolate=False)
    platform = get_platform("cpu")
    loaded, _ = compile_stablehlo(lowered.module, platform, None, input_specs=lowered.input_specs)
    (result,) = DeviceExecutable(loaded, platform, lowered.output_specs, "grow", lowered.input_specs)(cache, new)
    torch.testing.assert_close(result, grow(cache, new)[0])
