"""Eager fallback: ops that do not lower run in PyTorch between device islands.

Results are compared with eager at torch.testing's float32 defaults: the
lowered parts are elementwise and the eager parts are eager itself.
"""

from __future__ import annotations

import json

import pytest
import torch

import tpu_inductor.report as report
from tpu_inductor.errors import UnsupportedOpError

OPTIONS = {"cache": False}


def compiled(fn, **options):
    return torch.compile(fn, backend="tpu", options={**OPTIONS, **options})


def fallback_ops(kind: str | None = None) -> list[str]:
    return [f.op for g in report.current().graphs if kind in (None, g.kind) for f in g.fallbacks]


def one_fallback(a):
    b = torch.special.i0(a.sin() * 2)  # i0: torch-mlir has no StableHLO lowering
    return (b.cos() + a).sum(0)


def two_fallbacks(a):
    b = torch.special.i0(a.sin())
    c = torch.nn.functional.gelu(b) * a
    return torch.special.i0(c.tanh()).log1p() + c


def many_fallbacks(a):
    b = a.sin()
    c = torch.special.i0(b) * 2
    d = torch.special.i0(c.cos()) + b
    e = torch.fft.rfft(d).abs()  # the FFT runs eagerly; abs of its complex result on the device
    return e.exp().sum() + a.sum()


@pytest.mark.parametrize(
    "fn, expected_fallbacks",
    [
        (one_fallback, ["aten.i0.default"]),
        (two_fallbacks, ["aten.i0.default"] * 2),
        (many_fallbacks, ["aten.i0.default"] * 2 + ["aten._fft_r2c.default"]),
    ],
)
def test_forward_matches_eager_with_at_most_k_plus_1_islands(fn, expected_fallbacks):
    a = torch.randn(4, 8)
    torch.testing.assert_close(compiled(fn)(a), fn(a))
    assert sorted(fallback_ops()) == sorted(expected_fallbacks)
    (graph,) = report.current().graphs
    assert 1 <= len(graph.islands) <= len(expected_fallbacks) + 1


@pytest.mark.parametrize("fn", [one_fallback, two_fallbacks])
def test_backward_with_fallbacks_matches_eager_gradients(fn):
    a = torch.randn(4, 8, requires_grad=True)
    b = a.detach().clone().requires_grad_(True)
    compiled(fn)(a).sum().backward()
    fn(b).sum().backward()
    torch.testing.assert_close(a.grad, b.grad)
    assert "aten.i0.default" in fallback_ops("forward")
    # d/dx i0 = i1, which has no lowering either: the backward graph falls back too.
    assert fallback_ops("backward")


def test_independent_lowerable_nodes_share_an_island():
    def f(a):
        left = a.sin() * 2
        middle = torch.special.i0(a)
        right = a.cos() + 1
        return left + right, middle.exp()

    a = torch.randn(8)
    torch.testing.assert_close(compiled(f)(a), f(a))
    # i0 depends only on the input, so it runs first and everything else,
    # before and after it in program order, forms one island.
    (graph,) = report.current().graphs
    assert len(graph.islands) == 1


def test_a_weight_view_runs_in_the_island_that_reads_it():
    """``t(w)`` depends on nothing computed, but its matmul runs after an eager
    op: the view goes with the matmul (where XLA folds it into the dot), not
    into the first island (which would write the transposed weight out on
    every call)."""

    def f(a, w):
        return torch.special.i0(a.sin()).mm(w.t())  # sin: an island ahead of the eager op

    a, w = torch.randn(4, 8), torch.randn(16, 8)
    torch.testing.assert_close(compiled(f)(a, w), f(a, w))
    (graph,) = report.current().graphs
    (with_matmul,) = [i for i in graph.islands if "aten.mm.default" in i.ops]
    assert any(op in with_matmul.ops for op in ("aten.t.default", "aten.permute.default"))
    assert all("aten.t.default" not in i.ops and "aten.permute.default" not in i.ops for i in graph.islands if i is not with_matmul)


def test_parameter_only_work_runs_in_the_island_that_reads_it():
    """BatchNorm-style scale arithmetic on inputs alone, read after an eager
    op: it joins the reading island (where XLA fuses it into its use)
    instead of being written out by a first island on every call."""

    def f(a, w, var):
        scale = w * torch.rsqrt(var + 1e-5)
        return torch.special.i0(a.sin()) * scale

    a, w, var = torch.randn(4, 8), torch.randn(8), torch.rand(8) + 0.5
    torch.testing.assert_close(compiled(f)(a, w, var), f(a, w, var))
    (graph,) = report.current().graphs
    (with_scale,) = [i for i in graph.islands if "aten.rsqrt.default" in i.ops]
    assert "aten.mul.Tensor" in with_scale.ops and "aten.sin.default" not in with_scale.ops


