"""Hugging Face causal LMs with ``attn_implementation="flex_attention"`` under backend="tpu".

Why: FlexAttention reaches the backend as a higher-order op
(``passes/flex_attention_as_math.py`` traces it into PyTorch's math
attention). Its score modifications and masks are whatever each model writes
(causal, sliding windows, chunked attention, soft-capping, padding), so the
tests' Llama alone says little. This sweep takes every causal-LM architecture
in transformers' registry whose model class declares FlexAttention support
(``_supports_flex_attn``), builds it tiny with random weights as
``models.py`` does (no downloads), and runs, each in a worker process with a
fresh cache directory:

* ``eager``: the model with FlexAttention as PyTorch runs it outside a
  compiled region (``flex_attention`` compiles itself with the ``eager``
  backend there: its math implementation over the traced score and mask
  functions), the reference. transformers would compile it with Inductor
  instead, whose fused kernel is not the reference either. The record also
  says whether the model's default attention (SDPA, or transformers' own)
  gives the same outputs (``default_attention_agrees``): where it does not,
  the two paths differ in transformers (Doge's dynamic mask), not here;
* ``tpu``: the same model and inputs with FlexAttention, compiled with
  ``backend="tpu"``; every floating output must match the reference at
  ``tests/test_hf_models.py``'s float32 tolerance (rtol = atol = 1e-4), and
  the record says whether ``flex_attention`` ran on the device (it is not
  among the ops that ran eagerly) and which ops did.

Run: ``python benchmarks/flex_attention_models.py [--only llama,gemma3] [-j 2] [--write-docs]``
"""

from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import Any, Optional

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks import sweep_common as common

ROOT = Path(__file__).resolve().parent.parent
DEFAULT_OUT = ROOT / "benchmarks" / "results" / "flex_attention.json"
RESULTS_PAGE = ROOT / "docs" / "coverage.md"
MARKERS = ("<!-- flex-attention-table:start -->", "<!-- flex-attention-table:end -->")
TOLERANCE = dict(rtol=1e-4, atol=1e-4)
FLEX = "flex_attention"


def flex_architectures() -> list[str]:
    """Causal-LM model types whose model class declares FlexAttention support."""
    import transformers
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

    from benchmarks.hf_zoo import architectures

    found = []
    for model_type, _ in architectures(("causal_lm",)):
        model_class = getattr(transformers, MODEL_FOR_CAUSAL_LM_MAPPING_NAMES.get(model_type, ""), None)
        if model_class is not None and getattr(model_class, "_supports_flex_attn", False):
            found.append(model_type)
    return found


def _reference(model_type: str) -> tuple[Any, dict, Any, list[str]]:
    """The first tiny model and inputs eager runs, its output with FlexAttention
    run by PyTorch (the reference), and how its default attention's output
    differs from that (empty: it agrees)."""
    import torch

    from benchmarks.hf_zoo import compare, first_eager_run

    built, inputs, default = first_eager_run(model_type, "causal_lm")
    built.model.set_attn_implementation(FLEX)
    torch._dynamo.reset()
    with torch.no_grad():
        flex = torch.compile(built.model, backend="eager")(**inputs)
    return built.model, inputs, flex, compare(flex, default, **TOLERANCE)


def run_task(task: dict, log: common.WorkerLog) -> None:
    import torch

    from benchmarks.hf_zoo import compare

    model_type = task["id"]
    with log.phase("eager") as record:
        model, inputs, expected, differences = _reference(model_type)
        record.update(outcome=common.PASS, default_attention_agrees=not differences)
        if differences:
            record["default_attention_differs"] = "; ".join(differences[:2])
    if record["outcome"] != common.PASS:  # nothing to compare with
        log.skip("tpu", "the eager reference failed")
        return
    torch._dynamo.reset()
    with common.fresh_cache_dir() as cache_dir, log.phase("tpu") as record:
        import tpu_inductor.report as report

        report.reset()
        started = time.perf_counter()
        try:
            with torch.no_grad():
                actual = torch.compile(model, backend="tpu", options=common.tpu_options(cache_dir))(**inputs)
        except Exception as exc:  # noqa: BLE001
            record.update(common.describe(exc))
        else:
            problems = compare(expected, actual, **TOLERANCE)
            record.update(outcome=common.MISMATCH if problems else common.PASS)
            if problems:
                record["error"] = "; ".join(problems[:3])
        record["first_call_seconds"] = round(time.perf_counter() - started, 2)
        record.update(common.backend_facts())
        record["flex_on_device"] = FLEX not in record["fallbacks"]


