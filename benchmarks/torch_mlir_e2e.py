"""Run torch-mlir's own end-to-end test suite through backend="tpu" and aot_eager.

torch-mlir keeps ~1,800 end-to-end tests (``projects/pt1/python/torch_mlir_e2e_test``
in the llvm/torch-mlir repository): small ``nn.Module``s, each with an invoker
that calls it on inputs from ``TestUtils``. Nobody here wrote them, so they
test this backend on code it was not tuned for. The suite is not part of the
torch-mlir wheel; point ``--suite-dir`` at a source checkout (nothing from it
is copied into this repository). Pinned commit, see ``torch_mlir_suite.PINNED_COMMIT``::

    git --git-dir=<torch-mlir.git> archive 0029fc2e102c6d604696b33eb618116b4957a2e3 \\
        projects/pt1/python/torch_mlir_e2e_test projects/pt1/python/torch_mlir/_version.py \\
        projects/pt1/e2e_testing | tar -x -C /tmp/torch-mlir-src
    echo 0029fc2e102c6d604696b33eb618116b4957a2e3 > /tmp/torch-mlir-src/TORCH_MLIR_COMMIT
    python benchmarks/torch_mlir_e2e.py --suite-dir /tmp/torch-mlir-src --limit 40

For each test, as torch-mlir's framework does: build the module with the
test's factory and run its invoker on a tracing wrapper, which records each
call's inputs and eager ("golden") output (and here also the RNG state before
the call). Then the recorded calls are replayed on a fresh module from the
factory: once in eager (the reference for in-place updates of inputs, and a
determinism check), once under stock ``torch.compile(backend="aot_eager")``
and once under ``torch.compile(backend="tpu")`` with a fresh ``cache_dir``.
Outputs are compared with torch-mlir's own ``ValueReport`` (its tolerances:
rtol 1e-3 / atol 1e-7 for tensors, 1e-4 relative for floats, exact dtypes and
shapes); inputs the module updates in place must also end up as in eager.
A test whose eager results change with the seed draws random numbers, which
no backend need draw as eager does (Inductor does not, nor does tpu unless
``fallback_random``): its results are compared by distribution instead
(:func:`_distribution_differences`), against eager under 8 seeds.

Where a backend's outputs miss eager's and every output is float16 or
bfloat16, the test also runs in float64 (module and floating inputs widened),
and the backend passes when its error against that, in the largest and the
mean element, is no larger than eager's: of two low-precision results, the
one nearer the exact answer is not the wrong one (``compared: float64``,
listed apart in the table's notes).

Outcomes per backend: ``pass``, ``mismatch``, ``error`` (``error_kind``
dynamo / backend / runtime), ``crash`` (the worker died: segfault, abort),
``timeout`` (past the test's ``timeout_seconds``, or ``--timeout``), and
``skipped`` when eager itself fails (e.g. the torchvision tests where
torchvision is not installed) or times out. "Fully lowered" is a tpu pass with
no eager fallback in ``report.current().fallbacks()``. Tests in
``FX_IMPORTER_STABLEHLO_XFAIL_SET`` (and ``..._CRASHING_SET``) of the suite's
``xfail_sets.py``, which torch-mlir's own FX-importer StableHLO path fails,
are summarised on their own line.

torch-mlir's framework imports ``multiprocess`` and some tests ``torchvision``;
when they are not installed, stand-ins are put in ``sys.modules`` (the
framework's process pool is not used; torchvision tests fail in eager and are
skipped).

    python benchmarks/torch_mlir_e2e.py --suite-dir /tmp/torch-mlir-src           # all, ~1,800
    python benchmarks/torch_mlir_e2e.py --suite-dir /tmp/torch-mlir-src --filter 'Conv|Pool' -j 2
"""

from __future__ import annotations

import os
import re
import sys
import time
from pathlib import Path
from typing import Any, Optional

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from benchmarks import sweep_common as common  # noqa: E402
from benchmarks.torch_mlir_suite import (  # noqa: E402
    PINNED_COMMIT,
    SUITE_ENV,
    WHEEL_LLVM_COMMIT,
    XFAIL_SETS,
    import_suite,
    suite_commit,
)