def test_fallback_record_names_op_reason_and_source_line():
    a = torch.randn(4, 8)
    compiled(one_fallback)(a)
    (record,) = report.current().fallbacks()
    assert record.op == "aten.i0.default"
    assert "no StableHLO lowering" in record.reason
    line = one_fallback.__code__.co_firstlineno + 1
    assert record.source.endswith(f"test_fallback.py:{line}")


def test_strict_option_raises_naming_op_reason_and_line():
    with pytest.raises(Exception) as info:
        compiled(one_fallback, strict=True)(torch.randn(4, 8))
    message = str(info.value)
    assert "UnsupportedOpError" in message or isinstance(info.value, UnsupportedOpError)
    assert "aten.i0.default" in message and "no StableHLO lowering" in message
    assert f"test_fallback.py:{one_fallback.__code__.co_firstlineno + 1}" in message


def test_strict_environment_variable(monkeypatch):
    monkeypatch.setenv("TPU_INDUCTOR_STRICT", "1")
    with pytest.raises(Exception, match="aten.i0.default"):
        compiled(one_fallback)(torch.randn(4, 8))


def test_failed_lowering_is_learned_and_remembered(tmp_path):
    """An op torch-mlir rejects (not in the static table) is found, then remembered."""

    def shifts(a):
        return torch.ops.aten.__lshift__.Scalar(a, 2) + a.sum()

    a = torch.arange(-3, 4)
    from tpu_inductor.decompositions import table as decompositions

    # Without our decomposition, torch-mlir fails on the Scalar shift overload.
    table = decompositions._OURS
    saved = table.pop(torch.ops.aten.__lshift__.Scalar)
    decompositions._table.cache_clear()
    try:
        options = {"cache": True, "cache_dir": str(tmp_path)}
        torch.testing.assert_close(compiled(shifts, **options)(a), shifts(a))
        first = report.current().graphs[-1]
        assert first.lowering_retries >= 1
        assert fallback_ops() == ["aten.__lshift__.Scalar"]
        (learned_file,) = tmp_path.glob("learned_unsupported-*.json")
        assert "aten.__lshift__(int64[1]; other=2)" in json.loads(learned_file.read_text())

        torch._dynamo.reset()
        torch.testing.assert_close(compiled(shifts, **options)(a + 1), shifts(a + 1))
        assert report.current().graphs[-1].lowering_retries == 0
    finally:
        table[torch.ops.aten.__lshift__.Scalar] = saved
        decompositions._table.cache_clear()


def test_out_of_memory_is_learned_for_this_process_only(tmp_path):
    """A lowering that ran out of memory says nothing about its ops: after one
    std::bad_alloc every probe failed (mm and add included); persisting that
    would keep them off the device in every later process."""
    from tpu_inductor.placement.support import SupportTable

    path = tmp_path / "learned.json"
    table = SupportTable(path)
    table.learn("aten.mm(float32[2],float32[2])", "torch-mlir: std::bad_alloc")
    table.learn("aten.i0(float32[1])", "torch-mlir: no lowering")
    assert json.loads(path.read_text()) == {"aten.i0(float32[1])": {"reason": "torch-mlir: no lowering", "confirmed": False}}
    later = SupportTable(path)
    assert "aten.mm(float32[2],float32[2])" not in later.learned()
    assert table.learned()["aten.mm(float32[2],float32[2])"]["reason"] == "torch-mlir: std::bad_alloc"


@torch._dynamo.config.patch(capture_dynamic_output_shape_ops=True)
def test_data_dependent_shapes_run_eagerly_and_teach_nothing():
    def f(a):
        positive = a[a > 0]  # boolean-mask indexing: shape depends on the data
        return (positive.sin() * 2).sum() + a.cos().sum()

    a = torch.randn(16)
    torch.testing.assert_close(compiled(f)(a), f(a))
    (graph,) = report.current().graphs
    assert graph.lowering_retries == 0  # decided up front, not by a failed compile
    assert "aten.index.Tensor" in fallback_ops()
    # Shape bookkeeping (sym_size, asserts) is not reported as fallback.
    assert all(op.startswith("aten.") and "sym_size" not in op for op in fallback_ops())
    assert len(graph.islands) <= 2


def test_scalar_only_arithmetic_is_not_worth_a_device_call():
    def f(a):
        total = torch.special.i0(a.sum())  # eager, 0-d
        return total * 2 + 1  # 0-d arithmetic: stays eager

    a = torch.randn(16)
    torch.testing.assert_close(compiled(f)(a), f(a))
    (graph,) = report.current().graphs
    (island,) = graph.islands  # only the sum over the vector
    assert island.num_nodes == 1


