"""Sweep Hugging Face architectures through backend="tpu" and compare with eager.

Why: the op suite says which ATen ops lower; this says how many real models
run, match eager and stay on the device. Every architecture in transformers'
base-model and causal-LM registries is built tiny with random weights
(:mod:`benchmarks.hf_zoo`, no downloads), run in eager and under
``torch.compile(backend="tpu")`` on the same inputs, and counted:

    tried -> built -> ran in eager -> ran under tpu -> matched eager
                                                    -> fully lowered (no eager fallback)

Percentages are of the architectures that run in eager (a model eager
cannot run says nothing about the backend). Causal LMs also take one SGD
training step (labels = input_ids) whose loss and parameter gradients must
match eager. Each (architecture, head, mode) runs in its own subprocess with a
timeout, so a native crash or a hang is counted, not fatal.

    python benchmarks/models.py --only gpt2,bert,vit --heads base,causal_lm
    python benchmarks/models.py -j 2 --timeout 120 --write-docs
    python benchmarks/models.py --dtype bfloat16 --heads causal_lm -j 2 --write-docs

``--dtype bfloat16`` (or ``float16``) builds each model and its floating
inputs in that dtype. Eager's and the device's roundings then differ in
order, so an output matches when it passes PyTorch's own accuracy check for
Inductor's benchmarks against the model run in float64 on the same
(upcast) weights, held relative to each tensor's size where eager resolves
it (``hf_zoo.compare_against_float64``; tolerance 1e-3 for inference and
1e-2 for a training step, the defaults of PyTorch's Hugging Face benchmark
suite). Results in ``models-<dtype>.json`` and their own table.

Failures are grouped by root cause: the innermost exception's type and first
line with numbers, shapes, addresses and quoted names normalised away; models
that ran but not fully lowered are grouped by the op that fell back.
"""

from __future__ import annotations

import argparse
import collections
import concurrent.futures
import copy
import json
import os
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Optional

ROOT = Path(__file__).resolve().parent.parent
RESULTS_PAGE = ROOT / "docs" / "coverage.md"
TOLERANCE = dict(rtol=1e-4, atol=1e-4)
HALF_PRECISION_TOL = {"inference": 1e-3, "train": 1e-2}
"""``same``'s tolerance for a half-precision run (PyTorch's Hugging Face
benchmark suite: ``get_tolerance_and_cosine_flag``'s defaults)."""
BARS = {"tpu_ran": 98.0, "matched": 97.0, "fully_lowered": 85.0}
TRAIN_BARS = {"tpu_ran": 95.0, "matched": 95.0}
STAGES = ("tried", "built", "eager", "tpu_ran", "matched", "fully_lowered")


# ---------------------------------------------------------------- child process


def _root_cause(exc: BaseException) -> BaseException:
    """The innermost exception: Dynamo wraps the backend's error in its own."""
    while exc.__cause__ is not None and exc.__cause__ is not exc:
        exc = exc.__cause__
    return exc


def _describe(exc: BaseException) -> str:
    root = _root_cause(exc)
    from benchmarks.hf_zoo import first_line

    return f"{type(root).__name__}: {first_line(root)}"[:500]


def _backend_facts() -> dict[str, Any]:
    """What the backend did during the compiled call: fallbacks, graph breaks, islands."""
    import tpu_inductor.report as report

    current = report.current()
    return {
        "graphs": len(current.graphs),
        "islands": len(current.islands()),
        "fallbacks": sorted({f"{f.op}: {f.reason}" for f in current.fallbacks()}),
        "fallback_ops": sorted({f.op for f in current.fallbacks()}),
        "graph_breaks": len(current.graph_breaks),
        "graph_break_reasons": sorted({b.reason for b in current.graph_breaks}),
        "graph_break_sources": sorted({str(b.source) for b in current.graph_breaks})[:5],
    }


def default_out(dtype: str) -> Path:
    suffix = "" if dtype == "float32" else f"-{dtype}"
    return ROOT / "benchmarks" / "results" / f"models{suffix}.json"