DEFAULT_OUT = ROOT / "benchmarks" / "results" / "torch_mlir_e2e.json"

PHASES = ("eager", "aot_eager", "tpu")
BACKENDS = ("tpu", "aot_eager")


# ---------------------------------------------------------------- worker


_TESTS: dict = {}


def _setup_worker() -> None:
    global _TESTS
    _TESTS, _, _ = import_suite(Path(os.environ[SUITE_ENV]))


class _Tracer:
    """torch-mlir's ``framework._Tracer``, also keeping the RNG state before each call."""

    def __init__(self, wrapped: Any, path: list[str], trace: list[dict]):
        self.__wrapped__ = wrapped
        self.__trace__ = trace
        self.__path__ = path

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        import torch

        inputs = common.clone_tree(list(args))
        kw = common.clone_tree(dict(kwargs))
        rng = torch.get_rng_state()
        output = self.__wrapped__(*args, **kwargs)
        self.__trace__.append({"symbol": ".".join(self.__path__), "inputs": inputs, "kwargs": kw,
                               "rng": rng, "output": common.clone_tree(output)})
        return output

    def __getattr__(self, name: str) -> Any:
        return _Tracer(getattr(self.__wrapped__, name), self.__path__ + [name], self.__trace__)


def _golden_trace(test: Any) -> list[dict]:
    from torch_mlir_e2e_test.framework import TestUtils

    common.seeded(0)
    module = test.program_factory()
    trace: list[dict] = []
    test.program_invoker(_Tracer(module, [], trace), TestUtils())
    return trace


def _resolve(module: Any, symbol: str) -> Any:
    target = module
    for part in symbol.split("."):
        target = getattr(target, part)
    return target


def _replay(test: Any, trace: list[dict], backend: Optional[str], cache_dir: Optional[str],
            reseed: Optional[int] = None) -> list[tuple]:
    """(output, inputs after the call) of each traced call, on a fresh module;
    ``reseed``: seed the generator with it (plus the call's index) instead of
    restoring the RNG state the trace recorded."""
    import torch

    common.seeded(0)
    module = test.program_factory()
    callables: dict[str, Any] = {}
    results = []
    for item in trace:
        symbol = item["symbol"]
        if symbol not in callables:
            target = module if symbol == "forward" else _resolve(module, symbol)
            if backend is None:
                callables[symbol] = target
            elif backend == "tpu":
                callables[symbol] = torch.compile(target, backend="tpu", options=common.tpu_options(cache_dir))
            else:
                callables[symbol] = torch.compile(target, backend=backend)
        args, kwargs = common.clone_tree(item["inputs"]), common.clone_tree(item["kwargs"])
        if reseed is None:
            torch.set_rng_state(item["rng"])
        else:
            torch.manual_seed(reseed + len(results))
        output = callables[symbol](*args, **kwargs)
        results.append((common.clone_tree(output), args))
    return results


def _differences(trace: list[dict], results: list[tuple], eager: Optional[list[tuple]]) -> list[str]:
    """torch-mlir's verdict on the outputs, then the inputs updated in place against eager's."""
    from torch_mlir_e2e_test.reporting import ErrorContext, ValueReport

    problems = []
    for index, (item, (output, inputs)) in enumerate(zip(trace, results)):
        context = ErrorContext.empty().chain(f'trace item #{index}: output of call to "{item["symbol"]}"')
        report = ValueReport(output, item["output"], context)
        if report.failed:
            detail = common.compare(output, item["output"], rtol=1e-3, atol=1e-7, limit=2)
            problems.append(" ".join(report.error_str().split("\n")[-1:]) + (f" [{'; '.join(detail)}]" if detail else ""))
        if eager is not None:
            for position, (got, want) in enumerate(zip(inputs, eager[index][1])):
                report = ValueReport(got, want, ErrorContext.empty())
                if report.failed:
                    problems.append(f"input #{position} of call #{index} after the call (updated in place) differs "
                                    "from eager's: " + report.error_str().split("\n")[-1])
    return problems


