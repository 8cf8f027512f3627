"""Run PyTorch's whole OpInfo database through backend="tpu" and compare with eager.

For every OpInfo entry and dtype (float32 by default; bfloat16, float16, int64 and
complex64 on request) every usable sample (``--samples N``: the first N) runs in eager and
compiled, each compiled run with a fresh ``cache_dir``; the script prints
pass %, mismatches, backend errors, crashes and the % of ops that ran fully
lowered (no eager fallback), and writes the per-op results as JSON.

Ops run in worker subprocesses, a chunk at a time (:mod:`sweep_common`), so a
crash (a native abort in torch-mlir or XLA) is counted against the sample that
was running, and a fresh worker goes on with the op's next sample; a sample
past ``--timeout`` is killed and counted as ``timeout``.

    python benchmarks/opinfo_sweep.py --dtypes float32 bfloat16 int64 --out sweep.json
    python benchmarks/opinfo_sweep.py --ops add mul nn.functional.conv2d --samples 3

Outcomes per (op, dtype, sample):
  pass       compiled matches eager (tolerances of tests/test_ops.py); for a
             bfloat16/float16 output that misses them, the op computed in
             float32 on the same inputs decides: pass when compiled is no
             further from it than eager plus one ulp (with a ``note``)
  mismatch   compiled ran and returned different numbers: a bug
  error      the backend raised (Dynamo's own unsupported-feature errors are
             counted separately as ``dynamo_error``, not against the backend)
  crash      the worker process died
  timeout    the sample ran past ``--timeout``
  skipped    eager itself fails on the sample (such samples are dropped before
             they run; an op with no usable sample at all is ``skipped``)
  random / nondeterministic
             eager itself gives different results under another seed, or
             twice under one (uninitialized memory): no reference to compare
             with, so these are excluded from pass %, as in Inductor's sweeps;
             a compiled sample that differs from eager but matches it once its
             random ops draw from torch's generator (``fallback_random=True``)
             is ``random`` too, with a ``note``

An op's outcome is its worst sample's (crash, mismatch, error, timeout,
dynamo_error, then pass, random, nondeterministic, skipped); ``samples`` and
``sample_outcomes`` give the per-sample counts, ``failures`` the first failing
samples.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Optional

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from benchmarks import sweep_common as common  # noqa: E402

DTYPES = ("float32", "bfloat16", "float16", "int64", "complex64")
# Worst first: an op's outcome is that of its worst sample.
RANDOM_PROBE_SEEDS = (1, 2, 3)
"""Seeds eager runs a sample under besides 0 to see whether it draws random
numbers. One was not enough: ``fractional_max_pool3d``'s windows gave the same
output under seeds 0 and 1 in 12 of 48 samples (3 distinct outputs over 8
seeds), so the device's own draws (``fallback_random=False``) looked like a mismatch."""
RANK = ("crash", "mismatch", "error", "timeout", "dynamo_error", "pass", "random", "nondeterministic", "skipped")
ALL_SAMPLES = 10**9
UNINITIALIZED_OUTPUTS = frozenset({"empty", "empty_like", "empty_strided", "empty_permuted", "new_empty",
                                   "new_empty_strided"})
"""Ops whose results are uninitialized memory: no reference, whatever two eager runs happen to show."""


# ---------------------------------------------------------------- worker


def _test_ops():
    sys.path.insert(0, str(ROOT / "tests"))
    import test_ops

    return test_ops