def _markers(dtype: str) -> tuple[str, str]:
    name = "models" if dtype == "float32" else f"models-{dtype}"
    return f"<!-- {name}-table:start -->", f"<!-- {name}-table:end -->"


def _eager_inputs(built: Any, train: bool, seed: int) -> tuple[Optional[dict], Optional[str]]:
    """The first candidate input dict eager accepts (its floating tensors in the
    model's dtype), or the last eager error."""
    import torch

    from benchmarks.hf_zoo import cast_floats, input_candidates

    dtype = next(built.model.parameters()).dtype
    error = "skipped: inputs (no candidate for main input " f"{getattr(built.model, 'main_input_name', '?')!r})"
    for inputs in input_candidates(built.model, built.config, seed=seed, labels=train):
        inputs = cast_floats(inputs, dtype)
        try:
            with torch.no_grad():
                output = built.model(**inputs)
            if train and (not isinstance(output, dict) or output.get("loss") is None):
                error = "no loss from labels"
                continue
            return inputs, None
        except Exception as exc:
            error = _describe(exc)
    return None, error


def _float64_reference(record: dict, model: Any, inputs: dict, run: Any) -> Any:
    """``run(model, inputs)`` on copies in float64 (the weights upcast exactly),
    or in float32 where a kernel has no float64 (``_grouped_mm``, which MoE
    experts call; float32's rounding is 2^16 times finer than bfloat16's), or
    None when the model runs in neither (the record says why)."""
    import torch

    from benchmarks.hf_zoo import cast_floats

    errors = []
    for dtype in (torch.float64, torch.float32):
        try:
            torch.manual_seed(0)
            reference = run(copy.deepcopy(model).to(dtype), cast_floats(inputs, dtype))
        except Exception as exc:
            errors.append(f"{dtype}: {_describe(exc)}")
            continue
        if errors:
            record["reference"] = f"float32 ({errors[0]})"
        return reference
    record["float64_error"] = "; ".join(errors)
    return None


def _judge(record: dict, mode: str, expected: Any, actual: Any, float64: Any) -> list[str]:
    """Mismatches of ``actual`` against eager's ``expected``: at float32's
    tolerance, or for a half-precision run against the float64 reference."""
    from benchmarks.hf_zoo import compare, compare_against_float64

    if record["dtype"] == "float32":
        return compare(expected, actual, **TOLERANCE)
    if float64 is None:
        return [f"no float64 reference: {record['float64_error']}"]
    problems, ratios = compare_against_float64(expected, actual, float64, HALF_PRECISION_TOL[mode])
    if ratios:
        record["float64_error_ratio"] = {"median": statistics.median(ratios.values()), "max": max(ratios.values())}
    return problems


def _run_inference(record: dict, model: Any, inputs: dict) -> None:
    import torch

    import tpu_inductor.report as report

    def infer(module: Any, kwargs: dict) -> Any:
        with torch.no_grad():
            return module(**kwargs)

    # Every path starts from the same seed, so a random op (ViLT samples image
    # patches with multinomial) draws the same numbers.
    torch.manual_seed(0)
    expected = infer(model, inputs)
    float64 = None if record["dtype"] == "float32" else _float64_reference(record, model, inputs, infer)
    torch._dynamo.reset()
    report.reset()
    compiled = torch.compile(model, backend="tpu", options={"cache": False})
    torch.manual_seed(0)
    try:
        with torch.no_grad():
            actual = compiled(**inputs)
    finally:
        record.update(_backend_facts())
    record["status"] = "ran"
    record["mismatches"] = _judge(record, "inference", expected, actual, float64)[:10]


