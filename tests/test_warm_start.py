"""Warm start (issue 22): the traced level (PyTorch's AOTAutogradCache holding
our compiled graphs, tpu_inductor/aot_cache.py), symbolic graphs through the
graph level, PyTorch's portable cache bundle, and PyTorch's precompile.

Most cases run a "process" in this one: Dynamo reset, no executables in
memory, fresh report; AOTAutogradCache reads its directory on every lookup.
Precompile needs real processes. Gradients are compared with eager's at
float32 tolerances (the same ops on XLA:CPU and ATen, summed in other orders).
"""

from __future__ import annotations

import copy
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch
import torch.nn as nn

import tpu_inductor.report as report
from tpu_inductor import aot_cache, cli, versions
from tpu_inductor.process_state import STATE
from tpu_inductor.runtime import torch_cache
from tpu_inductor.runtime.disk_cache import MANIFEST, CacheDir

from new_process import fresh_process


class MLP(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.layers = nn.Sequential(nn.Linear(8, 16), nn.GELU(), nn.Linear(16, 4))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.layers(x)


def train_step(cache_dir: Path, batch: int = 8, dtype: torch.dtype = torch.float32, **options) -> report.Report:
    """One 'process': a training step whose gradients equal eager's."""
    fresh_process()
    torch.manual_seed(0)
    model = MLP().to(dtype)
    reference = copy.deepcopy(model)
    x = torch.randn(batch, 8, dtype=dtype)
    compiled = torch.compile(model, backend="tpu", options={"cache_dir": str(cache_dir), **options})
    compiled(x).square().sum().backward()
    reference(x).square().sum().backward()
    for got, expected in zip(model.parameters(), reference.parameters()):
        torch.testing.assert_close(got.grad, expected.grad, rtol=1e-4, atol=1e-5)
    return report.current()


def traced(record: report.Report) -> list[tuple[bool, str | None]]:
    return [(e.hit, e.reason) for e in record.cache_events if e.level == "traced"]


def sources(record: report.Report) -> list[tuple[str, str]]:
    return [(i.lower_source, i.compile_source) for i in record.islands()]


def test_a_training_step_reuses_its_traced_graphs(tmp_path):
    from torch._dynamo.utils import counters

    cold = train_step(tmp_path)
    assert traced(cold) == [(False, "no entry")]
    assert sources(cold) == [("torch-mlir", "xla")] * 2  # forward and backward, both on the device
    assert len(torch_cache.traced_entries()) == 1

    hits = counters["aot_autograd"]["autograd_cache_hit"]
    warm = train_step(tmp_path)
    assert counters["aot_autograd"]["autograd_cache_hit"] == hits + 1  # AOTAutograd did not trace
    assert traced(warm) == [(True, None)]
    assert sources(warm) == [("disk", "disk")] * 2
    assert all(i.executions == 1 for i in warm.islands())
    assert not warm.fallbacks()


@pytest.mark.parametrize(
    "change, reason",
    [
        ({"batch": 16}, "input shapes or dtypes changed"),
        ({"dtype": torch.float64}, "input shapes or dtypes changed"),
    ],
)
def test_a_changed_input_is_a_miss_with_its_reason(tmp_path, change, reason):
    train_step(tmp_path)
    record = train_step(tmp_path, **change)
    assert traced(record) == [(False, reason)]


def test_a_changed_version_is_a_miss_with_its_reason(tmp_path, monkeypatch):
    train_step(tmp_path)
    monkeypatch.setattr(versions, "_source_digest", lambda: "edited source")
    record = train_step(tmp_path)
    assert traced(record) == [(False, "version changed")]


def test_a_hit_rebuilds_what_the_lower_levels_lost(tmp_path):
    """The traced graphs are independent of the StableHLO and executables:
    with those gone, a hit lowers and compiles again, and is still right."""
    train_step(tmp_path / "first")
    record = train_step(tmp_path / "second")  # another cache_dir: our levels are empty
    assert traced(record) == [(True, None)]
    assert sources(record) == [("torch-mlir", "xla")] * 2


def test_options_are_read_by_the_process_that_hits(tmp_path):
    """No option changes what AOTAutograd traces, so the traced level hits
    across options; the levels below apply this process's options."""
    train_step(tmp_path)
    record = train_step(tmp_path, cache=False)
    assert traced(record) == []  # cache=False turns the traced level off too
    assert sources(record) == [("torch-mlir", "xla")] * 2


def test_small_inference_graphs_are_traced_again_and_large_ones_looked_up(tmp_path):
    def small(x):
        return x.sin() + 1

    def large(x):
        for _ in range(aot_cache.MIN_INFERENCE_NODES):
            x = x + 0.001
        return x

    x = torch.randn(4, 8)
    for fn, expected in ((small, []), (large, [(True, None)])):
        for _ in range(2):
            fresh_process()
            compiled = torch.compile(fn, backend="tpu", options={"cache_dir": str(tmp_path)})
            with torch.no_grad():
                # XLA may fold the constants of the adds: 500 roundings of at
                # most one float32 ulp (1.2e-7 near 1) each apart.
                torch.testing.assert_close(compiled(x), fn(x), rtol=0, atol=1e-4)
        assert traced(report.current()) == expected, fn.__name__


def test_a_symbolic_graph_uses_the_graph_level(tmp_path):
    def fn(x):
        return (x.sin() * 2).sum(-1)

    records = []
    for _ in range(2):
        fresh_process()
        compiled = torch.compile(fn, backend="tpu", dynamic=True, options={"cache_dir": str(tmp_path)})
        for rows in (5, 9):
            x = torch.randn(rows, 8)
            torch.testing.assert_close(compiled(x), fn(x))
        records.append(report.current())
    cold, warm = records
    assert [d.lowerings for d in cold.dynamic_graphs] == [1]
    assert [d.lowerings for d in warm.dynamic_graphs] == [0]  # the module with dynamic dims from disk
    assert any(e.level == "graph" and e.hit for e in warm.cache_events)
    assert {i.compile_source for i in warm.islands()} == {"disk"}


def test_the_portable_bundle_carries_our_entries(tmp_path, monkeypatch):
    """save_cache_artifacts() on one machine, load_cache_artifacts() on another:
    the second starts warm at every level."""
    from torch.compiler._cache import CacheArtifactManager

    CacheArtifactManager.clear()
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "torch-a"))
    train_step(tmp_path / "ours-a")
    blob, info = torch.compiler.save_cache_artifacts()
    assert len(info.tpu_inductor_artifacts) == 4  # StableHLO and executable, forward and backward
    assert len(info.aot_autograd_artifacts) == 1
    assert "traced_graphs.json" in info.tpu_inductor_learned_artifacts

    CacheArtifactManager.clear()
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "torch-b"))
    monkeypatch.setenv("TPU_INDUCTOR_CACHE_DIR", str(tmp_path / "ours-b"))
    torch.compiler.load_cache_artifacts(blob)
    fresh_process()
    torch.manual_seed(0)
    model = MLP()
    reference = copy.deepcopy(model)
    x = torch.randn(8, 8)
    torch.compile(model, backend="tpu")(x).square().sum().backward()  # cache_dir from the environment
    reference(x).square().sum().backward()
    for got, expected in zip(model.parameters(), reference.parameters()):
        torch.testing.assert_close(got.grad, expected.grad, rtol=1e-4, atol=1e-5)
    record = report.current()
    assert traced(record) == [(True, None)]
    assert sources(record) == [("disk", "disk")] * 2
    CacheArtifactManager.clear()