def summarise(records: dict[str, dict]) -> dict:
    counted = [r for r in records.values() if r["phases"].get("eager", {}).get("outcome") == common.PASS]
    phases = [r["phases"].get("tpu", {}) for r in counted]
    summary: dict[str, Any] = {"architectures": len(records), "eager_ran": len(counted)}
    summary.update(common.count(p.get("outcome", common.SKIPPED) for p in phases))
    summary["default_attention_differs"] = sorted(
        r["id"] for r in counted if not r["phases"]["eager"].get("default_attention_agrees", True))
    summary["flex_on_device"] = sum(p.get("outcome") == common.PASS and p.get("flex_on_device", False) for p in phases)
    summary["fully_lowered"] = sum(p.get("outcome") == common.PASS and not p.get("fallbacks") for p in phases)
    summary["failed"] = sorted(f"{r['id']}: {p.get('outcome')}: {p.get('error', '')[:200]}"
                               for r, p in zip(counted, phases) if p.get("outcome") != common.PASS)
    summary["eager_failed"] = sorted(f"{r['id']}: {r['phases'].get('eager', {}).get('error', '')[:120]}"
                                     for r in records.values() if r not in counted)
    summary["fallback_ops"] = common.fallback_ops(counted, phases)
    return summary


def table(summary: dict) -> str:
    ran = summary["eager_ran"]
    header = ["architectures", "eager runs", "match FlexAttention in eager", "flex_attention on the device",
              "fully lowered", "mismatch", "error", "crash", "timeout"]
    row = [summary["architectures"], ran, f"**{summary['pass']}** ({common.pct(summary['pass'], ran)})",
           f"{summary['flex_on_device']} ({common.pct(summary['flex_on_device'], ran)})",
           f"{summary['fully_lowered']} ({common.pct(summary['fully_lowered'], ran)})",
           summary["mismatch"], summary["error"], summary["crash"], summary["timeout"]]
    lines = [common.markdown_table(header, [row]), ""]
    if summary["failed"]:
        lines.append("Not passing: " + "; ".join(summary["failed"]))
    if summary["fallback_ops"]:
        lines.append("Ops in eager: " + "; ".join(f"`{op}` ({len(ids)}: {', '.join(ids[:8])}"
                                                  f"{', ...' if len(ids) > 8 else ''})"
                                                  for op, ids in summary["fallback_ops"].items()))
    if summary["default_attention_differs"]:
        lines.append("FlexAttention's outputs differ from the model's default attention in eager (transformers' two "
                     "paths, not the backend): " + ", ".join(summary["default_attention_differs"]))
    if summary["eager_failed"]:
        lines.append("Eager failed (not counted): " + "; ".join(summary["eager_failed"]))
    return "\n".join(lines)


def main(argv: Optional[list[str]] = None) -> None:
    parser = common.sweep_parser(argv, run_task, __doc__)
    if parser is None:
        return
    parser.add_argument("--only", help="comma-separated model types (default: every flex-capable causal LM)")
    parser.add_argument("--timeout", type=float, default=300.0, help="seconds per phase")
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT)
    parser.add_argument("--write-docs", action="store_true", help="put the table in docs/coverage.md")
    common.add_worker_arguments(parser)
    parser.set_defaults(chunk=1)  # one model per worker process: their compiles share nothing
    args = parser.parse_args(argv)

    started = time.perf_counter()
    chosen = args.only.split(",") if args.only else flex_architectures()
    tasks = [{"id": model_type, "phases": ["eager", "tpu"], "depends": {"tpu": "eager"},
              "reference": ["eager"], "timeout": args.timeout} for model_type in chosen]

    def progress(record: dict, done: int, total: int) -> None:
        tpu = record["phases"].get("tpu", {})
        note = next((p.get("error", "") for p in record["phases"].values() if p.get("outcome") != common.PASS), "")
        print(f"[{done}/{total}] {record['id']}: tpu={tpu.get('outcome', '?')} eager ops={tpu.get('fallbacks')} "
              f"{note[:160]}", flush=True)

    with common.scratch_dir(args.keep_logs) as scratch:
        records = common.run_tasks(tasks, [sys.executable, str(Path(__file__).resolve()), "--worker"],
                                   jobs=args.jobs, chunk=args.chunk, env=common.worker_env(scratch, args),
                                   workdir=scratch / "logs", timeout=args.timeout, progress=progress)
    import transformers

    meta = {**common.environment(), "transformers": transformers.__version__, "tolerance": TOLERANCE,
            "selection": {"architectures": chosen, "partial": bool(args.only)}, "jobs": args.jobs,
            "eager_kernels": args.eager_kernels, "timeout": args.timeout,
            "seconds": round(time.perf_counter() - started, 1)}
    summary = summarise(records)
    text = table(summary)
    common.finish(args.out, meta, summary, "architectures", records, text, f"{len(tasks)} architectures")
    if args.write_docs:
        common.replace_between_markers(RESULTS_PAGE, MARKERS, text)


if __name__ == "__main__":
    main()
