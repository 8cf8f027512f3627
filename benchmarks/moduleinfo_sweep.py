"""Run PyTorch's ModuleInfo database through backend="tpu" and aot_eager, forward and backward.

``torch.testing._internal.common_modules.module_db`` describes ~110 ``nn``
modules (convolutions, pools, norms, losses, RNNs, transformers, paddings ...)
with sample constructor and forward inputs for each (``module_inputs_func``).
For every module, every sample, float32 on the CPU (``--dtype bfloat16`` or
``float16``: every module and input in that dtype, whatever dtypes the
ModuleInfo declares), in training and eval mode (both only where the
module's ``train_and_eval_differ`` says they differ, as PyTorch's own module
tests do; ``--modes both`` runs both everywhere):

* the module is built with seed 0 (so every run gets the same parameters),
  put in the mode, and called on clones of the sample's inputs (leaves that
  require grad) with the seed reset before the call;
* forward: the outputs and the module's buffers after the call (BatchNorm's
  running statistics) must match eager's;
* backward: the sum of every floating output that requires grad is
  backpropagated; the gradients of the parameters and of the inputs must match
  eager's (a gradient present in one and missing in the other is a mismatch).

The same runs under stock ``torch.compile(backend="aot_eager")`` and under
``backend="tpu"`` (a fresh ``cache_dir`` per run). Eager runs three times
first: twice with seed 0 (results differ: uninitialized memory,
``nondeterministic``) and once with seed 1 (results differ: the module draws
random numbers, ``random``, e.g. Dropout-like modules or FractionalMaxPool);
such samples have no reference and are not counted in the table, as in the
OpInfo sweep (the JSON keeps what the backends did with them).

Outcomes per (sample, backend, direction): pass / mismatch / error / crash
(worker died) / timeout / skipped (eager fails, or no output requires grad
for backward). A backward after a failed forward fails the same way. "Fully
lowered": passed with no eager fallback in that direction's graphs.

    python benchmarks/moduleinfo_sweep.py                       # everything, ~1,900 samples
    python benchmarks/moduleinfo_sweep.py --modules 'Conv2d|BatchNorm' --limit 40
    python benchmarks/moduleinfo_sweep.py --dtype bfloat16                      # -> moduleinfo-bfloat16.json
    python benchmarks/moduleinfo_sweep.py --dtype bfloat16 --modules GRUCell --update  # redo one module's samples

In half precision a sample outside tests/test_ops.py's tolerance for the dtype
passes when every half output (and gradient) is no further than eager's plus
one ulp from the same module run in float32 on the same (upcast) parameters
and inputs, as in the OpInfo sweep (``passed_against_float32``), or, failing
that, when it passes PyTorch's accuracy check for Inductor's benchmarks
against that float32 run (root-mean-square error at most 3x eager's:
``sweep_common.rmse_verdict``, ``passed_by_rmse``; the note gives the ratio).
"""

from __future__ import annotations

import json
import re
import sys
import time
from pathlib import Path
from typing import Any, Optional

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from benchmarks import sweep_common as common  # noqa: E402

RESULTS = ROOT / "benchmarks" / "results"


def default_out(dtype: str) -> Path:
    return RESULTS / ("moduleinfo.json" if dtype == "float32" else f"moduleinfo-{dtype}.json")


BACKENDS = ("tpu", "aot_eager")
DIRECTIONS = ("forward", "backward")
# tests/test_ops.py's tolerances per dtype, forward and backward alike: XLA's
# CPU backend approximates transcendental functions and reassociates
# reductions, a few ulp from ATen. A half-precision miss is judged against
# float32 as the OpInfo sweep does (sweep_common.float32_verdict).
TOLERANCES = {"float32": (1e-4, 1e-5), "bfloat16": (3e-2, 3e-2), "float16": (1e-3, 1e-5)}


# ---------------------------------------------------------------- enumerating


def _module_db() -> dict[str, Any]:
    from torch.testing._internal.common_modules import module_db

    return {info.name: info for info in module_db}


_SAMPLES: dict[tuple[str, bool, str], list] = {}


def samples(info: Any, training: bool, dtype: str = "float32") -> list:
    """The module's samples for one mode and dtype, generated the same way in every process."""
    import torch

    key = (info.name, training, dtype)
    if key not in _SAMPLES:
        common.seeded(0)
        _SAMPLES[key] = list(info.module_inputs_func(info, device="cpu", dtype=getattr(torch, dtype),
                                                     requires_grad=True, training=training))
    return _SAMPLES[key]