def test_an_imported_entry_that_fails_its_checksums_is_ignored(tmp_path, caplog):
    cache = CacheDir(tmp_path)
    name = "0" * 24 + "-" + "1" * 16
    manifest = {"key": name, "files": {"module.mlirbc": {"bytes": 3, "sha256": "0" * 64}}}
    files = {"module.mlirbc": b"abc", MANIFEST: json.dumps(manifest).encode()}
    assert not cache.import_entry("graphs", name, files)
    assert not (tmp_path / "graphs" / name).exists()
    assert "fails its checksums" in caplog.text


PRECOMPILE_CHILD = textwrap.dedent(
    """
    import json, sys
    import torch
    import tpu_inductor.report as report

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.GELU(), torch.nn.Linear(16, 4)).eval()
    x = torch.randn(4, 8)
    compiled = torch.compile(model, backend="tpu")
    with torch.no_grad():
        torch.testing.assert_close(compiled(x), model(x))
    torch.compiler.save_cache_artifacts()  # what writes precompile's Dynamo entries
    from torch._dynamo.utils import counters

    islands = [(i.lower_source, i.compile_source, i.executions) for i in report.current().islands()]
    print(json.dumps({"dynamo_cache": dict(counters["dynamo_cache"]), "islands": islands}))
    """
)


