"""The compiled-artifact cache directory (issue 5).

Every case ends the same way: the compiled result equals eager, and a next run
uses the cache (hits from disk). Most cases run in this process, with Dynamo
and the in-memory executable cache reset between runs so each run reads the
directory like a new process would; races and kill -9 need real processes.
No case depends on timing: races are forced with a file barrier, kills happen
at a chosen write.
"""

from __future__ import annotations

import errno
import hashlib
import json
import logging
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

import tpu_inductor
import tpu_inductor.report as report
from tpu_inductor import cli, versions
from tpu_inductor.config import Config
from tpu_inductor.process_state import STATE
from tpu_inductor.runtime import disk_cache
from tpu_inductor.runtime.disk_cache import CacheDir


# Keys include a digest of the lowering/runtime source, so that edits never reuse
# stale artifacts. Pin it here and in the child processes: a colleague saving a
# file mid-run must not turn this file's warm runs cold.
SOURCE_DIGEST = "pinned-for-tests"


@pytest.fixture(autouse=True)
def pinned_source_digest(monkeypatch):
    monkeypatch.setattr(versions, "_source_digest", lambda: SOURCE_DIGEST)


def graph(x):
    return (x.sin() * 2 + x.cos()).sum(-1)


def run(cache_dir, rows: int = 4, fn=graph, **options) -> report.Report:
    """One 'process': fresh Dynamo, no executables in memory, compiled == eager."""
    torch._dynamo.reset()
    STATE.executables.clear()
    report.reset()
    torch.manual_seed(rows)
    x = torch.randn(rows, 8)
    compiled = torch.compile(fn, backend="tpu", options={"cache_dir": str(cache_dir), **options})
    torch.testing.assert_close(compiled(x), fn(x))
    return report.current()


def sources(record: report.Report) -> list[tuple[str, str]]:
    return [(i.lower_source, i.compile_source) for i in record.islands()]


def entries(cache_dir, kind: str) -> list[Path]:
    return sorted(p for p in (Path(cache_dir) / kind).iterdir() if not p.name.startswith("."))


def assert_warm(cache_dir, rows: int = 4, **options) -> None:
    record = run(cache_dir, rows, **options)
    assert sources(record) == [("disk", "disk")]
    assert record.cache_misses() == {}


def warnings(caplog) -> list[str]:
    return [
        r.getMessage()
        for r in caplog.records
        if r.levelno >= logging.WARNING and r.name.startswith("tpu_inductor")
    ]


def test_warm_run_skips_lowering_and_compiling(tmp_path):
    cold = run(tmp_path)
    assert sources(cold) == [("torch-mlir", "xla")]
    assert cold.cache_misses() == {"no entry": 2} and cold.cache_hits() == 0

    (graph_entry,) = entries(tmp_path, "graphs")
    (exe_entry,) = entries(tmp_path, "executables")
    assert {p.name for p in graph_entry.iterdir()} == {"module.mlirbc", "manifest.json"}
    assert {p.name for p in exe_entry.iterdir()} == {"module.mlirbc", "executable.bin", "manifest.json"}
    module = (exe_entry / "module.mlirbc").read_bytes()
    assert module.startswith(b"ML\xefR")  # MLIR bytecode
    assert module == (graph_entry / "module.mlirbc").read_bytes()

    manifest = json.loads((exe_entry / "manifest.json").read_text())
    parts = manifest["key_parts"]
    assert parts["identity"] == {
        "stablehlo_sha256": hashlib.sha256(module).hexdigest(),
        "input_avals": ["float32[4,8]"],
    }
    assert parts["platform"]["platform"] == "cpu" and parts["platform"]["device_kind"]
    assert set(parts["options"]) == {"compile_options_sha256", "xla_flags", "ynn_reductions"}
    assert {"torch", "torch-mlir", "jaxlib", "libtpu", "tpu_inductor"} <= set(parts["versions"])
    assert parts["versions"]["tpu_inductor source"] == SOURCE_DIGEST
    assert manifest["files"]["executable.bin"]["bytes"] == (exe_entry / "executable.bin").stat().st_size
    assert manifest["saves_seconds"] > 0 and manifest["hits"] == 0
    assert manifest["created"] == manifest["last_used"]

    warm = run(tmp_path)
    assert sources(warm) == [("disk", "disk")]
    assert warm.cache_hits() == 2 and warm.cache_misses() == {}
    manifest = json.loads((exe_entry / "manifest.json").read_text())
    assert manifest["hits"] == 1 and manifest["last_used"] > manifest["created"]