def _modes(info: Any, which: str) -> list[bool]:
    if which == "both" or (which == "pytorch" and info.train_and_eval_differ):
        return [True, False]
    return {"train": [True], "eval": [False]}.get(which, [True])


def task_id(name: str, training: bool, index: int) -> str:
    return f"{name}/{'train' if training else 'eval'}/{index}"


def _parse_id(task_id_: str) -> tuple[str, bool, int]:
    name, mode, index = task_id_.rsplit("/", 2)
    return name, mode == "train", int(index)


# ---------------------------------------------------------------- one run


class _Run:
    """One module instance called once (forward) and backpropagated (backward)."""

    def __init__(self, info: Any, sample: Any, training: bool, backend: Optional[str], seed: int,
                 cache_dir: Optional[str] = None, dtype: str = "float32", upcast: bool = False):
        """The module in ``dtype``; ``upcast``: then in float32, its half
        parameters and inputs upcast (the float32 verdict's reference)."""
        import torch

        common.seeded(0)
        constructor = sample.constructor_input
        module = info.module_cls(*constructor.args, **constructor.kwargs)
        module.to(getattr(torch, dtype))
        self.args = common.clone_tree(sample.forward_input.args, keep_grad=True)
        self.kwargs = common.clone_tree(sample.forward_input.kwargs, keep_grad=True)
        if upcast:
            if info.is_lazy:  # its parameters as the half run draws them (at its first call, seed 0)
                common.seeded(0)
                module.initialize_parameters(*self.args, **self.kwargs)
            module.to(torch.float32)
            self.args, self.kwargs = common.upcast_half((self.args, self.kwargs))
        module.train(training)
        self.module = module
        if backend is None:
            self.call = module
        elif backend == "tpu":
            self.call = torch.compile(module, backend="tpu", options=common.tpu_options(cache_dir))
        else:
            self.call = torch.compile(module, backend=backend)
        self.seed = seed
        self.output: Any = None

    def forward(self) -> dict:
        common.seeded(self.seed)
        self.output = self.call(*self.args, **self.kwargs)
        return {"output": common.clone_tree(self.output),
                "buffers": {name: b.detach().clone() for name, b in self.module.named_buffers()}}

    def backward(self) -> Optional[dict]:
        """Gradients of the parameters and inputs, or None when no output requires grad."""
        import torch
        from torch.utils._pytree import tree_flatten

        leaves = [t for t in tree_flatten(self.output)[0]
                  if isinstance(t, torch.Tensor) and t.requires_grad and (t.is_floating_point() or t.is_complex())]
        if not leaves:
            return None
        loss = sum((t.real if t.is_complex() else t).sum() for t in leaves)
        common.seeded(self.seed)
        loss.backward()
        inputs = [t for t in tree_flatten((self.args, self.kwargs))[0]
                  if isinstance(t, torch.Tensor) and t.requires_grad]
        grads = {f"grad of parameter {name}": _grad(p) for name, p in self.module.named_parameters()}
        grads.update({f"grad of input {i}": _grad(t) for i, t in enumerate(inputs)})
        return grads


def _grad(tensor: Any) -> Any:
    return None if tensor.grad is None else tensor.grad.detach().clone()


def _differences(actual: Any, expected: Any, direction: str, dtype: str = "float32") -> list[str]:
    rtol, atol = TOLERANCES[dtype]
    if direction == "backward":
        problems = []
        for name in sorted(set(actual) | set(expected)):
            a, e = actual.get(name), expected.get(name)
            if (a is None) != (e is None):
                problems.append(f"{name}: {'missing' if a is None else 'present'} (eager: "
                                f"{'missing' if e is None else 'present'})")
            elif a is not None:
                problems += common.compare(a, e, rtol, atol, path=name, limit=3)
        return problems[:5]
    problems = common.compare(actual["output"], expected["output"], rtol, atol, path="output")
    problems += common.compare(actual["buffers"], expected["buffers"], rtol, atol, path="buffers")
    return problems[:5]


def _reference(info: Any, sample: Any, training: bool, dtype: str) -> tuple[dict, dict]:
    """Eager's forward and backward, and whether eager is deterministic."""
    results = []
    # A lazy module draws its parameters in its first call: a second seed
    # changes them, which says nothing about the forward, so lazy modules get
    # only the same-seed check.
    seeds = (0, 0) if info.is_lazy else (0, 0, 1)
    for seed in seeds:
        run = _Run(info, sample, training, None, seed, dtype=dtype)
        results.append((run.forward(), run.backward()))
    (forward, backward), checks = results[0], list(zip(("nondeterministic", "random"), results[1:]))
    note = {}
    for label, candidate in checks:
        problems = _differences(candidate[0], forward, "forward", dtype)
        if backward is not None and candidate[1] is not None:
            problems += _differences(candidate[1], backward, "backward", dtype)
        if problems:
            note = {"reference": label, "reference_detail": "; ".join(problems)[:300]}
            break
    return {"forward": forward, "backward": backward}, note


