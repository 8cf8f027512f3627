"""Convolutions run on PyTorch's kernel where it measured faster (placement/kernel_choice.py).

Timings are injected (``KernelChooser._measure``) so each partition here is
decided, not measured: a test must not depend on this machine's speed. Values
are compared at torch.testing's float32 defaults: XLA's and oneDNN's
convolutions both accumulate in float32 over 3x3x8 products.
"""

from __future__ import annotations

import pytest
import torch

import tpu_inductor.report as report
from tpu_inductor.placement.kernel_choice import KernelChooser
from tpu_inductor.process_state import STATE

from new_process import fresh_process


class ConvBlock(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv = torch.nn.Conv2d(8, 8, 3, padding=1)
        self.norm = torch.nn.BatchNorm2d(8)

    def forward(self, x):
        return torch.relu(self.norm(self.conv(x))) + x


@pytest.fixture
def timings(monkeypatch):
    """Every conv signature 'measures' as given; counts the measurements."""
    measured = []
    result = {"eager_s": 1e-3, "xla_s": 2e-3, "one_thread_s": None}  # None: twice eager_s

    def measure(self, gm, node):
        measured.append(node)
        return result["eager_s"], result["xla_s"], result["one_thread_s"] or 2 * result["eager_s"]

    monkeypatch.setattr(KernelChooser, "_measure", measure)
    monkeypatch.setattr(STATE, "kernel_choosers", {})
    result["measured"] = measured
    return result


def _run(options, x):
    torch.manual_seed(0)
    model = ConvBlock().eval()
    compiled = torch.compile(model, backend="tpu", options=options)
    with torch.no_grad():
        return model(x), compiled(x)


def _run_on_two_threads(options, x):
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        return _run(options, x)
    finally:
        torch.set_num_threads(before)


def _graph():
    (graph,) = report.current().graphs
    return graph


def _measured_choices(graph):
    """Eager kernels chosen by timing (not the small pointwise islands next to them)."""
    return [k for k in graph.eager_kernels if "pointwise work between PyTorch kernels" not in k.reason]


@pytest.mark.parametrize("seconds_a_call, most_calls", [(0.0, 9), (0.1, 3), (0.3, 2)])
def test_a_slow_kernel_is_timed_fewer_times(seconds_a_call, most_calls):
    """A warm-up call and seven timed ones, unless that would take more than
    the budget (0.25 s): SAM 3's 1,008x1008 convolutions of 0.3-1.4 s a
    call spent 52 s of its first call being timed."""
    import time

    from tpu_inductor.placement import kernel_choice

    calls = []

    def kernel():
        calls.append(None)
        time.sleep(seconds_a_call)

    assert kernel_choice._median_seconds(kernel) >= seconds_a_call
    assert 2 <= len(calls) <= most_calls
    assert len(calls) == most_calls or seconds_a_call > 0


def test_a_kernel_faster_than_the_clock_is_timed_without_dividing_by_zero(monkeypatch):
    from tpu_inductor.placement import kernel_choice

    monkeypatch.setattr(kernel_choice.time, "perf_counter", lambda: 1.0)
    assert kernel_choice._median_seconds(lambda: None) == 0.0


@pytest.mark.parametrize("seconds, timings_taken", [(1e-3, 3), (10e-3, 2)])
def test_a_slow_kernel_is_not_timed_again_on_the_calling_thread(monkeypatch, tmp_path, seconds, timings_taken):
    """Every thread, the calling thread alone and XLA: three timings, but a
    kernel of 4 ms or more on every thread would have to run ten times faster
    on one to qualify for it, so that timing is skipped."""
    from tpu_inductor.placement import kernel_choice

    timed = []
    monkeypatch.setattr(kernel_choice, "_median_seconds", lambda call: timed.append(call) or seconds)
    monkeypatch.setattr(STATE, "kernel_choosers", {})
    _run_on_two_threads({"cache_dir": str(tmp_path)}, torch.randn(2, 8, 16, 16))
    assert len(timed) == timings_taken


def test_faster_eager_kernel_runs_the_conv(timings, tmp_path):
    x = torch.randn(2, 8, 16, 16)
    expected, actual = _run({"cache_dir": str(tmp_path)}, x)
    torch.testing.assert_close(actual, expected)
    graph = _graph()
    (conv,) = _measured_choices(graph)
    assert conv.op == "convolution_pointwise_channels_last"
    assert "faster" in conv.reason and "channels-last" in conv.reason
    assert graph.fallbacks == []  # a choice, not a fallback
    assert all("aten.convolution.default" not in i.ops for i in graph.islands)
    from tpu_inductor.reporting.html import render

    page = render(report.current())
    choices = page[page.index('id="eager-kernels"'):page.index('id="recompiles"')]
    assert "convolution_pointwise_channels_last" in choices


def test_a_kernel_that_every_thread_barely_speeds_up_runs_on_the_calling_thread(timings, tmp_path, monkeypatch):
    """0.1 ms saved on every thread by a 0.35 ms kernel is less than starting OpenMP's workers
    after an island costs (kernel_choice.WORKER_START_S): the kernel runs on
    the calling thread alone, and the thread count is back after it."""
    import functools

    from tpu_inductor.passes import conv_epilogue
    from tpu_inductor.torch_api import FakeTensor

    threads_inside = []
    real = conv_epilogue.convolution_pointwise_channels_last

    @functools.wraps(real)
    def counting(*args):
        if not isinstance(args[0], FakeTensor):
            threads_inside.append(torch.get_num_threads())
        return real(*args)

    monkeypatch.setattr(conv_epilogue, "convolution_pointwise_channels_last", counting)
    timings["eager_s"], timings["one_thread_s"] = 0.25e-3, 0.35e-3
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        expected, actual = _run({"cache_dir": str(tmp_path)}, torch.randn(2, 8, 16, 16))
        assert torch.get_num_threads() == 2
    finally:
        torch.set_num_threads(before)
    torch.testing.assert_close(actual, expected)
    (conv,) = _measured_choices(_graph())
    assert "0.350 ms on the calling thread" in conv.reason
    assert threads_inside == [1]


@pytest.mark.parametrize(
    "every_thread_s, one_thread_s",
    [
        (1e-3, 2e-3),  # 1 ms saved on every thread
        (1e-3, 1.05e-3),  # no faster on every thread, but too long to be: timed while a core was busy
    ],
)
def test_a_kernel_that_every_thread_speeds_up_runs_on_every_thread(timings, tmp_path, every_thread_s, one_thread_s):
    timings["eager_s"], timings["one_thread_s"] = every_thread_s, one_thread_s
    _run_on_two_threads({"cache_dir": str(tmp_path)}, torch.randn(2, 8, 16, 16))
    (conv,) = _measured_choices(_graph())
    assert "1.000 ms on 2 threads" in conv.reason


def test_slower_eager_kernel_leaves_the_conv_on_the_device(timings, tmp_path):
    timings["eager_s"] = 2.1e-3
    x = torch.randn(2, 8, 16, 16)
    expected, actual = _run({"cache_dir": str(tmp_path)}, x)
    torch.testing.assert_close(actual, expected)
    graph = _graph()
    assert graph.eager_kernels == []
    assert graph.islands[0].ops.get("aten.convolution.default") == 1


def test_a_near_tie_sends_a_conv_to_onednn_but_keeps_a_matmul_on_the_device(timings, tmp_path):
    """A convolution fuses its epilogue in eager too; a matmul's neighbours
    only fuse with it on the device."""
    timings["eager_s"] = 1.9e-3
    _run({"cache_dir": str(tmp_path)}, torch.randn(2, 8, 16, 16))
    assert [k.op for k in _measured_choices(_graph())] == ["convolution_pointwise_channels_last"]
    torch._dynamo.reset()
    report.reset()
    model, x = TwoLinears(torch.bfloat16).eval(), torch.randn(4, 32, dtype=torch.bfloat16)
    with torch.no_grad():
        torch.compile(model, backend="tpu", options={"cache_dir": str(tmp_path)})(x)
    assert _measured_choices(_graph()) == []


def test_small_saving_does_not_split_the_island(timings, tmp_path):
    timings["eager_s"], timings["xla_s"] = 10e-6, 40e-6  # 4x faster, but 30 us < two device calls
    x = torch.randn(2, 8, 16, 16)
    _run({"cache_dir": str(tmp_path)}, x)
    assert _graph().eager_kernels == []


def test_decision_is_kept_for_later_processes(timings, tmp_path):
    x = torch.randn(2, 8, 16, 16)
    _run({"cache_dir": str(tmp_path)}, x)
    assert len(timings["measured"]) == 1
    assert list(tmp_path.glob("kernel_timings-*.json"))
    # A new process: no chooser in memory, the timing comes from the file.
    STATE.kernel_choosers.clear()
    torch._dynamo.reset()
    report.reset()
    _run({"cache_dir": str(tmp_path)}, x)
    assert len(timings["measured"]) == 1
    assert [k.op for k in _measured_choices(_graph())] == ["convolution_pointwise_channels_last"]


def test_the_portable_bundle_carries_the_timings(timings, tmp_path, monkeypatch):
    """A cache shipped with torch.compiler.save_cache_artifacts() is warm for
    kernel choice too: the other machine does not measure again."""
    from torch.compiler._cache import CacheArtifactManager

    CacheArtifactManager.clear()
    x = torch.randn(2, 8, 16, 16)
    _run({"cache_dir": str(tmp_path / "a")}, x)
    assert len(timings["measured"]) == 1
    blob, info = torch.compiler.save_cache_artifacts()
    assert any(name.startswith("kernel_timings-") for name in info.tpu_inductor_learned_artifacts)
    CacheArtifactManager.clear()

    monkeypatch.setenv("TPU_INDUCTOR_CACHE_DIR", str(tmp_path / "b"))
    torch.compiler.load_cache_artifacts(blob)
    fresh_process()
    _run({}, x)
    assert len(timings["measured"]) == 1
    assert [k.op for k in _measured_choices(_graph())] == ["convolution_pointwise_channels_last"]
    CacheArtifactManager.clear()


def test_option_off_keeps_every_conv_on_the_device(timings):
    x = torch.randn(2, 8, 16, 16)
    expected, actual = _run({"cache": False, "eager_kernels": False}, x)
    torch.testing.assert_close(actual, expected)
    assert timings["measured"] == []
    assert _graph().islands[0].ops.get("aten.convolution.default") == 1


class TwoLinears(torch.nn.Module):
    def __init__(self, dtype: torch.dtype) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.fc1, self.fc2 = torch.nn.Linear(32, 32, dtype=dtype), torch.nn.Linear(32, 8, dtype=dtype)

    def forward(self, x):
        return self.fc2(torch.relu(self.fc1(x)))


@pytest.mark.parametrize("rows, relu_on_device", [(4, False), (16384, True)])
def test_half_precision_matmuls_are_candidates_and_read_their_weights_in_place(
    timings, tmp_path, rows, relu_on_device
):
    """bfloat16 linears 'measure' faster in eager: addmm runs there, reading
    ``t(weight)`` as a view (no island writes a transposed weight). The ReLU
    between them is a device call of its own: on 4x32 values it is cheaper in
    eager, on 16384x32 (past SMALL_ISLAND_WORK) it stays on the device.
    Exact: both paths run eager's addmm, and ReLU is exact."""
    model, x = TwoLinears(torch.bfloat16).eval(), torch.randn(rows, 32, dtype=torch.bfloat16)
    compiled = torch.compile(model, backend="tpu", options={"cache_dir": str(tmp_path)})
    with torch.no_grad():
        torch.testing.assert_close(compiled(x), model(x), rtol=0, atol=0)
    graph = _graph()
    ops = [k.op for k in _measured_choices(graph)]
    assert ops.count("aten.addmm.default") == 2 and ops.count("aten.permute.default") == 2, ops
    relu_islands = [sorted(i.ops) for i in graph.islands]
    assert relu_islands == ([["aten.relu.default"]] if relu_on_device else [])
    assert any(k.op == "aten.relu.default" for k in graph.eager_kernels) != relu_on_device


def test_float32_matmuls_are_not_timed(timings):
    """XLA's and MKL's float32 GEMMs measured even: no compile time spent timing them."""
    model, x = TwoLinears(torch.float32).eval(), torch.randn(4, 32)
    with torch.no_grad():
        torch.compile(model, backend="tpu", options={"cache": False})(x)
    assert timings["measured"] == []
    assert not _graph().eager_kernels


def test_only_the_cpu_client_considers_eager_kernels():
    class Device:
        shares_host_memory = False
        name = "tpu"
        device_kind = "TPU v5e"

    assert KernelChooser.for_platform(Device(), None) is None


def test_a_copying_client_leaves_the_sharing_one_its_chooser(monkeypatch):
    """``zero_copy=False`` has no chooser; compiled first in a process, it
    left the CPU client without one (no eager kernels, no in-place optimizer
    steps) for every later graph of the same cache directory."""
    from tpu_inductor.compiled_graph import _kernel_chooser
    from tpu_inductor.runtime.platform import get_platform

    monkeypatch.setattr(STATE, "kernel_choosers", {})
    assert _kernel_chooser(get_platform("cpu", zero_copy=False), None) is None
    assert _kernel_chooser(get_platform("cpu"), None) is not None


# --------------------------------------------------------------------------- in-place update graphs


def _sgd_setup(**options):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, 16), torch.nn.ReLU(), torch.nn.Linear(16, 4))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    step = torch.compile(optimizer.step, backend="tpu", options={"cache": False, **options})
    return model, optimizer, step