RANDOM_REFERENCE_SEEDS = 8
"""Eager replays under other seeds that give a random test's reference spread."""
RANDOM_SPREAD = 6.0
"""A random test passes where every statistic lies within this many standard
deviations of eager's over those seeds: independent generators differ by about
1.4 of them, so 6 fails a correct generator about once in 10**8 per statistic,
while a wrong distribution (another mean, variance or support) misses by far."""


def _statistics(results: list[tuple]) -> list[float]:
    """What a random test's results say about the distribution: each small
    tensor's values, each larger one's mean and standard deviation (outputs
    and inputs updated in place alike); shapes and dtypes are checked apart."""
    import torch
    from torch.utils._pytree import tree_leaves

    values: list[float] = []
    for leaf in tree_leaves(results):
        if isinstance(leaf, torch.Tensor):
            data = leaf.detach().double()
            values += data.flatten().tolist() if data.numel() <= 16 else [data.mean().item(), data.std().item()]
        elif isinstance(leaf, (int, float, bool)):
            values.append(float(leaf))
    return values


def _identical(a: list[tuple], b: list[tuple]) -> bool:
    """Bit for bit (a statistic of a million draws moves by less than torch-mlir's tolerance)."""
    import torch
    from torch.utils._pytree import tree_leaves

    def same(x: Any, y: Any) -> bool:
        if isinstance(x, torch.Tensor) and isinstance(y, torch.Tensor):
            if x.shape != y.shape or x.dtype != y.dtype:
                return False
            if x.is_floating_point() or x.is_complex():  # NaN where eager gives NaN is the same result
                return bool(((x == y) | (x.isnan() & y.isnan())).all())
            return torch.equal(x, y)
        return x == y or (isinstance(x, float) and isinstance(y, float) and x != x and y != y)

    left, right = tree_leaves(a), tree_leaves(b)
    return len(left) == len(right) and all(same(x, y) for x, y in zip(left, right))


def _layout(results: list[tuple]) -> list[Any]:
    import torch
    from torch.utils._pytree import tree_leaves

    return [(tuple(x.shape), x.dtype) if isinstance(x, torch.Tensor) else type(x) for x in tree_leaves(results)]


def _distribution_differences(results: list[tuple], references: list[list[tuple]]) -> list[str]:
    """A random test's verdict: the same layout as eager's, and every statistic
    within :data:`RANDOM_SPREAD` deviations of eager's under other seeds."""
    import math
    import statistics

    if _layout(results) != _layout(references[0]):
        return [f"shapes or dtypes differ from eager's: {_layout(results)[:4]} vs {_layout(references[0])[:4]}"]
    columns = list(zip(*(_statistics(r) for r in references)))
    problems = []
    for index, (got, column) in enumerate(zip(_statistics(results), columns)):
        if not all(math.isfinite(v) for v in (got, *column)):
            if not all(math.isnan(v) for v in (got, *column)) and got not in column:
                problems.append(f"statistic #{index}: {got}, eager's under {len(column)} seeds {column[:3]}...")
            continue
        centre, spread = statistics.fmean(column), statistics.stdev(column)
        if abs(got - centre) > RANDOM_SPREAD * spread + 1e-7 + 1e-6 * abs(centre):
            problems.append(f"statistic #{index}: {got:.6g}, eager's under {len(column)} seeds "
                            f"{centre:.6g} +- {spread:.3g}")
    return problems


LOW_PRECISION = ("float16", "bfloat16")


def _in_float64(test: Any, trace: list[dict]) -> Optional[list[tuple]]:
    """The traced calls replayed in eager on float64 copies of the module and of
    every floating input: the arbiter between two low-precision results. None
    when the test cannot run in float64."""
    import torch
    from torch.utils._pytree import tree_map

    def widen(value: Any) -> Any:
        return value.double() if isinstance(value, torch.Tensor) and value.is_floating_point() else value

    if any(item["symbol"] != "forward" for item in trace):
        return None
    common.seeded(0)
    try:
        module = test.program_factory().to(torch.float64)
        return [(module(*tree_map(widen, item["inputs"]), **tree_map(widen, item["kwargs"])), None)
                for item in trace]
    except Exception:  # noqa: BLE001 - a module that only runs at its own dtype has no arbiter
        return None