# ---------------------------------------------------------------- worker


class _Judge:
    """Compares a backend's forward or backward with eager's in one dtype; a
    half-precision miss is judged against float32 (:func:`sweep_common.float32_verdict`),
    whose reference run is made once, when first needed."""

    def __init__(self, info: Any, sample: Any, training: bool, dtype: str, reference: dict):
        self._make_float32 = lambda: _Run(info, sample, training, None, 0, dtype=dtype, upcast=True)
        self._dtype = dtype
        self._reference = reference
        self._in_float32: Optional[dict] = None

    def __call__(self, record: dict, actual: Any, direction: str) -> None:
        expected = self._reference[direction]
        problems = _differences(actual, expected, direction, self._dtype)
        if problems and self._dtype != "float32":
            in_float32 = self._float32()[direction]
            closer = common.float32_verdict(actual, expected, in_float32)
            if closer is not None:
                record.update(outcome=common.PASS, note=closer, passed_against_float32=True)
                return
            as_near = common.rmse_verdict(actual, expected, in_float32)
            if as_near is not None:
                record.update(outcome=common.PASS, note=as_near, passed_by_rmse=True)
                return
        record.update(outcome=common.MISMATCH if problems else common.PASS)
        if problems:
            record["error"] = "; ".join(problems)[:1000]

    def _float32(self) -> dict:
        if self._in_float32 is None:
            run = self._make_float32()
            self._in_float32 = {"forward": run.forward(), "backward": run.backward()}
        return self._in_float32


def run_task(task: dict, log: common.WorkerLog) -> None:
    import torch

    name, training, index = _parse_id(task["id"])
    dtype = task.get("dtype", "float32")
    info = _module_db()[name]
    sample = samples(info, training, dtype)[index]
    log.info(desc=sample.desc)
    reference = None
    with log.phase("eager") as record:
        try:
            reference, note = _reference(info, sample, training, dtype)
        except Exception as exc:  # noqa: BLE001
            record.update(common.describe(exc), error_kind="eager")
        else:
            record.update(outcome=common.PASS, backward=reference["backward"] is not None, **note)
    for backend in ("aot_eager", "tpu"):  # the stock backend first: a tpu crash cannot lose it
        phases = [f"{backend}:{d}" for d in DIRECTIONS]
        if not any(log.wants(p) for p in phases):
            continue
        if reference is None:
            for phase in phases:
                log.skip(phase, "eager failed")
            continue
        torch._dynamo.reset()
        with common.fresh_cache_dir() as cache_dir:
            if backend == "tpu":
                import tpu_inductor.report as report

                report.reset()
            run = _Run(info, sample, training, backend, 0, cache_dir, dtype=dtype)
            judge = _Judge(info, sample, training, dtype, reference)
            failed = None
            with log.phase(f"{backend}:forward") as record:
                try:
                    actual = run.forward()
                except Exception as exc:  # noqa: BLE001
                    record.update(common.describe(exc))
                    failed = record
                else:
                    judge(record, actual, "forward")
                if backend == "tpu":
                    record.update(common.backend_facts(("forward", "inference")))
            with log.phase(f"{backend}:backward") as record:
                if failed is not None:
                    record.update(outcome=failed["outcome"], error=f"not run: forward {failed['outcome']}")
                elif reference["backward"] is None:
                    record.update(outcome=common.SKIPPED, error="no output requires grad")
                else:
                    try:
                        grads = run.backward()
                    except Exception as exc:  # noqa: BLE001
                        record.update(common.describe(exc))
                    else:
                        if grads is None:
                            record.update(outcome=common.MISMATCH, error="no output requires grad (eager's do)")
                        else:
                            judge(record, grads, "backward")
                    if backend == "tpu":
                        record.update(common.backend_facts(("backward",)))


# ---------------------------------------------------------------- parent


def _phase(record: dict, phase: str) -> dict:
    return record["phases"].get(phase, {})


def _counted(record: dict) -> bool:
    eager = _phase(record, "eager")
    return eager.get("outcome") == common.PASS and not eager.get("reference")