def run_task(task: dict, log: common.WorkerLog) -> None:
    """One (op, dtype): every chosen sample is a phase ``sample<i>``."""
    import torch

    import tpu_inductor.report as report

    test_ops = _test_ops()
    dtype_name, name = task["dtype"], task["op"]
    dtype = getattr(torch, dtype_name)
    op = test_ops.opinfos()[name]
    try:
        chosen = list(test_ops.samples(op, dtype, count=task["samples"] or ALL_SAMPLES))
    except Exception as exc:  # noqa: BLE001 - OpInfo sample generators can fail for a dtype
        chosen = []
        log.info(note=f"samples: {type(exc).__name__}")
    log.info(samples=len(chosen))
    for index, sample in enumerate(chosen):
        phase = f"sample{index}"
        if not log.wants(phase):
            continue
        with log.phase(phase) as result:
            if name in UNINITIALIZED_OUTPUTS:
                result["outcome"] = "nondeterministic"
                continue
            torch._dynamo.reset()
            report.reset()
            fn, tensors = test_ops.as_function(op, sample)
            try:
                expected = _eager(fn, tensors, seed=0)
                if not _same(expected, _eager(fn, tensors, seed=0)):
                    result["outcome"] = "nondeterministic"  # uninitialized memory
                    continue
                if any(not _same(expected, _eager(fn, tensors, seed=seed)) for seed in RANDOM_PROBE_SEEDS):
                    result["outcome"] = "random"  # depends on the generator
                    continue
            except Exception:  # noqa: BLE001
                result["outcome"] = "skipped"
                continue
            try:
                actual = _compiled(fn, tensors)
            except Exception as exc:  # noqa: BLE001
                described = common.describe(exc)
                result["outcome"] = "dynamo_error" if described["error_kind"] == "dynamo" else "error"
                result["error"] = described["error"][:300]
                result["sample"] = _describe_sample(sample)
                continue
            facts = common.backend_facts()
            try:
                test_ops.assert_matches(actual, expected)
            except Exception as exc:  # noqa: BLE001
                if _matches_on_torchs_generator(fn, tensors, expected):
                    result["outcome"] = "random"  # the device's draws, not torch's
                    result["note"] = "matches eager with fallback_random=True"
                    continue
                closer = _as_close_to_float32_as_eager(fn, tensors, actual, expected)
                if closer is not None:
                    result.update(outcome="pass", fallbacks=facts["fallbacks"], islands=facts["islands"],
                                  note=closer)
                    continue
                lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
                result["outcome"] = "mismatch"
                result["error"] = " ".join(lines[:4])[:300] if lines else type(exc).__name__
                result["sample"] = _describe_sample(sample)
                continue
            result.update(outcome="pass", fallbacks=facts["fallbacks"], islands=facts["islands"])


def _matches_on_torchs_generator(fn, tensors, expected) -> bool:
    """Whether the compiled sample matches eager when its random ops draw from
    torch's generator (``fallback_random=True``) instead of the device's.

    Ops such as ``svd_lowrank`` draw a random projection, and yet eager gives
    the same result under every seed, up to the sign of a singular vector,
    which the projection decides: the device's own draws flip a sign that
    torch's never did. ``fallback_random`` changes random ops only, so a
    graph with none compiles to the same program and mismatches again.
    """
    import torch

    torch._dynamo.reset()
    try:
        actual = _compiled(fn, tensors, fallback_random=True)
    except Exception:  # noqa: BLE001
        return False
    return _same(actual, expected)


def _as_close_to_float32_as_eager(fn, tensors, actual, expected) -> Optional[str]:
    """For bfloat16/float16 outputs that miss eager's tolerance: ``sweep_common.float32_verdict``
    against the op computed in float32 on the same inputs (None when it has no
    float32 kernel for this sample).

    Eager's kernels compute half-precision ops in float32 and round once, as the
    device does (lowering/half_floats_in_float32.py), but their float32 steps
    differ (oneDNN's convolution, a batch norm's statistics), and in float16's
    sweep eager was the further from float32 in 13 of its 14 misses (up to
    8,500 ulps: ``grid_sampler_2d``), or overflowed where float32 did not
    (``soft_margin_loss``'s ``inf``).
    """
    try:
        in_float32 = _eager(fn, common.upcast_half(list(tensors)), seed=0)
    except Exception:  # noqa: BLE001 - an op with no float32 kernel for this sample
        return None
    return common.float32_verdict(actual, expected, in_float32)


def _compiled(fn, tensors, **options):
    """``fn`` compiled with backend="tpu" (a fresh cache directory, the sweep's
    options and ``options``) and called once on copies of ``tensors``, seed 0."""
    import torch

    with common.fresh_cache_dir() as cache_dir:
        compiled = torch.compile(fn, backend="tpu", options={**common.tpu_options(cache_dir), **options},
                                 dynamic=False)
        torch.manual_seed(0)
        with _test_ops().plain_opinfo_calls():
            return compiled(*[t.clone() for t in tensors])