def _run_train(record: dict, model: Any, inputs: dict) -> None:
    import torch

    import tpu_inductor.report as report
    from benchmarks.hf_zoo import train_step

    # Identical weights on every path; each takes its own SGD step.
    # Every path starts from the same seed, so any op still random draws the same numbers.
    eager_model, tpu_model = copy.deepcopy(model), copy.deepcopy(model)
    torch.manual_seed(0)
    eager_loss, eager_grads = train_step(eager_model, inputs)
    float64 = None
    if record["dtype"] != "float32":
        float64 = _float64_reference(record, model, inputs, lambda m, kwargs: _loss_and_grads(train_step(m, kwargs)))
    torch._dynamo.reset()
    report.reset()
    compiled = torch.compile(tpu_model, backend="tpu", options={"cache": False})
    torch.manual_seed(0)
    try:
        loss, grads = train_step(tpu_model, inputs, call=compiled)
    finally:
        record.update(_backend_facts())
    record["status"] = "ran"
    problems = [f"grad {name}: missing under tpu" for name in eager_grads if name not in grads]
    problems += _judge(record, "train", _loss_and_grads((eager_loss, eager_grads)), _loss_and_grads((loss, grads)), float64)
    record["mismatches"] = problems[:10]


def _loss_and_grads(step: tuple[Any, dict]) -> dict:
    loss, grads = step
    return {"loss": loss, "grads": grads}


def child(model_type: str, head: str, mode: str, result: Path, seed: int, dtype: str = "float32") -> None:
    """Run one (architecture, head, mode); the record in ``result`` is rewritten
    after every stage so the parent knows how far a crash or timeout got."""
    import torch
    import transformers

    from benchmarks.hf_zoo import BuildError, build_candidates

    transformers.logging.set_verbosity_error()
    record: dict[str, Any] = {"model_type": model_type, "head": head, "mode": mode, "status": "building", "dtype": dtype}

    def save() -> None:
        result.write_text(json.dumps(record))

    save()
    started = time.perf_counter()
    train = mode == "train"
    inputs = None
    try:
        for built in build_candidates(model_type, head, seed=seed):
            built.model.to(getattr(torch, dtype))
            record.update(status="built", tier=built.tier, attn=built.attn_implementation, params=built.num_params)
            save()
            inputs, error = _eager_inputs(built, train, seed)
            if inputs is not None:
                break
            record["eager_error"] = error
            record.setdefault("rejected_tiers", []).append(f"{built.tier}: {error}")
    except BuildError as exc:
        record.update(status="build_failed", error=str(exc)[:1000])
    if inputs is None:
        if record["status"] == "built":
            skipped = record["eager_error"].startswith("skipped")
            record["status"] = "skipped_inputs" if skipped else "eager_failed"
        record["seconds"] = round(time.perf_counter() - started, 1)
        save()
        return
    record.pop("eager_error", None)  # an earlier tier's failure; rejected_tiers keeps it
    record.update(status="eager_ok", inputs=sorted(inputs))
    save()
    torch.manual_seed(seed)
    try:
        (_run_train if train else _run_inference)(record, built.model, inputs)
    except Exception as exc:
        record.update(status="tpu_failed", error=_describe(exc))
    record["seconds"] = round(time.perf_counter() - started, 1)
    save()


# ---------------------------------------------------------------- parent


def _run_task(task: tuple[str, str, str], timeout: float, seed: int, dtype: str) -> dict:
    model_type, head, mode = task
    with tempfile.TemporaryDirectory() as tmp:
        result = Path(tmp) / "result.json"
        command = [sys.executable, str(Path(__file__).resolve()), "--child", model_type, head, mode,
                   "--result", str(result), "--seed", str(seed), "--dtype", dtype]
        env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_VERBOSITY": "error",
               "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
        started = time.perf_counter()
        try:
            proc = subprocess.run(command, env=env, cwd=ROOT, capture_output=True, text=True, timeout=timeout)
            failure = None if proc.returncode == 0 else _crash(proc.returncode, proc.stderr)
        except subprocess.TimeoutExpired:
            failure = f"timeout: over {timeout:.0f} s"
        record = json.loads(result.read_text()) if result.exists() and result.stat().st_size else {}
    record = {"model_type": model_type, "head": head, "mode": mode, "status": "building", **record}
    if failure:
        # How far it got says which count the failure belongs to.
        record["error"] = failure
        record["status"] = {"eager_ok": "tpu_failed", "building": "build_failed", "built": "eager_failed"}.get(
            record["status"], record["status"])
    record["seconds"] = round(time.perf_counter() - started, 1)
    return record


_GLOG_INFO = re.compile(r"^[IW]\d{4} ")