def test_pytorch_precompile_skips_dynamo_and_the_backend_rebuilds(tmp_path):
    env = {
        **os.environ,
        "TORCH_CACHING_PRECOMPILE": "1",
        "TORCHINDUCTOR_CACHE_DIR": str(tmp_path / "torch"),
        "TPU_INDUCTOR_CACHE_DIR": str(tmp_path / "ours"),
    }

    def run() -> dict:
        out = subprocess.run(
            [sys.executable, "-c", PRECOMPILE_CHILD], env=env, capture_output=True, text=True, timeout=300
        )
        assert out.returncode == 0, out.stderr[-3000:]
        return json.loads(out.stdout.strip().splitlines()[-1])

    cold = run()
    assert cold["dynamo_cache"] == {"dynamo_cache_miss": 1}
    warm = run()
    assert warm["dynamo_cache"] == {"dynamo_cache_hit": 1}  # Dynamo did not trace
    assert warm["islands"] == [["disk", "disk", 1]]  # and the graph ran on the device


def test_cache_info_and_clear_see_our_traced_graphs_only(tmp_path, capsys):
    train_step(tmp_path)
    theirs = torch_cache.torch_cache_dir() / "aotautograd" / "somekey" / "entry"
    theirs.parent.mkdir(parents=True)
    theirs.write_bytes(b"an Inductor entry")

    assert cli.main(["cache", "info", "--cache-dir", str(tmp_path), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["traced"] == 1
    assert cli.main(["cache", "clear", "--cache-dir", str(tmp_path)]) == 0
    assert "1 traced graph(s)" in capsys.readouterr().out
    assert torch_cache.traced_entries() == [] and theirs.exists()
    assert not (tmp_path / "traced_graphs.json").exists()


@pytest.mark.parametrize("configured", [True, False])
def test_torch_cache_dir_is_where_pytorch_keeps_its_caches(tmp_path, monkeypatch, configured):
    from torch._inductor.runtime.cache_dir_utils import cache_dir

    if configured:
        monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "somewhere"))
    else:
        monkeypatch.delenv("TORCHINDUCTOR_CACHE_DIR")
    expected = Path(cache_dir())
    monkeypatch.delenv("TORCHINDUCTOR_CACHE_DIR", raising=False)  # cache_dir() sets it
    if configured:
        monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "somewhere"))
    assert torch_cache.torch_cache_dir() == expected


def test_our_entries_are_found_by_the_module_name_they_pickle():
    assert torch_cache.TRACED_MARK == aot_cache.__name__.encode()


class Double(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        return x * 2

    @staticmethod
    def backward(ctx, grad):
        return grad * 2


def test_a_graph_pytorch_will_not_cache_says_why(tmp_path, capfd):
    def fn(x):
        return Double.apply(x).sin().sum()

    fresh_process()
    x = torch.randn(4, 8, requires_grad=True)
    torch.compile(fn, backend="tpu", options={"cache_dir": str(tmp_path)})(x).backward()
    expected = x.detach().clone().requires_grad_()
    fn(expected).backward()
    torch.testing.assert_close(x.grad, expected.grad)
    ((hit, reason),) = traced(report.current())
    assert not hit and reason.startswith("not cacheable: ") and "autograd" in reason.lower()
    assert "Bypassing" not in capfd.readouterr().err  # PyTorch's INFO line stays off the terminal


def test_a_symbolic_training_step_reuses_its_traced_graphs(tmp_path):
    """Dynamic dims survive the round trip: the stored graphs hold the same
    symbols, and each bucket's executables come from disk."""

    def step(batch: int) -> report.Report:
        fresh_process()
        torch.manual_seed(0)
        model = MLP()
        reference = copy.deepcopy(model)
        compiled = torch.compile(model, backend="tpu", dynamic=True, options={"cache_dir": str(tmp_path)})
        x = torch.randn(batch, 8)
        compiled(x).square().sum().backward()
        reference(x).square().sum().backward()
        for got, expected in zip(model.parameters(), reference.parameters()):
            torch.testing.assert_close(got.grad, expected.grad, rtol=1e-4, atol=1e-5)
        return report.current()

    cold = step(6)
    assert traced(cold) == [(False, "no entry")]
    warm = step(7)  # another size of the same symbolic graph
    assert traced(warm) == [(True, None)]
    assert [d.lowerings for d in warm.dynamic_graphs] == [0, 0]
    assert not warm.fallbacks()


def test_process_state_reset_is_a_new_process_for_what_it_compiled(tmp_path):
    def fn(x):
        return x.cos() * 3

    x = torch.randn(4, 8)
    compiled = torch.compile(fn, backend="tpu", options={"cache_dir": str(tmp_path)})
    torch.testing.assert_close(compiled(x), fn(x))
    assert STATE.executables and STATE.support_tables
    STATE.reset()
    assert not any(vars(STATE).values())
    torch._dynamo.reset()
    report.reset()
    torch.testing.assert_close(torch.compile(fn, backend="tpu", options={"cache_dir": str(tmp_path)})(x), fn(x))
    assert sources(report.current()) == [("disk", "disk")]  # not from memory: it was forgotten
