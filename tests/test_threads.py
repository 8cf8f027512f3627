"""One thread budget for PyTorch's kernels and XLA:CPU's (runtime/threads.py).

Speed is not asserted (timings are not tests); what is: where the release
of OpenMP's workers goes, that XLA's pool follows the configured size, and
that kernel timings are kept per thread count.
"""

from __future__ import annotations

import os

import pytest
import torch

import tpu_inductor.compiled_graph as compiled_graph
import tpu_inductor.report as report
import tpu_inductor.runtime.threads as threads
from tpu_inductor.config import Config
from tpu_inductor.placement.kernel_choice import KernelChooser
from tpu_inductor.process_state import STATE
from tpu_inductor.runtime import platform
from tpu_inductor.runtime.platform import get_platform


def _island_calls(monkeypatch):
    """Count the releases that happen while a compiled function runs."""
    released = []
    monkeypatch.setattr(threads, "release_eager_workers", lambda: released.append(1))
    return released


def test_an_island_after_eager_compute_releases_the_workers_first(monkeypatch):
    released = _island_calls(monkeypatch)
    monkeypatch.setattr(compiled_graph, "eager_workers_compete", lambda shares: shares)  # even on one core

    def f(a):
        return torch.special.i0(a.sin()).cos()  # island, eager i0, island

    a = torch.randn(threads.PARALLEL_GRAIN)  # enough for PyTorch to split i0 over its threads
    compiled = torch.compile(f, backend="tpu", options={"cache": False})
    torch.testing.assert_close(compiled(a), f(a))
    (graph,) = report.current().graphs
    assert len(graph.islands) == 2
    assert len(released) == 1  # before the second island only
    compiled(a)
    assert len(released) == 2


def test_eager_work_too_small_to_split_releases_nothing(monkeypatch):
    """PyTorch runs fewer than PARALLEL_GRAIN elements on the calling thread:
    no workers started, none to stop."""
    released = _island_calls(monkeypatch)
    monkeypatch.setattr(compiled_graph, "eager_workers_compete", lambda shares: shares)
    a = torch.randn(64)
    compiled = torch.compile(lambda a: torch.special.i0(a.sin()).cos(), backend="tpu", options={"cache": False})
    torch.testing.assert_close(compiled(a), torch.special.i0(a.sin()).cos())
    assert len(report.current().graphs[0].islands) == 2
    assert released == []


def test_a_kernel_on_the_calling_thread_releases_nothing_and_restores_the_count(monkeypatch, eager_convolutions):
    """A convolution chosen for the calling thread (kernel timings: 0.25 ms
    on every thread, 0.3 ms alone) starts no workers, so the island after it
    does not stop any; an exception inside still restores the thread count."""
    released = _island_calls(monkeypatch)
    monkeypatch.setattr(compiled_graph, "eager_workers_compete", lambda shares: shares)
    monkeypatch.setattr(KernelChooser, "_measure", lambda self, gm, node: (0.25e-3, 1e-3, 0.3e-3))
    convolution = torch.nn.Conv2d(8, 8, 3, padding=1).eval()

    def f(x):
        return convolution(x).tanh().sum(1)  # eager convolution, then an island

    x = torch.randn(2, 8, 64, 64)  # the convolution's output is large enough to split
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        with torch.no_grad():
            compiled = torch.compile(f, backend="tpu", options={"cache": False})
            torch.testing.assert_close(compiled(x), f(x))
        assert torch.get_num_threads() == 2
    finally:
        torch.set_num_threads(before)
    (graph,) = report.current().graphs
    assert ["on the calling thread" in k.reason for k in graph.eager_kernels] == [True]
    assert len(graph.islands) == 1
    assert released == []

    def fails():
        raise RuntimeError("inside")

    torch.set_num_threads(2)
    try:
        with pytest.raises(RuntimeError, match="inside"):
            threads.on_calling_thread(fails)()
        assert torch.get_num_threads() == 2
    finally:
        torch.set_num_threads(before)


def test_nothing_is_released_with_one_thread(monkeypatch):
    released = _island_calls(monkeypatch)
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        f = torch.compile(lambda a: torch.special.i0(a.sin()).cos(), backend="tpu", options={"cache": False})
        f(torch.randn(64))
    finally:
        torch.set_num_threads(before)
    assert released == []