def _no_less_exact(results: list[tuple], eager: list[tuple], exact: list[tuple]) -> Optional[str]:
    """Where every output tensor is float16 or bfloat16: whether ours is at least
    as close to float64's as eager's is, in the largest and the mean error. The
    comparison said, or None when it is not so (or does not apply)."""
    import torch
    from torch.utils._pytree import tree_leaves

    ours, theirs, truth = (tree_leaves([r[0] for r in rows]) for rows in (results, eager, exact))
    if not ours or len(ours) != len(theirs) or len(ours) != len(truth):
        return None
    said = []
    for a, e, t in zip(ours, theirs, truth):
        if not isinstance(e, torch.Tensor) or str(e.dtype).removeprefix("torch.") not in LOW_PRECISION:
            return None
        if a.shape != e.shape or a.dtype != e.dtype:
            return None
        error, eager_error = (a.double() - t).abs(), (e.double() - t).abs()
        if not (error.max() <= eager_error.max() and error.mean() <= eager_error.mean()):
            return None
        said.append(f"error against float64: ours max {error.max():.3g} mean {error.mean():.3g}, "
                    f"eager's max {eager_error.max():.3g} mean {eager_error.mean():.3g}")
    return "; ".join(said)


def _run_backend(test: Any, trace: list[dict], backend: str, eager: list[tuple],
                 random_references: Optional[list[list[tuple]]] = None) -> dict:
    import torch

    torch._dynamo.reset()
    record: dict = {}
    with common.fresh_cache_dir() as cache_dir:
        if backend == "tpu":
            import tpu_inductor.report as report

            report.reset()
        try:
            results = _replay(test, trace, backend, cache_dir)
        except Exception as exc:  # noqa: BLE001
            record.update(common.describe(exc))
        else:
            if random_references:  # no reference for the numbers, one for their distribution
                problems = _distribution_differences(results, random_references)
                record["compared"] = "distribution"
            else:
                problems = _differences(trace, results, eager)
                exact = _in_float64(test, trace) if problems else None
                arbiter = _no_less_exact(results, eager, exact) if exact is not None else None
                if arbiter:  # apart from eager's low-precision numbers, but no further from the exact ones
                    record.update(compared="float64", arbiter=arbiter, eager_differences="; ".join(problems)[:1000])
                    problems = []
            record.update(outcome=common.MISMATCH if problems else common.PASS)
            if problems:
                record["error"] = "; ".join(problems)[:1000]
        if backend == "tpu":
            record.update(common.backend_facts())
    return record


def run_task(task: dict, log: common.WorkerLog) -> None:
    test = _TESTS[task["id"]]
    trace = eager = random_references = None
    # The reference always runs (a later worker needs it too) and is always recorded.
    with log.phase("eager") as record:
        try:
            trace = _golden_trace(test)
            eager = _replay(test, trace, None, None)
        except Exception as exc:  # noqa: BLE001
            record.update(common.describe(exc))
            record["error_kind"] = "eager"
            trace = None
        else:
            again = _differences(trace, eager, None)
            record.update(outcome=common.PASS, calls=len(trace))
            if again:  # eager twice on the same inputs and RNG state disagrees
                record.update(reference="nondeterministic", error="; ".join(again)[:500])
            elif not _identical(_replay(test, trace, None, None, reseed=1), eager):
                # Another seed, other results: the test draws random numbers,
                # which a backend need not draw as eager does (Inductor does not).
                random_references = [eager] + [_replay(test, trace, None, None, reseed=seed)
                                               for seed in range(1, RANDOM_REFERENCE_SEEDS)]
                record["reference"] = "random"
    for backend in ("aot_eager", "tpu"):  # the stock backend first: a tpu crash cannot lose it
        if not log.wants(backend):
            continue
        if trace is None:
            log.skip(backend, "eager failed")
            continue
        with log.phase(backend) as record:
            record.update(_run_backend(test, trace, backend, eager, random_references))


# ---------------------------------------------------------------- parent


def _outcome(record: dict, phase: str) -> str:
    return record["phases"].get(phase, {}).get("outcome", common.SKIPPED)


