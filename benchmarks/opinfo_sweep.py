"""Run PyTorch's whole OpInfo database through backend="tpu" and compare with eager.

For every OpInfo entry and dtype (float32 by default; bfloat16 and int64 on
request) the first usable sample runs in eager and compiled; the script prints
pass %, mismatches, backend errors, crashes and the % of ops that ran fully
lowered (no eager fallback), and writes the per-op results as JSON.

Ops run in worker subprocesses, a chunk at a time, so a crash (a native abort
in torch-mlir or XLA) is counted against its op and the sweep goes on.

    python benchmarks/opinfo_sweep.py --dtypes float32 bfloat16 int64 --out sweep.json

Outcomes per (op, dtype):
  pass       compiled matches eager (tolerances of tests/test_ops.py)
  mismatch   compiled ran and returned different numbers: a bug
  error      the backend raised (Dynamo's own unsupported-feature errors are
             counted separately as ``dynamo_error``, not against the backend)
  crash      the worker process died
  skipped    no usable sample, or eager itself fails on every sample
  random / nondeterministic
             eager itself gives different results under another seed, or
             twice under one (uninitialized memory): no reference to compare
             with, so these are excluded from pass %, as in Inductor's sweeps
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DTYPES = ("float32", "bfloat16", "int64")


def _worker(op_ids: list[str], dtype_name: str, out_path: Path, samples_per_op: int) -> None:
    """Run ``op_ids`` for one dtype, appending one JSON line per op to ``out_path``."""
    sys.path.insert(0, str(ROOT / "tests"))
    import torch

    import tpu_inductor.report as report
    from test_ops import as_function, assert_matches, opinfos, plain_opinfo_calls, samples

    dtype = getattr(torch, dtype_name)
    options = {"cache": False, "eager_kernels": False}  # claims are about lowering
    with out_path.open("a") as out:
        for name in op_ids:
            # The "started" line lets the parent blame a crash on this op.
            out.write(json.dumps({"op": name, "dtype": dtype_name, "started": True}) + "\n")
            out.flush()
            result = {"op": name, "dtype": dtype_name}
            op = opinfos()[name]
            started = time.perf_counter()
            try:
                chosen = list(samples(op, dtype, count=samples_per_op))
            except Exception as exc:  # OpInfo sample generators can fail for a dtype
                chosen, result["note"] = [], f"samples: {type(exc).__name__}"
            if not chosen:
                result["outcome"] = "skipped"
            for sample in chosen:
                torch._dynamo.reset()
                report.reset()
                fn, tensors = as_function(op, sample)
                try:
                    expected = _eager(fn, tensors, seed=0)
                    if not _same(expected, _eager(fn, tensors, seed=0)):
                        result["outcome"] = "nondeterministic"  # uninitialized memory
                        break
                    if not _same(expected, _eager(fn, tensors, seed=1)):
                        result["outcome"] = "random"  # depends on the generator
                        break
                except Exception:
                    result["outcome"] = "skipped"
                    continue
                compiled = torch.compile(fn, backend="tpu", options=options, dynamic=False)
                try:
                    torch.manual_seed(0)
                    with plain_opinfo_calls():
                        actual = compiled(*[t.clone() for t in tensors])
                except Exception as exc:
                    is_dynamo = "torch._dynamo.exc" in type(exc).__module__ and "BackendCompilerFailed" not in type(exc).__name__
                    result["outcome"] = "dynamo_error" if is_dynamo else "error"
                    result["error"] = f"{type(exc).__name__}: {str(exc).splitlines()[0][:300] if str(exc) else ''}"
                    break
                try:
                    assert_matches(actual, expected)
                except Exception as exc:
                    result["outcome"] = "mismatch"
                    result["error"] = str(exc).splitlines()[0][:300] if str(exc) else type(exc).__name__
                    break
                record = report.current()
                result["outcome"] = "pass"
                fallbacks = sorted({f.op for f in record.fallbacks()})
                result["fallbacks"] = sorted(set(result.get("fallbacks", [])) | set(fallbacks))
                result["islands"] = result.get("islands", 0) + len(record.islands())
            result["seconds"] = round(time.perf_counter() - started, 3)
            out.write(json.dumps(result) + "\n")
            out.flush()


def _eager(fn, tensors, seed: int):
    import torch
    from test_ops import plain_opinfo_calls

    torch.manual_seed(seed)
    with plain_opinfo_calls():
        return fn(*[t.clone() for t in tensors])


def _same(a, b) -> bool:
    from test_ops import assert_matches

    try:
        assert_matches(a, b)
    except AssertionError:
        return False
    return True


def _all_op_ids() -> list[str]:
    sys.path.insert(0, str(ROOT / "tests"))
    from test_ops import opinfos

    return sorted(opinfos())


def _run_dtype(op_ids: list[str], dtype: str, workdir: Path, chunk: int, samples: int, timeout: float) -> dict:
    """Run every op for ``dtype`` in subprocess chunks; restart past crashes."""
    results: dict[str, dict] = {}
    pending = list(op_ids)
    while pending:
        batch, pending = pending[:chunk], pending[chunk:]
        log = workdir / f"{dtype}-{len(results)}.jsonl"
        log.unlink(missing_ok=True)
        command = [sys.executable, __file__, "--worker", dtype, str(log), str(samples), *batch]
        env = {**os.environ, "TPU_INDUCTOR_CACHE": "0"}
        try:
            subprocess.run(command, env=env, timeout=timeout, capture_output=True, check=False)
        except subprocess.TimeoutExpired:
            pass
        started_last = None
        for line in log.read_text().splitlines() if log.exists() else []:
            entry = json.loads(line)
            if entry.get("started"):
                started_last = entry["op"]
            else:
                results[entry["op"]] = entry
                started_last = None
        if started_last is not None:
            results[started_last] = {"op": started_last, "dtype": dtype, "outcome": "crash"}
        done = set(results)
        pending = [name for name in batch if name not in done] + pending
        print(f"  {dtype}: {len(results)}/{len(op_ids)} ops", file=sys.stderr, flush=True)
    return results


def summarise(results: dict[str, dict]) -> dict:
    outcomes = Counter(r["outcome"] for r in results.values())
    excluded = ("skipped", "dynamo_error", "random", "nondeterministic")
    ran = [r for r in results.values() if r["outcome"] not in excluded]
    passed = [r for r in ran if r["outcome"] == "pass"]
    lowered = [r for r in passed if not r.get("fallbacks")]
    return {
        "ops": len(results),
        "ran": len(ran),
        "pass": len(passed),
        "pass_pct": round(100 * len(passed) / max(len(ran), 1), 2),
        "mismatch": outcomes["mismatch"],
        "error": outcomes["error"],
        "crash": outcomes["crash"],
        "dynamo_error": outcomes["dynamo_error"],
        "skipped": outcomes["skipped"],
        "random_or_nondeterministic": outcomes["random"] + outcomes["nondeterministic"],
        "fully_lowered_pct": round(100 * len(lowered) / max(len(passed), 1), 2),
    }


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "--worker":
        _, _, dtype, out, samples, *ops = sys.argv
        _worker(ops, dtype, Path(out), int(samples))
        return
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dtypes", nargs="+", default=["float32"], choices=DTYPES)
    parser.add_argument("--ops", nargs="*", help="OpInfo ids to run (default: all)")
    parser.add_argument("--samples", type=int, default=1, help="samples per op")
    parser.add_argument("--chunk", type=int, default=60, help="ops per worker process")
    parser.add_argument("--timeout", type=float, default=1800, help="seconds per worker")
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results" / "opinfo_sweep.json")
    args = parser.parse_args()

    op_ids = args.ops or _all_op_ids()
    workdir = args.out.parent / "opinfo_logs"
    workdir.mkdir(parents=True, exist_ok=True)
    report = {}
    for dtype in args.dtypes:
        started = time.perf_counter()
        results = _run_dtype(op_ids, dtype, workdir, args.chunk, args.samples, args.timeout)
        summary = summarise(results)
        summary["seconds"] = round(time.perf_counter() - started, 1)
        report[dtype] = {"summary": summary, "results": results}
        print(f"\n== {dtype}: {json.dumps(summary)}")
        problems = [r for r in results.values() if r["outcome"] in ("mismatch", "error", "crash")]
        for r in sorted(problems, key=lambda r: r["op"]):
            print(f"  {r['outcome']:9} {r['op']}: {r.get('error', '')[:160]}")
        fallback_ops = Counter(op for r in results.values() for op in r.get("fallbacks", []))
        print("  most common eager fallbacks:", fallback_ops.most_common(12))
    args.out.write_text(json.dumps(report, indent=1))
    print(f"\nwrote {args.out}")


if __name__ == "__main__":
    main()