def test_the_openmp_runtime_beside_torch_can_release_its_workers():
    """torch's CPU wheels ship libgomp, which has omp_pause_resource_all."""
    assert threads._omp_pause() is not None
    threads.release_eager_workers()
    torch.testing.assert_close(torch.ones(1 << 16).sum(), torch.tensor(float(1 << 16)))  # and work goes on


def test_xla_pool_follows_the_configured_size_else_torch(monkeypatch):
    """A new CPU client's pool: PJRT_NPROC when set, else PyTorch's count then;
    the variable is left as it was."""
    assert threads.xla_cpu_threads(3) == 3
    assert Config.load(environ={"PJRT_NPROC": "4"}).pjrt_nproc == 4
    monkeypatch.setenv("PJRT_NPROC", "3")
    assert platform._make_cpu_client()[1] == 3
    monkeypatch.delenv("PJRT_NPROC")
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        assert platform._make_cpu_client()[1] == 1
    finally:
        torch.set_num_threads(before)
    assert "PJRT_NPROC" not in os.environ
    assert get_platform("cpu").xla_threads >= 1  # the process's client says what it started with


def test_kernel_timings_are_kept_per_thread_count(monkeypatch, tmp_path):
    measured = []
    monkeypatch.setattr(KernelChooser, "_measure", lambda self, gm, node: (measured.append(node), (1e-3, 2e-3, 2e-3))[1])
    monkeypatch.setattr(STATE, "kernel_choosers", {})
    model = torch.nn.Conv2d(8, 8, 3, padding=1).eval()
    x = torch.randn(2, 8, 16, 16)
    before = torch.get_num_threads()
    try:
        for count in (1, 2, 1):
            torch._dynamo.reset()
            torch.set_num_threads(count)
            with torch.no_grad():
                torch.compile(model, backend="tpu", options={"cache_dir": str(tmp_path)})(x)
    finally:
        torch.set_num_threads(before)
    assert len(measured) == 2  # one timing per thread count; the third compile reuses the first's


def test_an_optimizer_step_run_in_place_releases_the_workers_after_it(monkeypatch):
    """The step runs on PyTorch's kernels; the next step's islands follow it."""
    released = _island_calls(monkeypatch)
    monkeypatch.setattr(compiled_graph, "eager_workers_compete", lambda shares: shares)  # even on one core
    torch.manual_seed(0)
    model = torch.nn.Linear(16, 4)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    step = torch.compile(optimizer.step, backend="tpu", options={"cache": False})
    for _ in range(3):
        model.zero_grad()
        model(torch.randn(8, 16)).square().mean().backward()
        step()
    in_place = [g for g in report.current().graphs if any(k.op == "in-place update graph" for k in g.eager_kernels)]
    assert in_place and len(released) == sum(g.executions for g in in_place)


def test_a_dynamic_graph_pads_its_inputs_on_the_calling_thread(monkeypatch):
    """Zero-extending an input to its bucket is a copy, no faster on more
    threads, and the workers it would start spin beside the island that
    follows (perf.py's dynamic MLP: 238-280 -> 153 ms a pass)."""
    counts = []
    set_num_threads = torch.set_num_threads
    monkeypatch.setattr(torch, "set_num_threads", lambda n: (counts.append(n), set_num_threads(n)))
    weight = torch.randn(256, 256)

    def f(x):
        return torch.relu(x @ weight)

    before = torch.get_num_threads()
    set_num_threads(2)
    try:
        compiled = torch.compile(f, backend="tpu", dynamic=True, options={"cache": False})
        for rows in (7, 100, 300):  # 100 and 300 rows are padded past PARALLEL_GRAIN elements
            x = torch.randn(rows, 256)
            counts.clear()
            # Sums of 256 products, blocked otherwise than eager's: a few ulps apart.
            torch.testing.assert_close(compiled(x), f(x), rtol=1e-4, atol=1e-4)
            assert counts[:2] == [1, 2] and torch.get_num_threads() == 2, (rows, counts)
    finally:
        set_num_threads(before)
    assert report.current().dynamic_graphs