def _crash(returncode: int, stderr: str) -> str:
    """``crash: SIGKILL (...)`` or ``crash: exit N: <last meaningful stderr line>``."""
    if returncode < 0:
        name = signal.Signals(-returncode).name
        # SIGKILL with no timeout is the kernel's OOM killer on these runners.
        hint = " (out of memory?)" if returncode == -signal.SIGKILL else ""
        return f"crash: {name}{hint}"
    # XLA's INFO/WARNING log lines say nothing about the failure.
    lines = [line for line in stderr.strip().splitlines() if line.strip() and not _GLOG_INFO.match(line)]
    return f"crash: exit {returncode}: {lines[-1][:300] if lines else ''}"


_NORMALISERS = [
    (re.compile(r"0x[0-9a-fA-F]+"), "<addr>"),
    (re.compile(r"torch\.Size\(\[[^\]]*\]\)"), "<shape>"),
    (re.compile(r"\[[\d,\s\-]*\d[\d,\s\-]*\]|\([\d,\s\-]*\d[\d,\s\-]*\)"), "<shape>"),
    # Model classes name the architecture, not the cause (``GPT2LMHeadModel does not ...``).
    (re.compile(r"\b[A-Z][A-Za-z0-9]*(Model|Config|Attention|Layer|Block|Encoder|Decoder|Embeddings?|MLP)\w*"), "<Class>"),
    (re.compile(r"'[^']*'|\"[^\"]*\""), "<name>"),
    (re.compile(r"/[\w./\-]+"), "<path>"),
    (re.compile(r"\b\d+(\.\d+)?(e-?\d+)?\b"), "<n>"),
    (re.compile(r"\s+"), " "),
]


def normalise(message: str) -> str:
    """One error message per root cause: shapes, ids, names and numbers removed."""
    for pattern, replacement in _NORMALISERS:
        message = pattern.sub(replacement, message)
    return message.strip()[:200]


def _causes(record: dict) -> list[tuple[str, str]]:
    """(category, normalised cause) pairs this record contributes to the failure tables."""
    status = record["status"]
    if status in ("build_failed", "eager_failed", "skipped_inputs"):
        text = record.get("error") or record.get("eager_error") or ""
        return [(f"harness: {status}", normalise(text.split(";")[0]))]
    if status == "tpu_failed":
        return [("backend: tpu failed", normalise(record.get("error", "")))]
    out = []
    if record.get("mismatches"):
        # The first differing tensor names the cause: an output field, the loss or the gradients.
        first = record["mismatches"][0].split(":")[0]
        if record["mode"] == "train":
            first = "out.loss" if first == "out.loss" else "gradients"
        out.append(("backend: mismatch", re.sub(r"\[\d+\]", "[i]", first) + " differs"))
    out += [("backend: fallback op", op) for op in record.get("fallback_ops", [])]
    # The reason groups fallbacks whose cause is not the op (torch-mlir running
    # out of memory on a whole island sends every op in it to eager).
    reasons = {normalise(f.split(": ", 1)[-1]) for f in record.get("fallbacks", [])}
    out += [("backend: fallback reason", reason) for reason in sorted(reasons)]
    out += [("backend: graph break", normalise(r)) for r in record.get("graph_break_reasons", [])]
    return out


def _reached(record: dict) -> dict[str, bool]:
    ran = record["status"] == "ran"
    return {
        "tried": True,
        "built": record["status"] not in ("build_failed", "building"),
        "eager": record["status"] in ("eager_ok", "ran", "tpu_failed"),
        "tpu_ran": ran,
        "matched": ran and not record.get("mismatches"),
        "fully_lowered": ran and not record.get("fallback_ops"),
    }