def _passes(record: dict, backend: str, direction: str) -> bool:
    """Passed; a backward with nothing to backpropagate passes with its forward."""
    outcome = _phase(record, f"{backend}:{direction}").get("outcome")
    return outcome == common.PASS or (direction == "backward" and not _phase(record, "eager").get("backward")
                                      and _phase(record, f"{backend}:forward").get("outcome") == common.PASS)


def summarise(records: dict[str, dict]) -> dict:
    counted = [r for r in records.values() if _counted(r)]
    summary: dict[str, Any] = {
        "samples": len(records),
        "modules": len({_parse_id(i)[0] for i in records}),
        "eager_failed": sum(_phase(r, "eager").get("outcome") != common.PASS for r in records.values()),
        "random_or_nondeterministic": sum(bool(_phase(r, "eager").get("reference")) for r in records.values()),
        "ran": len(counted),
        "with_backward": sum(bool(_phase(r, "eager").get("backward")) for r in counted),
    }
    for direction in DIRECTIONS:
        # Backward counts the samples with an output that requires grad.
        rows = [r for r in counted if direction == "forward" or _phase(r, "eager").get("backward")]
        for backend in BACKENDS:
            phase = f"{backend}:{direction}"
            counts = common.count(_phase(r, phase).get("outcome", common.SKIPPED) for r in rows)
            counts["ran"] = len(rows)
            counts["dynamo_errors"] = sum(_phase(r, phase).get("error_kind") == "dynamo" for r in rows)
            if backend == "tpu":
                counts["fully_lowered"] = sum(_phase(r, phase).get("outcome") == common.PASS
                                              and not _phase(r, phase).get("fallbacks") for r in rows)
            for verdict in ("passed_against_float32", "passed_by_rmse"):
                counts[verdict] = sum(bool(_phase(r, phase).get(verdict)) for r in rows)
            summary[phase] = counts
        summary[f"{direction}:tpu_fails_aot_eager_passes"] = sorted(
            r["id"] for r in rows
            if _phase(r, f"tpu:{direction}").get("outcome") != common.PASS
            and _phase(r, f"aot_eager:{direction}").get("outcome") == common.PASS)
    by_module: dict[str, list[dict]] = {}
    for record in counted:
        by_module.setdefault(_parse_id(record["id"])[0], []).append(record)
    summary["modules_all_samples_pass"] = {
        backend: sum(all(_passes(r, backend, d) for r in rs for d in DIRECTIONS) for rs in by_module.values())
        for backend in BACKENDS}
    summary["modules_counted"] = len(by_module)
    return summary


def table(summary: dict) -> str:
    header = ["direction", "backend", "ran", "pass", "mismatch", "error (of which Dynamo)", "crash", "timeout",
              "fully lowered", "tpu passes / aot_eager passes"]
    rows = []
    for direction in DIRECTIONS:
        tpu, aot = summary[f"tpu:{direction}"], summary[f"aot_eager:{direction}"]
        for backend, c in (("tpu", tpu), ("aot_eager", aot)):
            lowered = f"{c['fully_lowered']} ({common.pct(c['fully_lowered'], c['ran'])})" if backend == "tpu" else "-"
            ratio = f"{tpu['pass']} / {aot['pass']}" if backend == "tpu" else ""
            rows.append([direction, backend, c["ran"], f"**{c['pass']}** ({common.pct(c['pass'], c['ran'])})",
                         c["mismatch"], f"{c['error']} ({c['dynamo_errors']})", c["crash"], c["timeout"],
                         lowered, ratio])
    lines = [common.markdown_table(header, rows), ""]
    judged = {p: summary[f"tpu:{p}"].get("passed_against_float32", 0) for p in DIRECTIONS}
    by_rmse = {p: summary[f"tpu:{p}"].get("passed_by_rmse", 0) for p in DIRECTIONS}
    if summary.get("dtype", "float32") != "float32":
        lines.append(f"{summary['dtype']}: tpu passes against float32 (outside the dtype's tolerance of eager, "
                     f"no further than eager from the module in float32): forward {judged['forward']}, "
                     f"backward {judged['backward']}; by root-mean-square error (at most 3x eager's): "
                     f"forward {by_rmse['forward']}, backward {by_rmse['backward']}.")
    lines.append(f"{summary['samples']} samples of {summary['modules']} modules; {summary['eager_failed']} fail in "
                 f"eager and {summary['random_or_nondeterministic']} are random or nondeterministic in eager (not "
                 f"counted); backward: the {summary['with_backward']} counted samples with an output that requires "
                 "grad.")
    lines.append(f"modules (of {summary['modules_counted']}) with every sample passing forward and backward: "
                 + ", ".join(f"{b} {n}" for b, n in summary["modules_all_samples_pass"].items()))
    for direction in DIRECTIONS:
        bugs = summary[f"{direction}:tpu_fails_aot_eager_passes"]
        lines.append(f"{direction}: tpu fails where aot_eager passes: {len(bugs)}"
                     + (f" ({', '.join(bugs[:15])}{', ...' if len(bugs) > 15 else ''})" if bugs else ""))
    return "\n".join(lines)