def _describe_sample(sample) -> str:
    """``input (2, 3) float32, args (...), kwargs {...}`` with tensors as shape and dtype."""
    import torch
    from torch.utils._pytree import tree_map

    def short(value):
        if isinstance(value, torch.Tensor):
            return f"T{tuple(value.shape)}:{str(value.dtype).replace('torch.', '')}"
        return value

    text = f"input {short(sample.input)}, args {tree_map(short, sample.args)}, kwargs {tree_map(short, sample.kwargs)}"
    return text[:300]


def _eager(fn, tensors, seed: int):
    import torch

    test_ops = _test_ops()
    torch.manual_seed(seed)
    with test_ops.plain_opinfo_calls():
        return fn(*[t.clone() for t in tensors])


def _same(a, b) -> bool:
    try:
        _test_ops().assert_matches(a, b)
    except AssertionError:
        return False
    return True


def _all_op_ids() -> list[str]:
    return sorted(_test_ops().opinfos())


# ---------------------------------------------------------------- parent


def op_result(record: dict, name: str, dtype: str) -> dict:
    """The per-op entry of the JSON (the format the sweep always wrote), from the samples' phases."""
    phases = record["phases"]
    info = record.get("info", {})
    indexed = sorted(((int(p[len("sample"):]), r) for p, r in phases.items() if p.startswith("sample")))
    result: dict = {"op": name, "dtype": dtype}
    if "setup" in phases:  # the worker died while generating the samples
        indexed.append((-1, phases["setup"]))
    outcomes = [r.get("outcome", "error") for _, r in indexed]
    result["outcome"] = min(outcomes, key=RANK.index) if outcomes else "skipped"
    worst = next((r for _, r in indexed if r.get("outcome") == result["outcome"]), {})
    if worst.get("error"):
        result["error"] = worst["error"]
    if info.get("note"):
        result["note"] = info["note"]
    passed = [r for _, r in indexed if r.get("outcome") == "pass"]
    judged_against_float32 = [r["note"] for r in passed if r.get("note")]
    if judged_against_float32:  # half-precision samples outside eager's tolerance
        result["passed_against_float32"] = len(judged_against_float32)
        result.setdefault("note", judged_against_float32[0])
    if result["outcome"] == "pass" or passed:
        result["fallbacks"] = sorted({f for r in passed for f in r.get("fallbacks", [])})
        result["islands"] = sum(r.get("islands", 0) for r in passed)
    result["samples"] = len(indexed)
    result["sample_outcomes"] = dict(Counter(outcomes))
    failures = [{"sample": i, "outcome": r.get("outcome"), "error": r.get("error", ""),
                 **({"input": r["sample"]} if r.get("sample") else {})}
                for i, r in indexed if r.get("outcome") in ("crash", "mismatch", "error", "timeout")]
    if failures:
        result["failures"] = failures[:5]
    result["seconds"] = round(sum(r.get("seconds", 0) for _, r in indexed), 3)
    return result


def summarise(results: dict[str, dict]) -> dict:
    outcomes = Counter(r["outcome"] for r in results.values())
    excluded = ("skipped", "dynamo_error", "random", "nondeterministic")
    ran = [r for r in results.values() if r["outcome"] not in excluded]
    passed = [r for r in ran if r["outcome"] == "pass"]
    lowered = [r for r in passed if not r.get("fallbacks")]
    samples = Counter()
    for r in results.values():
        samples.update(r.get("sample_outcomes", {}))
    return {
        "ops": len(results),
        "ran": len(ran),
        "pass": len(passed),
        "pass_pct": round(100 * len(passed) / max(len(ran), 1), 2),
        "mismatch": outcomes["mismatch"],
        "error": outcomes["error"],
        "crash": outcomes["crash"],
        "timeout": outcomes["timeout"],
        "dynamo_error": outcomes["dynamo_error"],
        "skipped": outcomes["skipped"],
        "random_or_nondeterministic": outcomes["random"] + outcomes["nondeterministic"],
        "fully_lowered_pct": round(100 * len(lowered) / max(len(passed), 1), 2),
        "passed_against_float32": sum(1 for r in passed if r.get("passed_against_float32")),
        "samples": sum(samples.values()),
        "sample_outcomes": dict(samples),
    }