def summarise(records: list[dict]) -> dict[str, Any]:
    """Counts per (head, mode), % of eager-running models, graph breaks and top causes."""
    groups: dict[str, dict[str, Any]] = {}
    for record in records:
        key = f"{record['head']}/{record['mode']}"
        group = groups.setdefault(key, {**{s: 0 for s in STAGES}, "graph_break_models": 0, "graph_breaks": 0})
        for stage, reached in _reached(record).items():
            group[stage] += reached
        group["graph_break_models"] += bool(record.get("graph_breaks"))
        group["graph_breaks"] += record.get("graph_breaks", 0)
    for key, group in groups.items():
        eager = group["eager"] or 1
        group["percent"] = {s: round(100.0 * group[s] / eager, 1) for s in ("tpu_ran", "matched", "fully_lowered")}
    causes: dict[str, collections.Counter] = collections.defaultdict(collections.Counter)
    examples: dict[tuple[str, str], list[str]] = collections.defaultdict(list)
    for record in records:
        for category, cause in _causes(record):
            causes[category][cause] += 1
            examples[category, cause].append(f"{record['model_type']}/{record['head']}/{record['mode']}")
    top = {
        category: [{"cause": c, "count": n, "examples": examples[category, c][:3]} for c, n in counter.most_common(15)]
        for category, counter in sorted(causes.items())
    }
    return {"groups": groups, "causes": top}


def _bars(key: str) -> dict[str, float]:
    return TRAIN_BARS if key.endswith("/train") else BARS


def _format_row(key: str, group: dict) -> list[str]:
    cells = [key, str(group["tried"]), str(group["built"]), str(group["eager"])]
    for stage in ("tpu_ran", "matched", "fully_lowered"):
        percent = group["percent"][stage]
        bar = _bars(key).get(stage)
        mark = "" if bar is None else (" ✓" if percent >= bar else f" (bar {bar:.0f}%)")
        cells.append(f"{group[stage]} ({percent:.1f}%){mark}")
    cells.append(str(group["graph_break_models"]))
    return cells


HEADER = ["head/mode", "tried", "built", "ran in eager", "ran under tpu", "matched eager", "fully lowered",
          "models with graph breaks"]


def print_summary(summary: dict) -> None:
    rows = [HEADER] + [_format_row(k, g) for k, g in sorted(summary["groups"].items())]
    widths = [max(len(r[i]) for r in rows) for i in range(len(HEADER))]
    for row in rows:
        print("  ".join(cell.ljust(w) for cell, w in zip(row, widths)))
    print("(percentages of the models that run in eager)")
    for category, items in summary["causes"].items():
        print(f"\n{category}:")
        for item in items[:10]:
            print(f"  {item['count']:4d}  {item['cause']}   e.g. {', '.join(item['examples'][:2])}")


def _scope(args: argparse.Namespace, tasks: list[tuple[str, str, str]]) -> str:
    """What a partial sweep covered, in words a reader of docs/coverage.md can check."""
    from benchmarks.hf_zoo import architectures

    if args.only:
        return f"architectures {args.only}; heads {args.heads}; modes {args.modes}"
    names = list(dict.fromkeys(t[0] for t in tasks))  # registry order
    total = len({name for name, _ in architectures()})
    span = f" ({names[0]} to {names[-1]} in registry order)" if names else ""
    return f"the first {len(names)} of {total} architectures{span}; heads {args.heads}; modes {args.modes}"


def results_table(summary: dict, meta: dict) -> str:
    dtype = meta.get("dtype", "float32")
    lines = ["| " + " | ".join(HEADER) + " |", "|" + " --- |" * len(HEADER)]
    lines += ["| " + " | ".join(_format_row(k, g)) + " |" for k, g in sorted(summary["groups"].items())]
    scope = "partial sweep (" + meta["scope"] + ")" if meta.get("partial") else "full sweep"
    lines.append("")
    judged = "" if dtype == "float32" else f", {dtype}, judged against float64 (`sweep_common.judge_against_exact`)"
    lines.append(f"Last run: {meta['date']}, {scope}{judged}, transformers {meta['transformers']}, "
                 f"torch {meta['torch']}, timeout {meta['timeout']:.0f} s per model. Percentages are of the "
                 "models that run in eager; ✓ marks a bar met (run ≥98%, match ≥97%, fully lowered ≥85%; "
                 "causal-LM training: run and match ≥95%).")
    return "\n".join(lines)


def write_docs(table: str, dtype: str) -> None:
    from benchmarks.sweep_common import replace_between_markers

    replace_between_markers(RESULTS_PAGE, _markers(dtype), table)