def main(argv: Optional[list[str]] = None) -> None:
    parser = common.sweep_parser(argv, run_task, __doc__)
    if parser is None:
        return
    parser.add_argument("--modules", help="regular expression a module name must contain (e.g. 'Conv2d|GRU')")
    parser.add_argument("--modes", choices=("pytorch", "both", "train", "eval"), default="pytorch",
                        help="pytorch: eval too only where train_and_eval_differ (as PyTorch's tests); both: always")
    parser.add_argument("--limit", type=int, help="first N samples")
    parser.add_argument("--samples-per-module", type=int, help="at most N samples per module and mode")
    parser.add_argument("--timeout", type=float, default=300.0, help="seconds per phase")
    parser.add_argument("--dtype", choices=("float32", "bfloat16", "float16"), default="float32",
                        help="modules and inputs in this dtype; a half-precision miss is judged against float32")
    parser.add_argument("--out", type=Path, help="results JSON (default: benchmarks/results/moduleinfo[-DTYPE].json)")
    parser.add_argument("--update", action="store_true",
                        help="keep the records of --out's samples that this run does not redo")
    common.add_worker_arguments(parser)
    args = parser.parse_args(argv)

    started = time.perf_counter()
    tasks = []
    for name, info in _module_db().items():
        if args.modules and not re.search(args.modules, name):
            continue
        for training in _modes(info, args.modes):
            count = len(samples(info, training, args.dtype))
            if args.samples_per_module is not None:
                count = min(count, args.samples_per_module)
            tasks += [{"id": task_id(name, training, i), "dtype": args.dtype} for i in range(count)]
    if args.limit is not None:
        tasks = tasks[: args.limit]
    phases = ["eager"] + [f"{b}:{d}" for b in ("aot_eager", "tpu") for d in DIRECTIONS]
    depends = {f"{b}:forward": "eager" for b in BACKENDS} | {f"{b}:backward": f"{b}:forward" for b in BACKENDS}
    for task in tasks:
        task.update(phases=phases, depends=depends, reference=["eager"], timeout=args.timeout)

    def progress(record: dict, done: int, total: int) -> None:
        phases_ = record["phases"]
        cells = " ".join(f"{p}={phases_.get(p, {}).get('outcome', '?')}" for p in phases)
        note = next((phases_[p].get("error", "") for p in reversed(phases)
                     if phases_.get(p, {}).get("outcome") not in (None, common.PASS, common.SKIPPED)), "")
        seconds = sum(p.get("seconds", 0) for p in phases_.values())
        print(f"[{done}/{total}] {record['id']}: {cells} {seconds:.1f}s {note[:160]}", flush=True)

    print(f"{len(tasks)} samples", flush=True)
    with common.scratch_dir(args.keep_logs) as scratch:
        records = common.run_tasks(tasks, [sys.executable, str(Path(__file__).resolve()), "--worker"],
                                   jobs=args.jobs, chunk=args.chunk, env=common.worker_env(scratch, args),
                                   workdir=scratch / "logs", timeout=args.timeout, progress=progress)
    meta = {**common.environment(), "dtype": args.dtype, "modes": args.modes,
            "tolerance": TOLERANCES[args.dtype], "timeout": args.timeout,
            "selection": {"modules": args.modules, "limit": args.limit, "samples_per_module": args.samples_per_module,
                          "samples": len(tasks),
                          "partial": bool(args.modules or args.limit is not None or args.samples_per_module)},
            "jobs": args.jobs, "eager_kernels": args.eager_kernels,
            "seconds": round(time.perf_counter() - started, 1)}
    out = args.out or default_out(args.dtype)
    if args.update and out.exists():
        records, meta = common.updated(json.loads(out.read_text()), "samples", records, meta)
    summary = {**summarise(records), "dtype": args.dtype}
    common.finish(out, meta, summary, "samples", records, table(summary), f"{len(tasks)} samples",
                  seconds=time.perf_counter() - started)


if __name__ == "__main__":
    main()