def _ran(record: dict) -> bool:
    """Eager ran and is deterministic: there is something to compare with."""
    eager = record["phases"].get("eager", {})
    return eager.get("outcome") == common.PASS and eager.get("reference") != "nondeterministic"


def _fully_lowered(record: dict) -> bool:
    tpu = record["phases"].get("tpu", {})
    return tpu.get("outcome") == common.PASS and not tpu.get("fallbacks")


def summarise(records: dict[str, dict], xfails: dict[str, set]) -> dict:
    ran = [r for r in records.values() if _ran(r)]
    summary: dict[str, Any] = {
        "tests": len(records),
        "eager_failed": sum(_outcome(r, "eager") != common.PASS for r in records.values()),
        "nondeterministic": sum(r["phases"].get("eager", {}).get("reference") == "nondeterministic"
                                for r in records.values()),
        "random": sum(r["phases"].get("eager", {}).get("reference") == "random" for r in records.values()),
        "ran": len(ran),
    }
    for backend in BACKENDS:
        counts = common.count(_outcome(r, backend) for r in ran)
        counts["dynamo_errors"] = sum(r["phases"].get(backend, {}).get("error_kind") == "dynamo" for r in ran)
        counts["pass_by_float64"] = sorted(
            r["id"] for r in ran if r["phases"].get(backend, {}).get("compared") == "float64")
        summary[backend] = counts
    summary["tpu"]["fully_lowered"] = sum(_fully_lowered(r) for r in ran)
    summary["tpu"]["pass_without_device_island"] = sum(
        _outcome(r, "tpu") == common.PASS and not r["phases"]["tpu"].get("islands") for r in ran)
    summary["tpu_fails_aot_eager_passes"] = sorted(
        r["id"] for r in ran if _outcome(r, "tpu") != common.PASS and _outcome(r, "aot_eager") == common.PASS)
    summary["tpu_passes_aot_eager_fails"] = sorted(
        r["id"] for r in ran if _outcome(r, "tpu") == common.PASS and _outcome(r, "aot_eager") != common.PASS)
    for name, members in xfails.items():
        listed = [r for r in ran if r["id"] in members]
        summary[name] = {"ran": len(listed), "in_run": sum(r["id"] in members for r in records.values()),
                         **{b: sum(_outcome(r, b) == common.PASS for r in listed) for b in BACKENDS},
                         "tpu_fully_lowered": sum(_fully_lowered(r) for r in listed)}
    return summary


def table(summary: dict) -> str:
    header = ["backend", "ran", "pass", "mismatch", "error (of which Dynamo)", "crash", "timeout", "fully lowered"]
    rows = []
    for backend in BACKENDS:
        c = summary[backend]
        lowered = (f"{c['fully_lowered']} ({common.pct(c['fully_lowered'], summary['ran'])})"
                   if backend == "tpu" else "-")
        rows.append([backend, summary["ran"], f"**{c['pass']}** ({common.pct(c['pass'], summary['ran'])})",
                     c["mismatch"], f"{c['error']} ({c['dynamo_errors']})", c["crash"], c["timeout"], lowered])
    lines = [common.markdown_table(header, rows), ""]
    lines.append(f"{summary['tests']} tests; {summary['eager_failed']} fail or time out in eager and "
                 f"{summary['nondeterministic']} differ between two eager runs (not counted); "
                 f"{summary.get('random', 0)} draw random numbers (compared by distribution: every statistic "
                 f"within {RANDOM_SPREAD:g} deviations of eager's under {RANDOM_REFERENCE_SEEDS} seeds).")
    for backend in BACKENDS:
        arbitrated = summary[backend].get("pass_by_float64", [])
        if arbitrated:
            lines.append(f"{backend} passes {len(arbitrated)} whose float16/bfloat16 outputs differ from eager's "
                         f"but are no further from float64's than eager's are: {', '.join(arbitrated)}.")
    for name in XFAIL_SETS:
        if name in summary:
            s = summary[name]
            lines.append(f"{name} ({s['in_run']} of its tests in this run, {s['ran']} ran): "
                         f"tpu passes {s['tpu']} ({s['tpu_fully_lowered']} fully lowered), "
                         f"aot_eager passes {s['aot_eager']}.")
    bugs = summary["tpu_fails_aot_eager_passes"]
    lines.append(f"tpu fails where aot_eager passes: {len(bugs)}" + (f" ({', '.join(bugs[:20])}"
                                                                     f"{', ...' if len(bugs) > 20 else ''})" if bugs else ""))
    return "\n".join(lines)