def _train(model, step, steps=3):
    x, y = torch.randn(8, 16, generator=torch.Generator().manual_seed(1)), torch.randn(8, 4)
    for _ in range(steps):
        model.zero_grad()
        torch.nn.functional.mse_loss(model(x), y).backward()
        step()
    return [p.detach().clone() for p in model.parameters()]


def test_optimizer_step_updates_parameters_in_place():
    eager_model, eager_optimizer, _ = _sgd_setup()
    torch.manual_seed(2)
    expected = _train(eager_model, eager_optimizer.step)
    model, _, step = _sgd_setup()
    pointers = [p.data_ptr() for p in model.parameters()]
    torch.manual_seed(2)
    actual = _train(model, step)
    for a, e in zip(actual, expected):
        # Eager's own kernels, but the first step (it creates the momentum
        # buffers) runs on XLA, which may contract a * b + c into one fused
        # multiply-add: a float32 ulp (torch 2.11's graph of that step).
        torch.testing.assert_close(a, e, rtol=1.2e-7, atol=3e-8)
    assert [p.data_ptr() for p in model.parameters()] == pointers
    graphs = report.current().graphs
    choices = [k for g in graphs for k in g.eager_kernels]
    assert choices and all(k.op == "in-place update graph" for k in choices)
    assert "in place" in choices[0].reason
    # The first step's graph creates the momentum buffers (clone): lowered as usual.
    assert not any(g.fallbacks for g in graphs)