def table(report: dict) -> str:
    header = ["dtype", "ran", "pass", "mismatch", "backend error", "crash", "timeout", "fully lowered (of passing)",
              "samples (passing)"]
    rows = []
    for dtype, entry in report.items():
        s = entry["summary"]
        rows.append([dtype, s["ran"], f"**{s['pass']} ({s['pass_pct']:g}%)**", s["mismatch"], s["error"], s["crash"],
                     s["timeout"], f"{s['fully_lowered_pct']:.1f}%",
                     f"{s['samples']} ({s['sample_outcomes'].get('pass', 0)})"])
    return common.markdown_table(header, rows)


def _results(records: dict[str, dict], dtype: str) -> dict[str, dict]:
    """The per-op entries of ``records`` (keyed ``<dtype>/<op>``), in their order."""
    return {task_id.split("/", 1)[1]: op_result(record, task_id.split("/", 1)[1], dtype)
            for task_id, record in records.items()}


def _write(out: Path, report: dict) -> None:
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(report, indent=1))


def _write_partial(out: Path, report: dict, dtype: str, finished: dict[str, dict]) -> None:
    """The results so far, marked partial, at ``out`` (a stopped sweep keeps them)."""
    results = _results(finished, dtype)
    _write(out, {**report, dtype: {"summary": summarise(results), "results": results,
                                   "meta": {**common.environment(), "partial": True}}})


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "--worker":
        common.worker_main(sys.argv[2:], run_task)
        return
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dtypes", nargs="+", default=["float32"], choices=DTYPES)
    parser.add_argument("--ops", nargs="*", help="OpInfo ids to run (default: all)")
    parser.add_argument("--samples", type=int, default=0, help="samples per op (default 0: every usable sample)")
    parser.add_argument("--timeout", type=float, default=300, help="seconds per sample")
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results" / "opinfo_sweep.json")
    common.add_worker_arguments(parser)
    parser.set_defaults(chunk=60)
    args = parser.parse_args()

    op_ids = args.ops or _all_op_ids()
    report = {}
    with common.scratch_dir(args.keep_logs) as scratch:
        env = common.worker_env(scratch, args)
        for dtype in args.dtypes:
            started = time.perf_counter()
            tasks = [{"id": f"{dtype}/{name}", "op": name, "dtype": dtype, "samples": args.samples,
                      "timeout": args.timeout} for name in op_ids]

            finished: dict[str, dict] = {}

            def progress(record: dict, done: int, total: int, dtype: str = dtype) -> None:
                finished[record["id"]] = record
                if done % 20 == 0 or done == total:
                    print(f"  {dtype}: {done}/{total} ops", file=sys.stderr, flush=True)
                    # A long sweep keeps what it has measured if it is stopped.
                    _write_partial(args.out, report, dtype, finished)

            records = common.run_tasks(tasks, [sys.executable, str(Path(__file__).resolve()), "--worker"],
                                       jobs=args.jobs, chunk=args.chunk, env=env, workdir=scratch / f"logs-{dtype}",
                                       timeout=args.timeout, progress=progress)
            results = _results(records, dtype)
            summary = summarise(results)
            summary["seconds"] = round(time.perf_counter() - started, 1)
            report[dtype] = {"summary": summary, "results": results,
                             "meta": {**common.environment(), "samples_per_op": args.samples or "all",
                                      "timeout": args.timeout, "eager_kernels": args.eager_kernels,
                                      "partial": bool(args.ops)}}
            print(f"\n== {dtype}: {json.dumps(summary)}")
            problems = [r for r in results.values() if r["outcome"] in ("mismatch", "error", "crash", "timeout")]
            for r in sorted(problems, key=lambda r: r["op"]):
                failing = sum(r["sample_outcomes"].get(o, 0) for o in ("mismatch", "error", "crash", "timeout"))
                print(f"  {r['outcome']:9} {r['op']} ({failing} of {r['samples']} samples): {r.get('error', '')[:160]}")
            fallback_ops = Counter(op for r in results.values() for op in r.get("fallbacks", []))
            print("  most common eager fallbacks:", fallback_ops.most_common(12))
    _write(args.out, report)
    print()
    print(table(report))
    print(f"\nwrote {args.out}")


if __name__ == "__main__":
    main()