def main(argv: Optional[list[str]] = None) -> None:
    parser = common.sweep_parser(argv, run_task, __doc__, setup=_setup_worker)
    if parser is None:
        return
    parser.add_argument("--suite-dir", type=Path, required=True, help="torch-mlir source checkout (or extracted tree)")
    parser.add_argument("--filter", help="regular expression the test name must contain (re.search)")
    parser.add_argument("--limit", type=int, help="first N matching tests in name order")
    parser.add_argument("--every", type=int, default=1, metavar="K",
                        help="every K-th matching test (a spread-out subset), before --limit")
    parser.add_argument("--timeout", type=float,
                        help="seconds per phase (eager, aot_eager, tpu); default: the test's timeout_seconds")
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT)
    common.add_worker_arguments(parser)
    args = parser.parse_args(argv)

    suite_dir = args.suite_dir.resolve()
    tests, xfails, stand_ins = import_suite(suite_dir)
    commit, commit_source = suite_commit(suite_dir)
    if commit != PINNED_COMMIT:
        print(f"warning: suite at {commit} ({commit_source}); this script is pinned to {PINNED_COMMIT}",
              file=sys.stderr)
    names = sorted(tests)
    if args.filter:
        names = [n for n in names if re.search(args.filter, n)]
    names = names[:: max(args.every, 1)]
    if args.limit is not None:
        names = names[: args.limit]
    tasks = [{"id": name, "phases": list(PHASES), "depends": {"aot_eager": "eager", "tpu": "eager"},
              "reference": ["eager"], "timeout": args.timeout or tests[name].timeout_seconds} for name in names]
    started = time.perf_counter()

    def progress(record: dict, done: int, total: int) -> None:
        phases = record["phases"]
        cells = " ".join(f"{p}={phases.get(p, {}).get('outcome', '?')}" for p in PHASES)
        note = next((phases[p].get("error", "") for p in ("tpu", "aot_eager", "eager")
                     if phases.get(p, {}).get("outcome") not in (None, common.PASS, common.SKIPPED)), "")
        seconds = sum(p.get("seconds", 0) for p in phases.values())
        print(f"[{done}/{total}] {record['id']}: {cells} {seconds:.1f}s {note[:160]}", flush=True)

    with common.scratch_dir(args.keep_logs) as scratch:
        env = common.worker_env(scratch, args)
        env[SUITE_ENV] = str(suite_dir)
        records = common.run_tasks(tasks, [sys.executable, str(Path(__file__).resolve()), "--worker"],
                                   jobs=args.jobs, chunk=args.chunk, env=env, workdir=scratch / "logs",
                                   timeout=args.timeout or 120.0, progress=progress)
    summary = summarise(records, xfails)
    meta = {
        **common.environment(),
        "suite": {"repository": "llvm/torch-mlir", "commit": commit, "commit_source": commit_source,
                  "pinned_commit": PINNED_COMMIT, "wheel_llvm_commit": WHEEL_LLVM_COMMIT,
                  "dir": str(suite_dir), "registered_tests": len(tests), "stand_ins": stand_ins},
        "selection": {"filter": args.filter, "limit": args.limit, "every": args.every, "tests": len(names),
                      "partial": bool(args.filter or args.limit is not None or args.every > 1)},
        "timeout": args.timeout, "jobs": args.jobs, "eager_kernels": args.eager_kernels,
        "seconds": round(time.perf_counter() - started, 1),
    }
    for name, members in xfails.items():
        for record in records.values():
            record.setdefault("in", [])
            if record["id"] in members:
                record["in"].append(name)
    common.finish(args.out, meta, summary, "tests", records, table(summary), f"{len(names)} tests")


if __name__ == "__main__":
    main()