def test_default_location_and_off_switch(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    monkeypatch.delenv("TPU_INDUCTOR_CACHE_DIR", raising=False)
    torch._dynamo.reset()
    STATE.executables.clear()
    x = torch.randn(3, 8)
    torch.testing.assert_close(torch.compile(graph, backend="tpu")(x), graph(x))
    assert len(entries(tmp_path / "xdg" / "tpu_inductor", "executables")) == 1

    record = run(tmp_path / "off", cache=False)
    assert not (tmp_path / "off").exists() and record.cache_events == []


def test_different_constants_never_share_an_entry(tmp_path):
    def scaled(k):
        return lambda x: (x * k + torch.tensor([k] * 8)).exp()

    for k in (2.0, 3.0, 2.0, 3.0):
        run(tmp_path, fn=scaled(k))
    assert len(entries(tmp_path, "graphs")) == 2


def test_xla_flags_are_part_of_the_key(tmp_path, monkeypatch):
    run(tmp_path)
    monkeypatch.setenv("XLA_FLAGS", "--xla_cpu_enable_fast_math=false")
    assert Config.load({}).xla_flags == "--xla_cpu_enable_fast_math=false"
    changed = run(tmp_path)
    # The ATen graph -> StableHLO level does not depend on XLA flags; the executable does.
    assert sources(changed) == [("disk", "xla")]
    assert changed.cache_misses() == {"options changed": 1}
    assert_warm(tmp_path)


def test_the_xla_thread_count_is_part_of_the_executable_key(tmp_path):
    """XLA:CPU compiles its loop splits for the pool size, so an executable
    made for another thread count is a miss that says the platform changed."""
    import dataclasses

    from tpu_inductor.runtime.disk_cache import CacheDir
    from tpu_inductor.runtime.executable import executable_key
    from tpu_inductor.runtime.platform import get_platform

    platform = get_platform("cpu")
    other = dataclasses.replace(platform, xla_threads=(platform.xla_threads or 1) + 1)
    cache = CacheDir(tmp_path)
    cache.store("executables", executable_key(b"module", [], platform), {"executable.bin": b"x"}, 1.0)
    assert cache.load("executables", executable_key(b"module", [], platform), lambda files: files).hit
    lookup = cache.load("executables", executable_key(b"module", [], other), lambda files: files)
    assert not lookup.hit and lookup.reason == "platform changed"


def test_float32_precision_is_part_of_the_executable_key(tmp_path):
    """On a plugin the precision torch asks for is written on the module at
    compile time only: a changed setting is a miss that says the options changed."""
    from tpu_inductor.runtime.disk_cache import CacheDir
    from tpu_inductor.runtime.executable import executable_key
    from tpu_inductor.runtime.platform import get_platform

    platform = get_platform("cpu")
    highest = {"stablehlo.dot_general": "HIGHEST"}
    cache = CacheDir(tmp_path)
    cache.store("executables", executable_key(b"module", [], platform, precisions=highest), {"executable.bin": b"x"}, 1.0)
    assert cache.load("executables", executable_key(b"module", [], platform, precisions=highest), lambda f: f).hit
    lookup = cache.load("executables", executable_key(b"module", [], platform, precisions={
        "stablehlo.dot_general": "HIGH"}), lambda files: files)
    assert not lookup.hit and lookup.reason == "options changed"


def test_version_change(tmp_path, monkeypatch, caplog):
    run(tmp_path)
    newer = {**versions.component_versions(), "torch-mlir": "29990101"}
    monkeypatch.setattr(versions, "component_versions", lambda: newer)
    upgraded = run(tmp_path)
    assert sources(upgraded) == [("torch-mlir", "xla")]
    assert upgraded.cache_misses() == {"version changed": 2}
    assert_warm(tmp_path)

    # An entry whose manifest names other versions than its key is not trusted.
    exe_entry = next(
        p for p in entries(tmp_path, "executables")
        if json.loads((p / "manifest.json").read_text())["key_parts"]["versions"]["torch-mlir"]
        == "29990101"
    )
    manifest = json.loads((exe_entry / "manifest.json").read_text())
    manifest["key_parts"]["versions"]["jaxlib"] = "0.0.1"
    (exe_entry / "manifest.json").write_text(json.dumps(manifest))
    mismatched = run(tmp_path)
    assert sources(mismatched) == [("disk", "xla")]
    assert mismatched.cache_misses() == {"version changed": 1}
    assert len(warnings(caplog)) == 1 and "evicting" in warnings(caplog)[0]
    assert_warm(tmp_path)


def _flip_middle_byte(path: Path) -> None:
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0xFF
    path.write_bytes(bytes(data))


DAMAGE = {
    "flip": _flip_middle_byte,
    "truncate": lambda p: p.write_bytes(p.read_bytes()[: p.stat().st_size // 2]),
    "empty": lambda p: p.write_bytes(b""),
    "garbage": lambda p: p.write_bytes(b"{not json"),
    "delete": lambda p: p.unlink(),
}


@pytest.mark.parametrize(
    "kind, name, damage",
    [
        ("executables", "executable.bin", "flip"),  # corrupted
        ("executables", "executable.bin", "truncate"),  # truncated
        ("executables", "module.mlirbc", "empty"),
        ("executables", "manifest.json", "garbage"),
        ("executables", "executable.bin", "delete"),
        ("graphs", "module.mlirbc", "flip"),
        ("graphs", "manifest.json", "truncate"),
    ],
)
def test_damaged_entry_is_evicted_and_recompiled(tmp_path, caplog, kind, name, damage):
    run(tmp_path)
    (entry,) = entries(tmp_path, kind)
    DAMAGE[damage](entry / name)
    record = run(tmp_path)
    expected = ("disk", "xla") if kind == "executables" else ("torch-mlir", "disk")
    assert sources(record) == [expected]
    assert record.cache_misses() == {"corrupted": 1}
    assert len(warnings(caplog)) == 1 and "evicting" in warnings(caplog)[0]
    assert_warm(tmp_path)


def test_unwritable_directory_warns_once_and_runs(tmp_path, caplog, monkeypatch):
    # Tests run as root, where chmod does not stop writes: a path under a file does.
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    for rows in (4, 5, 4):
        assert sources(run(blocker / "cache", rows)) == [("torch-mlir", "xla")]
    assert len(warnings(caplog)) == 1 and "cannot write the cache directory" in warnings(caplog)[0]

    # Once the directory is usable again (a new process), the cache works.
    blocker.unlink()
    monkeypatch.setattr(STATE, "unwritable_dirs", {})
    run(blocker / "cache")
    assert_warm(blocker / "cache")


def test_full_disk_warns_once_and_leaves_no_partial_entry(tmp_path, caplog, monkeypatch):
    def no_space(path, handle, data):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(disk_cache, "_write_file", no_space)
    for rows in (4, 5):
        run(tmp_path, rows)
    assert len(warnings(caplog)) == 1 and "No space left" in warnings(caplog)[0]
    assert [p for p in tmp_path.rglob("*") if p.is_file() or p.name.startswith(".")] == []

    monkeypatch.undo()
    monkeypatch.setattr(STATE, "unwritable_dirs", {})
    run(tmp_path)
    assert_warm(tmp_path)


def _keys(record: report.Report) -> set[str]:
    return {e.key for e in record.cache_events}


def _total(cache_dir) -> int:
    return sum(e.bytes for e in CacheDir(Path(cache_dir)).entries())


def test_lru_eviction_under_the_size_cap(tmp_path):
    a = _keys(run(tmp_path, 4))
    size_a = _total(tmp_path)
    _keys(run(tmp_path, 5))
    size_b = _total(tmp_path) - size_a
    assert_warm(tmp_path, 4)  # A is now more recently used than B
    cap = size_a + int(1.5 * max(size_a, size_b))
    c = _keys(run(tmp_path, 6, cache_max_bytes=cap))
    remaining = {p.name for kind in disk_cache.KINDS for p in entries(tmp_path, kind)}
    assert remaining == a | c
    assert _total(tmp_path) <= cap
    assert run(tmp_path, 5).cache_misses() == {"no entry": 2}  # B was evicted: recompiled
    assert_warm(tmp_path, 4)


def test_cli_info_prune_clear(tmp_path, capsys):
    run(tmp_path, 4)
    run(tmp_path, 5)
    assert_warm(tmp_path, 4)
    assert cli.main(["cache", "info", "--cache-dir", str(tmp_path), "--json"]) == 0
    info = json.loads(capsys.readouterr().out)
    assert (info["location"], info["entries"], info["hits"]) == (str(tmp_path), 4, 2)
    assert info["bytes"] == _total(tmp_path)

    cli.main(["cache", "prune", "--cache-dir", str(tmp_path), "--max-size", str(info["bytes"] - 1)])
    assert "evicted" in capsys.readouterr().out
    left = {p.name for kind in disk_cache.KINDS for p in entries(tmp_path, kind)}
    assert 0 < len(left) < 4 and _total(tmp_path) < info["bytes"]
    cli.main(["cache", "clear", "--cache-dir", str(tmp_path)])
    assert CacheDir(tmp_path).entries() == []
    run(tmp_path, 4)
    assert_warm(tmp_path, 4)

    # The console script is installed and reads TPU_INDUCTOR_CACHE_DIR like the backend.
    env = {**os.environ, "TPU_INDUCTOR_CACHE_DIR": str(tmp_path)}
    out = subprocess.run(
        ["tpu-inductor", "cache", "info"], env=env, capture_output=True, text=True, check=True
    ).stdout
    assert f"location:    {tmp_path}" in out and "entries:     2" in out


# A separate process that compiles ``graph`` for inputs of each of ``rows`` x 8
# (comma-separated) into the cache directory. mode "kill": SIGKILL itself halfway
# through writing the named file. mode "barrier": hold every publish until all
# ``parties`` processes reach it, so they really race on the same rename.
CHILD = """
import json, os, signal, sys, time, torch
from pathlib import Path
from tpu_inductor import versions
from tpu_inductor.runtime import disk_cache
import tpu_inductor.report as report

versions._source_digest = lambda: "pinned-for-tests"
cache_dir, rows, mode, arg = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4]
published = []
if mode == "kill":
    write = disk_cache._write_file
    def dying_write(path, handle, data):
        if path.name == arg:
            handle.write(data[: len(data) // 2])
            handle.flush()
            os.kill(os.getpid(), signal.SIGKILL)
        write(path, handle, data)
    disk_cache._write_file = dying_write
elif mode == "barrier":
    barrier, parties = Path(arg), int(sys.argv[5])
    publish = disk_cache._publish
    def racing_publish(tmp_dir, entry_dir):
        n = len(published)
        (barrier / f"{n}-{os.getpid()}").touch()
        deadline = time.monotonic() + 60
        while len(list(barrier.glob(f"{n}-*"))) < parties and time.monotonic() < deadline:
            time.sleep(0.01)
        won = publish(tmp_dir, entry_dir)
        published.append(won)
        return won
    disk_cache._publish = racing_publish

def graph(x):
    return (x.sin() * 2 + x.cos()).sum(-1)

for n in map(int, rows.split(",")):
    torch.manual_seed(n)
    x = torch.randn(n, 8)
    compiled = torch.compile(graph, backend="tpu", options={"cache_dir": cache_dir})
    torch.testing.assert_close(compiled(x), graph(x))
    torch._dynamo.reset()
print(json.dumps({"sources": [i.compile_source for i in report.current().islands()], "published": published}))
"""


def _child(*args: str) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-c", textwrap.dedent(CHILD), *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def test_processes_compiling_at_once_leave_one_valid_entry(tmp_path):
    cache, barrier = tmp_path / "cache", tmp_path / "barrier"
    barrier.mkdir()
    # Both compile the same graph (4 rows), then each a different one (6 and 8
    # rows); every publish waits for the other process, so each pair races.
    children = [_child(str(cache), rows, "barrier", str(barrier), "2") for rows in ("4,6", "4,8")]
    results = []
    for child in children:
        out, err = child.communicate(timeout=300)
        assert child.returncode == 0, err[-3000:]
        results.append(json.loads(out.strip().splitlines()[-1]))
    assert all(r["sources"] == ["xla", "xla"] for r in results)  # both compiled everything
    first, second = (r["published"] for r in results)
    # Same graph: for the graph and the executable entry, exactly one process
    # published and the other found it taken (and kept its own result).
    assert [first[i] + second[i] for i in range(2)] == [1, 1]
    # Different graphs: both published.
    assert first[2:] == second[2:] == [True, True]
    assert len(entries(cache, "graphs")) == 3 and len(entries(cache, "executables")) == 3
    assert CacheDir(cache).incomplete_writes() == 0
    for rows in (4, 6, 8):
        assert_warm(cache, rows)


def test_kill_9_mid_write_leaves_nothing_to_trip_on(tmp_path):
    # Cold run killed while writing the executable (the graph entry is already published).
    killed = _child(str(tmp_path), "4", "kill", "executable.bin")
    killed.communicate(timeout=300)
    assert killed.returncode == -9
    assert len(entries(tmp_path, "graphs")) == 1 and entries(tmp_path, "executables") == []
    assert CacheDir(tmp_path).incomplete_writes() == 1
    # Warm run killed while updating the graph entry's manifest (its last-used time).
    killed = _child(str(tmp_path), "4", "kill", "manifest.json")
    killed.communicate(timeout=300)
    assert killed.returncode == -9
    (graph_entry,) = entries(tmp_path, "graphs")
    assert len(list(graph_entry.glob(".manifest.json.*.tmp"))) == 1

    record = run(tmp_path)
    assert sources(record) == [("disk", "xla")]
    assert record.cache_misses() == {"no entry": 1}
    assert_warm(tmp_path)
    # The dead writer's temporary directory is removed once it is stale.
    cache = CacheDir(tmp_path)
    for path in [*(tmp_path / "executables").glob(".tmp-*"), *graph_entry.glob(".*.tmp")]:
        os.utime(path, (0, 0))
    cache.entries()
    assert cache.incomplete_writes() == 0 and list(graph_entry.glob(".*")) == []
    assert_warm(tmp_path)


def test_cache_settings():
    assert Config.load({}, environ={}).cache_max_bytes == 2 * 1024**3
    assert Config.load({}, environ={"TPU_INDUCTOR_CACHE_MAX_BYTES": "500M"}).cache_max_bytes == 500 * 1024**2
    assert Config.load({"cache_max_bytes": "1.5GiB"}, environ={}).cache_max_bytes == 3 * 1024**3 // 2
    assert Config.load({}, environ={"XLA_FLAGS": "--xla_foo"}).xla_flags == "--xla_foo"
    # XLA reads XLA_FLAGS itself when its client starts: an option could not change it.
    with pytest.raises(ValueError, match="unknown tpu_inductor option"):
        Config.load({"xla_flags": "--xla_foo"}, environ={})
    with pytest.raises(ValueError, match="TPU_INDUCTOR_CACHE_MAX_BYTES: not a size"):
        Config.load({}, environ={"TPU_INDUCTOR_CACHE_MAX_BYTES": "lots"})


def test_graph_key_covers_constant_attributes_and_input_metadata():
    from tpu_inductor.lowering.cache import graph_key

    class WithConstant(torch.nn.Module):
        def __init__(self, value: float) -> None:
            super().__init__()
            self.register_buffer("c", torch.full((8,), value))

        def forward(self, x):
            return (x + self.c).sin()

    def traced(value: float, x: torch.Tensor) -> torch.fx.GraphModule:
        gm = torch.fx.symbolic_trace(WithConstant(value))
        for node in gm.graph.nodes:
            if node.op == "placeholder":
                node.meta["val"] = x
        return gm

    x = torch.randn(4, 8)
    key = graph_key(traced(1.0, x)).digest
    assert graph_key(traced(1.0, x.clone())).digest == key  # values of inputs do not matter
    assert graph_key(traced(2.0, x)).digest != key  # constant bytes do
    assert graph_key(traced(1.0, x.t().contiguous().t())).digest != key  # strides do
    assert graph_key(traced(1.0, x.double())).digest != key  # dtypes do


def test_the_islands_of_identical_layers_share_one_lowering(tmp_path):
    """Each layer's ``topk`` runs in eager (its tie order is eager's), so the
    model is an island per layer: the same graph under other node names.
    The graph key names nodes by position, so the middle layers' islands are
    lowered by torch-mlir once (a tiny Mistral Large 4: 144 islands, 144 -> 7
    lowerings, 9.6 -> 0.6 s)."""

    class Layer(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.linear = torch.nn.Linear(16, 16)

        def forward(self, h):
            h = torch.relu(self.linear(h))
            values, indices = torch.topk(h, 2, dim=-1)
            return torch.tanh(h * values.sum(-1, keepdim=True)) + 0.01 * indices.sum(-1, keepdim=True)

    torch.manual_seed(0)
    model = torch.nn.Sequential(*[Layer() for _ in range(4)]).eval()
    x = torch.randn(4, 16)
    report.reset()
    with torch.no_grad():
        torch.testing.assert_close(torch.compile(model, backend="tpu", options={"cache_dir": str(tmp_path)})(x), model(x))
    record = report.current()
    assert len(record.islands()) == 5 and len(record.fallbacks()) == 4
    # The first island, the three between two topks, the last.
    assert report.compile_counts()["torch_mlir_lowerings"] == 3
    assert [i.lower_source for i in record.islands()].count("disk") == 2


def test_every_path_under_the_cache_directory_is_named_by_cache_dir():
    """Nothing outside CacheDir builds a path under the cache directory."""
    root = Path(tpu_inductor.__file__).parent
    templates = ("learned_unsupported-", "kernel_timings-", "traced_graphs.json")
    users = sorted(
        str(p.relative_to(root))
        for p in root.rglob("*.py")
        if any(name in p.read_text() for name in templates) or "resolved_cache_dir /" in p.read_text()
    )
    assert users == ["runtime/disk_cache.py"]
