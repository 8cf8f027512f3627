"""What a failed lowering teaches the support table, and what it must not.

A learned failure keeps a call off the device in every later graph and
process, so it is keyed by what decides lowering (op, dtypes, ranks, dynamic
dims, non-tensor arguments), learned only for an op proven to fail alone,
and re-probed by a later process until a second process confirms it.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

import tpu_inductor.report as report
from tpu_inductor.placement.culprits import BUILT_AFTER_COMPILE_FAILED, find_culprits
from tpu_inductor.placement.support import SupportTable
from tpu_inductor.placement.partition import Island


def odd_pool(x):
    # torch-mlir 20261001 cannot legalize avg_pool2d with divisor_override
    # (decompositions/avg_pool_counts.py decomposes it; these tests take that away).
    return torch.nn.functional.avg_pool2d(x, 2, divisor_override=3)


WITHOUT_POOL_DECOMPOSITIONS = (
    "from tpu_inductor.decompositions.avg_pool_counts import AVG_POOL_DECOMPOSITIONS; AVG_POOL_DECOMPOSITIONS.clear()"
)


@pytest.fixture(autouse=True)
def without_pool_decompositions(monkeypatch):
    """A call torch-mlir really fails on, with arguments other calls of its op lack."""
    from tpu_inductor.decompositions import avg_pool_counts, table as decompositions

    saved = dict(avg_pool_counts.AVG_POOL_DECOMPOSITIONS)
    avg_pool_counts.AVG_POOL_DECOMPOSITIONS.clear()
    decompositions._table.cache_clear()
    yield
    avg_pool_counts.AVG_POOL_DECOMPOSITIONS.update(saved)
    decompositions._table.cache_clear()


def plain_pool(x):
    return torch.nn.functional.avg_pool2d(x, 2)


def compiled(fn, cache_dir):
    return torch.compile(fn, backend="tpu", options={"cache_dir": str(cache_dir)})


def learned_file(cache_dir) -> dict:
    (path,) = cache_dir.glob("learned_unsupported-*.json")
    return json.loads(path.read_text())


def test_signature_holds_the_arguments_that_decide_lowering():
    gm = torch.fx.experimental.proxy_tensor.make_fx(lambda x: (odd_pool(x), plain_pool(x)))(torch.randn(1, 2, 4, 4))
    odd, plain = [SupportTable.signature(n) for n in gm.graph.find_nodes(op="call_function", target=torch.ops.aten.avg_pool2d.default)]
    assert odd == "aten.avg_pool2d(float32[4]; kernel_size=[2, 2], divisor_override=3)"
    assert plain == "aten.avg_pool2d(float32[4]; kernel_size=[2, 2])"


def test_a_failure_of_one_call_leaves_other_calls_of_the_op_on_the_device(tmp_path):
    x = torch.randn(2, 3, 8, 8)
    torch.testing.assert_close(compiled(odd_pool, tmp_path)(x), odd_pool(x))
    assert [f.op for f in report.current().fallbacks()] == ["aten.avg_pool2d.default"]
    assert list(learned_file(tmp_path)) == ["aten.avg_pool2d(float32[4]; kernel_size=[2, 2], divisor_override=3)"]

    torch._dynamo.reset()
    report.reset()
    torch.testing.assert_close(compiled(plain_pool, tmp_path)(x), plain_pool(x))
    assert report.current().fallbacks() == []
    assert "aten.avg_pool2d.default" in report.current().islands()[0].ops


LATER_PROCESS = textwrap.dedent(
    """
    import json, sys, torch
    import tpu_inductor.report as report
    {without}
    fn = {fn}
    x = torch.randn(2, 3, 8, 8)
    out = torch.compile(fn, backend="tpu", options={{"cache_dir": sys.argv[1]}})(x)
    torch.testing.assert_close(out, fn(x))
    print(json.dumps([f.op for f in report.current().fallbacks()]))
    """
)


def _in_new_process(fn_source: str, cache_dir) -> list[str]:
    script = LATER_PROCESS.format(fn=fn_source, without=WITHOUT_POOL_DECOMPOSITIONS)
    result = subprocess.run(
        [sys.executable, "-c", script, str(cache_dir)], capture_output=True, text=True, timeout=300
    )
    assert result.returncode == 0, result.stderr[-3000:]
    return json.loads(result.stdout.strip().splitlines()[-1])


def test_a_later_process_lowers_what_a_fresh_process_lowers(tmp_path):
    """The bar: after any failing call, a new process still puts a plain call on the device."""
    x = torch.randn(2, 3, 8, 8)
    compiled(odd_pool, tmp_path)(x)
    assert learned_file(tmp_path)
    plain = "lambda x: torch.nn.functional.avg_pool2d(x, 2)"
    assert _in_new_process(plain, tmp_path) == []


def test_a_later_process_reprobes_what_it_did_not_learn_itself(tmp_path):
    """An entry from another process is tried alone once: kept (confirmed) when
    it fails again, forgotten when it lowers."""
    x = torch.randn(2, 3, 8, 8)
    compiled(odd_pool, tmp_path)(x)
    (signature,) = learned_file(tmp_path)
    # A wrongly learned entry, as an older process (or a transient error) left it.
    path = next(tmp_path.glob("learned_unsupported-*.json"))
    entries = json.loads(path.read_text())
    entries["aten.sin(float32[4])"] = {"reason": "XLA: out of the blue", "confirmed": False}
    path.write_text(json.dumps(entries))

    odd = "lambda x: torch.nn.functional.avg_pool2d(x, 2, divisor_override=3) + x.sin().sum()"
    assert _in_new_process(odd, tmp_path) == ["aten.avg_pool2d.default"]
    after = learned_file(tmp_path)
    assert after[signature]["confirmed"] is True
    assert "aten.sin(float32[4])" not in after


def _island_of(fn, *inputs) -> Island:
    gm = torch.fx.experimental.proxy_tensor.make_fx(fn)(*inputs)
    nodes = [n for n in gm.graph.nodes if n.op == "call_function"]
    return Island(name="island_0", nodes=nodes, graph=gm, owner=gm)


def test_ops_that_only_fail_together_are_not_learned():
    """Only the smallest run that fails is kept off the device, for this graph:
    the probes say every op lowers alone."""
    island = _island_of(lambda x: ((x.sin() * 2).cos() + 1).exp().neg(), torch.randn(4))
    ops = lambda probe: {n.target for n in probe.nodes}  # noqa: E731

    def lowers(probe: Island) -> None:
        if {torch.ops.aten.cos.default, torch.ops.aten.add.Tensor} <= ops(probe):
            raise RuntimeError("XLA: cos and add refuse to meet")

    diagnosis = find_culprits(island, RuntimeError("XLA: the island"), SupportTable.signature, lowers)
    assert diagnosis.proven == []
    assert [n.target for n, _ in diagnosis.together] == [torch.ops.aten.cos.default, torch.ops.aten.add.Tensor]
    assert all("lowers alone" in why for _, why in diagnosis.together)


def test_a_failure_no_probe_reproduces_blames_no_op():
    """The island lowers and compiles as a probe: what failed came after, and no op is blamed."""
    island = _island_of(lambda x: (x.sin() * 2).cos(), torch.randn(4))
    diagnosis = find_culprits(island, TypeError("a handler's argument"), SupportTable.signature, lambda probe: None)
    assert diagnosis.proven == [] and diagnosis.unexplained
    assert len(diagnosis.together) == 3
    assert all(why.startswith(BUILT_AFTER_COMPILE_FAILED) and "a handler's argument" in why for _, why in diagnosis.together)


@pytest.mark.backend_failure_expected
def test_a_runner_that_fails_after_the_compile_runs_eagerly_and_says_so(monkeypatch, caplog, tmp_path):
    """As on jaxlib 0.11 before its result handlers were made without ``_skip_checks``:
    the island runs in eager, the log says no op is to blame, and the reproducer
    bundle names our runner, not XLA, with the traceback and a replay that compiles."""
    from tpu_inductor.reporting.repro import AFTER_COMPILE
    from tpu_inductor.runtime import transfer

    def refused(*args, **kwargs):
        raise TypeError("incompatible function arguments")

    monkeypatch.setattr(transfer, "result_handler", refused)
    x = torch.randn(4)
    options = {"cache": False, "report_dir": str(tmp_path)}
    with caplog.at_level("WARNING", logger="tpu_inductor"):
        out = torch.compile(lambda x: x.sin() + 1, backend="tpu", options=options)(x)
    assert torch.equal(out, x.sin() + 1)
    reasons = [f.reason for f in report.current().fallbacks()]
    assert len(reasons) == 2 and all(r.startswith(BUILT_AFTER_COMPILE_FAILED) for r in reasons)
    assert "No op is to blame" in caplog.text and "incompatible function arguments" in caplog.text
    (repro,) = report.current().repros
    assert repro.stage == AFTER_COMPILE and "incompatible function arguments" in repro.error
    bundle = Path(repro.path)
    assert "in refused" in (bundle / "diagnostics.txt").read_text()  # the traceback, to the code that raised
    assert "No op is to blame" in (bundle / "README.txt").read_text()
    replay = subprocess.run([sys.executable, "replay.py"], cwd=bundle, capture_output=True, text=True, timeout=120)
    assert replay.returncode == 0 and "compiled" in replay.stdout, replay.stderr


def test_only_the_call_that_fails_alone_is_blamed():
    """Two calls of one op with different arguments: the probe tells them apart."""
    island = _island_of(lambda x: odd_pool(x).sum() + plain_pool(x).mul(2).sum(), torch.randn(1, 2, 4, 4))

    def lowers(probe: Island) -> None:
        for node in probe.nodes:
            if "divisor_override" in SupportTable.signature(node):
                raise RuntimeError("torch-mlir: divisor_override")
        if len(probe.nodes) > 2:
            raise RuntimeError("XLA: the whole island")

    diagnosis = find_culprits(island, RuntimeError("XLA"), SupportTable.signature, lowers)
    assert [SupportTable.signature(n) for n, _ in diagnosis.proven] == [
        "aten.avg_pool2d(float32[4]; kernel_size=[2, 2], divisor_override=3)"
    ]


def test_cache_clear_removes_every_learned_file(tmp_path):
    from tpu_inductor import cli

    compiled(odd_pool, tmp_path)(torch.randn(1, 1, 4, 4))
    (tmp_path / "kernel_timings-cpu-0123.json").write_text("{}")
    assert cli.main(["cache", "info", "--cache-dir", str(tmp_path)]) == 0
    assert cli.main(["cache", "clear", "--cache-dir", str(tmp_path)]) == 0
    assert not list(tmp_path.glob("*.json"))


def test_cache_info_lists_what_was_learned_and_why(tmp_path, capsys):
    from tpu_inductor import cli

    compiled(odd_pool, tmp_path)(torch.randn(1, 1, 4, 4))
    capsys.readouterr()
    cli.main(["cache", "info", "--cache-dir", str(tmp_path), "--json"])
    (entry,) = json.loads(capsys.readouterr().out)["learned_unsupported"]
    assert entry["signature"].startswith("aten.avg_pool2d(")
    assert "torch-mlir" in entry["reason"] and entry["confirmed"] is False


@pytest.mark.parametrize("mode", [None, "default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs"])
def test_every_torch_compile_mode_is_accepted(mode):
    x = torch.randn(4)
    out = torch.compile(lambda a: a.sin() + 1, backend="tpu", mode=mode)(x)
    torch.testing.assert_close(out, x.sin() + 1)
    assert report.current().islands()


def test_an_unknown_mode_names_the_valid_ones():
    with pytest.raises(Exception, match="reduce-overhead"):
        torch.compile(lambda a: a + 1, backend="tpu", mode="fastest")(torch.randn(2))