def _tasks(args: argparse.Namespace) -> list[tuple[str, str, str]]:
    from benchmarks.hf_zoo import architectures

    heads = tuple(args.heads.split(","))
    modes = args.modes.split(",")
    only = set(args.only.split(",")) if args.only else None
    pairs = [(m, h) for m, h in architectures(heads) if only is None or m in only]
    if args.limit:
        # --limit counts architectures, so base and causal-LM runs of one model stay together.
        keep = list(dict.fromkeys(m for m, _ in pairs))[: args.limit]
        pairs = [(m, h) for m, h in pairs if m in keep]
    tasks = [(m, h, "inference") for m, h in pairs if "inference" in modes]
    tasks += [(m, h, "train") for m, h in pairs if "train" in modes and h == "causal_lm"]
    return tasks


def _save(out: Path, records: list[dict], meta: dict) -> dict:
    summary = summarise(records)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"meta": meta, "summary": summary, "records": records}, indent=1, sort_keys=True))
    return summary


def main(argv: Optional[list[str]] = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--only", help="comma-separated model types")
    parser.add_argument("--limit", type=int, help="first N architectures of the registries")
    parser.add_argument("--heads", default="base,causal_lm")
    parser.add_argument("--modes", default="inference,train", help="train runs for causal-LM heads only")
    parser.add_argument("-j", "--jobs", type=int, default=1)
    parser.add_argument("--timeout", type=float, default=180.0, help="seconds per (model, head, mode)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--dtype", choices=("float32", "bfloat16", "float16"), default="float32",
                        help="the models' and inputs' floating dtype")
    parser.add_argument("--out", type=Path, help="default: benchmarks/results/models[-<dtype>].json")
    parser.add_argument("--resume", action="store_true", help="keep records already in --out, run the rest")
    parser.add_argument("--write-docs", action="store_true", help="regenerate the table in docs/coverage.md from --out")
    parser.add_argument("--child", nargs=3, metavar=("MODEL_TYPE", "HEAD", "MODE"), help=argparse.SUPPRESS)
    parser.add_argument("--result", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        child(*args.child, result=args.result, seed=args.seed, dtype=args.dtype)
        return
    args.out = args.out or default_out(args.dtype)

    import torch
    import transformers

    tasks = _tasks(args)
    done: dict[tuple, dict] = {}
    if args.resume and args.out.exists():
        done = {(r["model_type"], r["head"], r["mode"]): r for r in json.loads(args.out.read_text())["records"]}
    every = args.limit is None and args.only is None and args.heads == "base,causal_lm"
    from benchmarks.sweep_common import environment

    meta = {
        **environment(),
        "date": time.strftime("%Y-%m-%d"), "transformers": transformers.__version__,
        "timeout": args.timeout, "partial": not every, "jobs": args.jobs,
        "scope": _scope(args, tasks), "dtype": args.dtype,
    }
    records = [done[t] for t in tasks if t in done]
    todo = [t for t in tasks if t not in done]
    print(f"{len(tasks)} runs ({len(records)} reused), {args.jobs} at a time", flush=True)
    with concurrent.futures.ThreadPoolExecutor(max_workers=args.jobs) as pool:
        futures = [pool.submit(_run_task, task, args.timeout, args.seed, args.dtype) for task in todo]
        for future in concurrent.futures.as_completed(futures):
            record = future.result()
            records.append(record)
            note = record.get("error") or record.get("eager_error") or "; ".join(record.get("mismatches", [])[:1])
            flags = f"fallback={len(record.get('fallback_ops', []))} breaks={record.get('graph_breaks', 0)}"
            print(f"[{len(records)}/{len(tasks)}] {record['model_type']}/{record['head']}/{record['mode']}: "
                  f"{record['status']} {flags} {record['seconds']}s {note[:150]}", flush=True)
            _save(args.out, records, meta)
    summary = _save(args.out, records, meta)
    print()
    print_summary(summary)
    if args.write_docs:
        write_docs(results_table(summary, meta), args.dtype)


if __name__ == "__main__":
    sys.path.insert(0, str(ROOT))
    main()