def test_island_whose_inputs_contradict_metadata_runs_its_aten_graph():
    """_batch_norm_with_update's eager kernel returns bf16 running stats where its
    fake kernel promises float32; the island after it must not be fed a
    mismatched buffer (XLA would reject it) but still produce eager's result."""

    def f(x, weight, bias, mean, var):
        out, *_ = torch.ops.aten._batch_norm_with_update(x, weight, bias, mean, var, 0.5, 0.6)
        return out * 2, mean + 1

    args = [torch.randn(5, 5, 5).bfloat16()] + [torch.rand(5).bfloat16() + 0.5 for _ in range(4)]
    expected = f(*[a.clone() for a in args])
    got = compiled(f)(*[a.clone() for a in args])
    torch.testing.assert_close(got, expected)
    reasons = [f.reason for f in report.current().fallbacks()]
    assert any("metadata promised otherwise" in r for r in reasons), reasons


@pytest.mark.parametrize(
    "fn, shapes",
    [
        # OpInfo's third conv_transpose samples: torch-mlir infers a shape that
        # disagrees with the op's own (21x23 for 20x24) while kernel choice times it.
        (lambda x, w: torch.nn.functional.conv_transpose2d(x, w, stride=(3, 4), output_padding=(2, 3), groups=2, dilation=4), [(2, 4, 4, 4), (4, 2, 3, 3)]),
        (lambda x, w: torch.nn.functional.conv_transpose3d(x, w, stride=(3, 4, 2), output_padding=(2, 3, 1), groups=2, dilation=4), [(2, 4, 3, 3, 3), (4, 2, 3, 3, 3)]),
    ],
)
def test_a_lowering_failure_while_choosing_kernels_does_not_fail_the_call(fn, shapes):
    inputs = [torch.randn(s) for s in shapes]
    torch.testing.assert_close(compiled(fn)(*inputs), fn(*inputs))


@pytest.mark.backend_failure_expected
def test_a_backend_failure_runs_the_graph_eagerly_and_says_so(monkeypatch):
    """The last line of defence: whatever escapes the retry loop costs the graph
    its device, never the user's call; the report names the error."""
    import tpu_inductor.compiled_graph as compiled_graph

    def broken(*args, **kwargs):
        raise ValueError("a pass broke")

    monkeypatch.setattr(compiled_graph, "build_compiled_graph", broken)
    a = torch.randn(4, 8)
    torch.testing.assert_close(compiled(lambda x: x.sin() + 1)(a), a.sin() + 1)
    (record,) = report.current().fallbacks()
    assert record.op == "whole graph" and "ValueError: a pass broke" in record.reason
    with pytest.raises(Exception, match="a pass broke"):
        torch._dynamo.reset()
        compiled(lambda x: x.cos() + 1, strict=True)(a)


def test_an_eager_view_reads_a_tensor_laid_out_otherwise_than_traced():
    """A view left to eager runs on whatever layout arrives: here its input is
    traced contiguous but arrives transposed (as an eager kernel's
    channels-last result or an island's dense one can differ from the trace).
    ``view`` would raise in the user's call; the fused graph reshapes."""
    from tpu_inductor.passes.eager_views_as_reshape import eager_views_as_reshape

    gm = torch.fx.experimental.proxy_tensor.make_fx(lambda a: a.view(-1))(torch.randn(3, 4))
    transposed = torch.randn(4, 3).t()
    with pytest.raises(RuntimeError, match="view size is not compatible"):
        gm(transposed)
    torch.testing.assert_close(eager_views_as_reshape(gm)(transposed), transposed.reshape(-1))


def test_random_ops_left_to_eager_use_torchs_generator():
    """PyTorch tags random ops ``nondeterministic_seeded``; torch-mlir lowered
    ``rrelu_with_noise`` with its own generator (torch-mlir's e2e
    ``ElementwiseRreluWithNoiseTrainModule``: another mean and std than eager's
    under the same seed). Those that stay eager (``fallback_random``) draw,
    seeded alike, eager's numbers."""

    def f(x, noise):
        out, out_noise = torch.ops.aten.rrelu_with_noise_functional(x, noise, 0.2, 0.5, True)
        return out.mean(), out.std(), out_noise.mean()

    x, noise = torch.rand(64, 64) * 2 - 1, torch.rand(64, 64)
    torch.manual_seed(0)
    expected = f(x, noise)
    torch.manual_seed(0)
    torch.testing.assert_close(compiled(f, fallback_random=True)(x, noise), expected)
    assert fallback_ops() == ["aten.rrelu_with_noise_functional.default"]


def test_a_fallback_inside_a_torch_module_names_the_module():
    """Compiled directly, a torch.nn module leaves Dynamo no stack trace of
    user code: the report names the submodule instead of '?'."""
    model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.Dropout(0.5)).train()
    torch.compile(model, backend="tpu", options={**OPTIONS, "fallback_random": True})(torch.randn(2, 8))
    (record,) = report.current().fallbacks()
    assert record.op == "aten.native_dropout.default"
    assert record.source == "module 1 (Dropout)"