def test_optimizer_step_lowers_with_eager_kernels_off():
    model, _, step = _sgd_setup(eager_kernels=False)
    _train(model, step, steps=1)
    graphs = report.current().graphs
    assert not any(g.eager_kernels for g in graphs)
    assert any(g.islands for g in graphs)


def test_graph_with_a_matmul_is_not_an_update_graph():
    weight = torch.randn(8, 8)

    def update(state, x):
        state.add_(x @ weight)  # in place, but a matmul: worth the device

    state = torch.zeros(4, 8)
    x = torch.randn(4, 8)
    torch.compile(update, backend="tpu", options={"cache": False})(state, x)
    torch.testing.assert_close(state, x @ weight)
    graphs = report.current().graphs
    assert not any(g.eager_kernels for g in graphs)
    assert any(g.islands for g in graphs)


@pytest.mark.parametrize("eager_kernels", [True, False])
def test_adamw_step_in_place_or_fully_lowered(eager_kernels):
    """Dynamo's lerp_ polyfill emits prims.fma: the step is an in-place update
    graph, and with eager_kernels off it lowers (fma as a * b + c) instead of
    falling back. Tolerance: fma vs multiply-then-add differ by 1 ulp per step."""

    def setup():
        torch.manual_seed(0)
        model = torch.nn.Linear(16, 8)
        return model, torch.optim.AdamW(model.parameters(), lr=1e-2)

    x = torch.randn(4, 16, generator=torch.Generator().manual_seed(1))

    def train(model, step):
        for _ in range(3):
            model.zero_grad()
            model(x).square().sum().backward()
            step()
        return [p.detach().clone() for p in model.parameters()]

    eager_model, eager_optimizer = setup()
    expected = train(eager_model, eager_optimizer.step)
    model, optimizer = setup()
    options = {"cache": False, "eager_kernels": eager_kernels}
    actual = train(model, torch.compile(optimizer.step, backend="tpu", options=options))
    for a, e in zip(actual, expected):
        torch.testing.assert_close(a, e, rtol=1e-6, atol=1e-6)
    graphs = report.current().graphs
    assert not any(g.fallbacks for g in graphs)
    in_place = any(k.op == "in-place update graph" for g in graphs for k in g.eager_kernels)
    assert in_place == eager_kernels
