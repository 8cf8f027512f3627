"""Run timm's image models through backend="tpu": inference and a training step, judged against float64.

Why: the OpInfo and ModuleInfo sweeps test ops and single modules, and
``models.py`` transformers' text models; timm holds the vision models people
compile (ResNets, EfficientNets, MobileNets, ViTs, Swin, ConvNeXt, MaxViT,
NFNets, RepVGG-style re-parameterised blocks ...), ~1,300 of them in ~90
families (one source module each). This sweep takes one model per family, the
cheapest by parameters x input pixels (``--max-params`` leaves out the few
largest), builds it with random weights (no downloads), and runs, each model in
a worker process of its own with a fresh cache directory:

* a float64 eager run (the reference) and a float32 eager run, in eval mode
  (the logits) and in train mode (the loss ``mean(logits ** 2)`` and every
  parameter's gradient after ``backward()``);
* the same two under ``torch.compile(backend="tpu")`` with PyTorch's kernels
  not chosen for speed (``sweep_common.tpu_options``), so what passes is what
  the device lowering computed.

The verdict follows PyTorch's own Dynamo benchmarks (``same(..., fp64_ref=...)``
in ``torch/_dynamo/utils.py``): per tensor (the logits, the loss, each
gradient), a result is wrong when its root-mean-square error against float64
exceeds twice eager float32's (three times for tensors under 1,000 elements
and 1x1 kernels) plus a floor (``FLOOR``). A deep network in train mode is
ill-conditioned (ConvMixer's BatchNorm gradients: eager float32 is 14% away
from float64), so a fixed tolerance against eager float32 would call rounding
a bug, or hide one. Eager float32's error is the worst of four runs: on the
input as given and on three copies whose elements moved by at most a unit in
the last place (``REROUNDINGS``). One run is one draw of its rounding: in
rexnet_100's train-mode gradients such moves spread eager's error over
1e-4 to 1e-3 (eight draws), and the input as given was a lucky one.

timm zero-initialises classifier heads, the last BatchNorm of residual blocks
and layer scales; such constant tensors get values that vary around theirs
first (``_varied``), so that every branch shows in the output. Dropout and
stochastic depth are set to zero: in train mode they draw random masks, which
backend="tpu" draws on the device (as Inductor does), so no compiled run could
match eager's.

timm imports ``torchvision``. PyPI's torchvision is a CUDA build whose
native ops (``nms``, ``roi_align`` ...) do not load against the CPU torch, and
its import then fails registering their kernels; the sweep imports it without
those registrations (no timm classifier calls those ops) and says so in the
results' meta.

timm stays out of the project's environment (an importable but broken
torchvision there would break transformers' vision imports): install it
beside it and put it on ``PYTHONPATH``, which the workers inherit.

    pip install --no-deps --target /tmp/timm-pkgs timm torchvision pillow
    PYTHONPATH=/tmp/timm-pkgs python benchmarks/timm_sweep.py -j 2    # one model per family
    PYTHONPATH=/tmp/timm-pkgs python benchmarks/timm_sweep.py --models resnet18,vit_tiny_patch16_224
    PYTHONPATH=/tmp/timm-pkgs python benchmarks/timm_sweep.py --models hiera_tiny_224 --update   # redo one
"""

from __future__ import annotations

import copy
import json
import math
import sys
import time
import types
from pathlib import Path
from typing import Any, Optional

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from benchmarks import sweep_common as common  # noqa: E402

DEFAULT_OUT = ROOT / "benchmarks" / "results" / "timm.json"
RESULTS_PAGE = ROOT / "docs" / "coverage.md"
MARKERS = ("<!-- timm-table:start -->", "<!-- timm-table:end -->")
MODES = ("inference", "train")
FLOOR = 1e-5
"""Wrong when RMSE(tpu) > multiplier x RMSE(eager float32) + FLOOR, both against float64 (Dynamo's tol / 10)."""
REROUNDINGS = 3
"""Eager float32 runs on the input moved by up to an ulp (:func:`moved_by_an_ulp`) beside the one on it as given."""
FLOAT32_TOLERANCE = 1e-3
"""RMSE allowed against eager float32, relative to the tensor's RMS, where the model does not run in float64."""
BATCH = 2
NAME_HINTS = ("test_", "atto", "femto", "pico", "nano", "xxs", "tiny", "xs", "mini", "small", "b0", "18", "050")
"""Names tried first in a family whose models cannot be built on the meta device."""


# ---------------------------------------------------------------- timm


def import_timm() -> tuple[Any, list[str]]:
    """timm, and the stand-ins it needed (``["torchvision ops"]`` or none)."""
    stand_ins = []
    try:
        import torchvision  # noqa: F401
    except RuntimeError:  # PyPI's CUDA build: its ops do not load, registering their kernels fails
        for name in [n for n in sys.modules if n == "torchvision" or n.startswith("torchvision.")]:
            del sys.modules[name]
        # Empty modules in place of the two that register meta and autograd
        # kernels for torchvision's own ops (nms, roi_align, ...), which no
        # timm classifier calls; the rest of torchvision is Python.
        for name in ("_meta_registrations", "_autograd_registrations"):
            sys.modules[f"torchvision.{name}"] = types.ModuleType(f"torchvision.{name}")
        import torchvision  # noqa: F401

        stand_ins.append("torchvision ops")
    import timm

    return timm, stand_ins


def families(timm: Any, max_params: float) -> dict[str, str]:
    """``{family: model}``: per timm source module, the model with the fewest
    parameters x input pixels, estimated on the meta device (no memory, no
    init); families with no model that builds there try their first few
    names by ``NAME_HINTS`` on the CPU."""
    import torch
    from timm.models import _registry

    by_family: dict[str, list[str]] = {}
    for name in timm.list_models():
        by_family.setdefault(_registry._model_to_module[name], []).append(name)
    chosen = {}
    for family, names in sorted(by_family.items()):
        costs = [c for c in (_cost(timm, n, torch.device("meta")) for n in names) if c is not None]
        if not costs:
            hinted = sorted(names, key=lambda n: next((i for i, h in enumerate(NAME_HINTS) if h in n), len(NAME_HINTS)))
            costs = [c for c in (_cost(timm, n, torch.device("cpu")) for n in hinted[:4]) if c is not None]
        costs = [c for c in costs if c[1] <= max_params]
        if costs:
            chosen[family] = min(costs)[2]
    return chosen


def _cost(timm: Any, name: str, device: Any) -> Optional[tuple[float, int, str]]:
    """``(parameters x pixels, parameters, name)``, or None where it does not build."""
    try:
        with device:
            model = timm.create_model(name, pretrained=False)
    except Exception:  # noqa: BLE001 - a model that does not build is not a candidate
        return None
    parameters = sum(p.numel() for p in model.parameters())
    _, height, width = _input_size(model)
    return parameters * height * width, parameters, name


def _input_size(model: Any) -> tuple[int, int, int]:
    """``(channels, height, width)`` the model was configured for."""
    return tuple(model.pretrained_cfg.get("input_size", (3, 224, 224)))


# ---------------------------------------------------------------- worker


def _build(name: str) -> tuple[Any, Any, int]:
    """The model (seed 0, constant tensors made to vary, no random draws), its
    input batch, and how many dropout and stochastic-depth modules were zeroed."""
    import torch

    timm, _ = import_timm()
    common.seeded(0)
    model = timm.create_model(name, pretrained=False)
    with torch.no_grad():
        for tensor in [*model.parameters(), *(b for b in model.buffers() if b.is_floating_point())]:
            if tensor.numel() and tensor.float().std(unbiased=False) == 0:
                tensor.copy_(_varied(tensor))
    zeroed = _without_random_draws(model)
    return model, torch.randn(BATCH, *_input_size(model)), zeroed


def _varied(constant: Any) -> Any:
    """A tensor that held one value everywhere, made to vary around that value:
    +-10% of it, or uniform in +-0.1 where it was zero (a zero-initialised
    head or residual gain, whose branch would otherwise not show). The values
    stay centred where the model put them: raising every BatchNorm gain by
    10-30%, as the sweep did before 2026-12-07, compounded layer after layer
    (inception_v3's eager float32 logits were 4e7 away from float64's)."""
    import torch

    value = constant.flatten()[0].item()
    if not math.isfinite(value):  # a mask's -inf stays what it means
        return constant
    spread = torch.rand_like(constant) * 2 - 1
    return constant + (0.1 * spread if value == 0 else 0.1 * value * spread)


def _without_random_draws(model: Any) -> int:
    """Dropout (modules, and heads' ``drop_rate`` for ``F.dropout``) and
    stochastic depth (timm's ``DropPath``, ``DropBlock``) set to zero, and how
    many were not: in train mode their masks are random draws,
    which backend="tpu" makes on the device as Inductor does, so no compiled
    run matches eager's there (OpInfo's sweep checks the random ops alone)."""
    import torch

    zeroed = 0
    for module in model.modules():
        if isinstance(module, torch.nn.modules.dropout._DropoutNd) and module.p:
            module.p, zeroed = 0.0, zeroed + 1
        elif isinstance(getattr(module, "drop_prob", None), float) and module.drop_prob:
            module.drop_prob, zeroed = 0.0, zeroed + 1
        elif isinstance(getattr(module, "drop_rate", None), float) and module.drop_rate:
            module.drop_rate, zeroed = 0.0, zeroed + 1  # F.dropout(x, self.drop_rate) in a head
    return zeroed


def _results(model: Any, inputs: Any, mode: str, backend: Optional[str] = None,
             cache_dir: Optional[str] = None) -> dict[str, Any]:
    """``{"logits"}`` in inference; ``{"loss", <parameter>: gradient}`` in train
    mode. Float64 copies, detached."""
    import torch

    model.train(mode == "train")
    call = model if backend is None else torch.compile(model, backend=backend, options=common.tpu_options(cache_dir))
    common.seeded(1)
    if mode == "inference":
        with torch.no_grad():
            out = call(inputs)
        return {"logits": (out if isinstance(out, torch.Tensor) else out[0]).detach().double()}
    loss = call(inputs).float().pow(2).mean()
    loss.backward()
    results = {"loss": loss.detach().double().reshape(1)}
    results.update({n: p.grad.double() for n, p in model.named_parameters() if p.grad is not None})
    return results


def errors(results: dict[str, Any], reference: dict[str, Any]) -> dict[str, float]:
    """Root-mean-square error per tensor of the reference; inf where one is missing."""
    measured = {}
    for name, expected in reference.items():
        got = results.get(name)
        if got is None or got.shape != expected.shape:
            measured[name] = float("inf")
        else:
            measured[name] = _rms(got - expected)
    return measured


def _rms(tensor: Any) -> float:
    return float(tensor.pow(2).mean().sqrt()) if tensor.numel() else 0.0


def _multiplier(tensor: Any) -> float:
    """Dynamo's: 3 for small tensors and 1x1 kernels, where noise dominates, else 2."""
    small = tensor.numel() < 1000 or (tensor.ndim == 4 and tensor.shape[-1] == tensor.shape[-2] == 1)
    return 3.0 if small else 2.0


def moved_by_an_ulp(inputs: Any, seed: int) -> Any:
    """``inputs`` with each element kept or moved to a neighbouring float (one
    unit in the last place, either way, a third of the elements each): a
    rounding of the same image as valid as the one given, so eager float32's
    error on it is as much its error as on ``inputs``."""
    import torch

    generator = torch.Generator().manual_seed(seed)
    direction = torch.randint(-1, 2, inputs.shape, generator=generator)
    moved = torch.nextafter(inputs, torch.where(direction > 0, torch.inf, -torch.inf).to(inputs.dtype))
    return torch.where(direction == 0, inputs, moved)


def allowed_errors(reference: dict[str, Any], eager_draws: list[dict[str, float]]) -> dict[str, float]:
    """Per tensor, the error a result may have: :func:`_multiplier` x eager
    float32's worst error over its runs (``eager_draws``, from :func:`errors`) + ``FLOOR``."""
    return {n: _multiplier(expected) * max(draw[n] for draw in eager_draws) + FLOOR
            for n, expected in reference.items()}


def verdict(tpu: dict[str, float], allowed: dict[str, float]) -> list[str]:
    """The tensors tpu got wrong: an error beyond what :func:`_references` allows."""
    wrong = [(tpu[n], n) for n in allowed if not tpu[n] <= allowed[n]]
    return [f"{n}: error {t:.2e} (allowed {allowed[n]:.2e})" for t, n in sorted(wrong, reverse=True)]


def _references(name: str) -> tuple[dict, dict, dict]:
    """Per mode, the reference results and the error allowed per tensor, and
    facts for the record. The reference is float64 eager, and the error allowed
    2 or 3 x eager float32's worst over the input as given and ``REROUNDINGS``
    copies moved by an ulp, + ``FLOOR`` (:func:`allowed_errors`); a model that does not run in
    float64 (one that makes float32 tensors of its own) is compared with eager
    float32 within ``FLOAT32_TOLERANCE``."""
    model, inputs, zeroed = _build(name)
    facts: dict[str, Any] = {"parameters": sum(p.numel() for p in model.parameters()), "random_modules_zeroed": zeroed}
    float32 = {m: _results(copy.deepcopy(model), inputs, m) for m in MODES}
    try:
        reference = {m: _results(copy.deepcopy(model).double(), inputs.double(), m) for m in MODES}
    except Exception as exc:  # noqa: BLE001
        facts["reference"] = f"eager float32 (float64 fails: {common.describe(exc)['error'][:200]})"
        allowed = {m: {n: FLOAT32_TOLERANCE * _rms(t) + FLOOR for n, t in float32[m].items()} for m in MODES}
        return float32, allowed, facts
    draws = {m: [errors(float32[m], reference[m])] for m in MODES}
    for seed in range(REROUNDINGS):
        moved = moved_by_an_ulp(inputs, seed)
        for m in MODES:
            draws[m].append(errors(_results(copy.deepcopy(model), moved, m), reference[m]))
    facts["reference"] = "float64"
    facts["eager_float32_error"] = {m: max(draws[m][0].values()) for m in MODES}
    facts["eager_float32_error_moved_input"] = {m: max(max(d.values()) for d in draws[m][1:]) for m in MODES}
    allowed = {m: allowed_errors(reference[m], draws[m]) for m in MODES}
    return reference, allowed, facts


def run_task(task: dict, log: common.WorkerLog) -> None:
    import torch

    name = task["id"]
    if log.wants("eager"):
        with log.phase("eager") as record:
            reference, allowed, facts = _references(name)
            record.update(outcome=common.PASS, **facts)
    else:  # a fresh worker after a crash in a tpu phase: the reference again, unrecorded
        reference, allowed, _ = _references(name)
    for mode in MODES:
        if not log.wants(f"tpu:{mode}"):
            continue
        torch._dynamo.reset()
        with common.fresh_cache_dir() as cache_dir, log.phase(f"tpu:{mode}") as record:
            import tpu_inductor.report as report

            report.reset()
            model, inputs, _ = _build(name)
            started = time.perf_counter()
            try:
                measured = errors(_results(model, inputs, mode, "tpu", cache_dir), reference[mode])
            except Exception as exc:  # noqa: BLE001
                record.update(common.describe(exc))
            else:
                wrong = verdict(measured, allowed[mode])
                worst = max(measured[n] / allowed[mode][n] for n in allowed[mode])
                record.update(outcome=common.MISMATCH if wrong else common.PASS, error_over_allowed=round(worst, 3))
                if wrong:
                    record["error"] = "; ".join(wrong[:5])
            record["first_call_seconds"] = round(time.perf_counter() - started, 2)
            record.update(common.backend_facts())


# ---------------------------------------------------------------- parent


def summarise(records: dict[str, dict], chosen: dict[str, str]) -> dict:
    counted = [r for r in records.values() if r["phases"].get("eager", {}).get("outcome") == common.PASS]
    summary: dict[str, Any] = {"families": len(chosen), "models": len(records),
                               "eager_failed": len(records) - len(counted)}
    for mode in MODES:
        phases = [r["phases"].get(f"tpu:{mode}", {}) for r in counted]
        counts = common.count(p.get("outcome", common.SKIPPED) for p in phases)
        counts["ran"] = len(phases)
        counts["fully_lowered"] = sum(p.get("outcome") == common.PASS and not p.get("fallbacks") for p in phases)
        counts["graph_breaks"] = sum(p.get("graph_breaks", 0) > 0 for p in phases)
        counts["failed"] = sorted(f"{r['id']}: {p.get('outcome')}: {p.get('error', '').split('; ')[0][:200]}"
                                  for r, p in zip(counted, phases) if p.get("outcome") != common.PASS)
        counts["fallback_ops"] = common.fallback_ops(counted, phases)
        summary[mode] = counts
    return summary


def table(summary: dict) -> str:
    header = ["mode", "models", "pass", "mismatch", "error", "crash", "timeout", "fully lowered",
              "with a graph break"]
    rows = []
    for mode in MODES:
        c = summary[mode]
        rows.append([mode, c["ran"], f"**{c['pass']}** ({common.pct(c['pass'], c['ran'])})", c["mismatch"],
                     c["error"], c["crash"], c["timeout"],
                     f"{c['fully_lowered']} ({common.pct(c['fully_lowered'], c['ran'])})", c["graph_breaks"]])
    lines = [common.markdown_table(header, rows), ""]
    for mode in MODES:
        c = summary[mode]
        if c["failed"]:
            lines.append(f"{mode}, not passing: " + "; ".join(c["failed"]))
        if c["fallback_ops"]:
            lines.append(f"{mode}, ops in eager: " + "; ".join(
                f"`{op}` ({', '.join(ids)})" for op, ids in c["fallback_ops"].items()))
    return "\n".join(lines)


def main(argv: Optional[list[str]] = None) -> None:
    parser = common.sweep_parser(argv, run_task, __doc__)
    if parser is None:
        return
    parser.add_argument("--models", help="comma-separated timm model names (default: one per family)")
    parser.add_argument("--max-params", type=float, default=60e6,
                        help="leave out models with more parameters than this (default 60M)")
    parser.add_argument("--timeout", type=float, default=900.0, help="seconds per phase")
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT)
    parser.add_argument("--write-docs", action="store_true", help="put the table in docs/coverage.md")
    parser.add_argument("--update", action="store_true",
                        help="keep the records of --out's models that this run does not redo")
    common.add_worker_arguments(parser)
    parser.set_defaults(chunk=1)  # one model per worker process: their compiles share nothing
    args = parser.parse_args(argv)

    started = time.perf_counter()
    timm, stand_ins = import_timm()
    chosen = ({name: name for name in args.models.split(",")} if args.models
              else families(timm, args.max_params))
    print(f"{len(chosen)} models, chosen in {time.perf_counter() - started:.0f} s", flush=True)
    phases = ["eager"] + [f"tpu:{m}" for m in MODES]
    tasks = [{"id": name, "phases": phases, "depends": {p: "eager" for p in phases[1:]},
              "reference": ["eager"], "timeout": args.timeout} for name in chosen.values()]

    def progress(record: dict, done: int, total: int) -> None:
        cells = " ".join(f"{p}={record['phases'].get(p, {}).get('outcome', '?')}" for p in phases)
        note = next((record["phases"][p].get("error", "") for p in phases
                     if record["phases"].get(p, {}).get("outcome") not in (None, common.PASS)), "")
        print(f"[{done}/{total}] {record['id']}: {cells} {note[:200]}", flush=True)

    with common.scratch_dir(args.keep_logs) as scratch:
        records = common.run_tasks(tasks, [sys.executable, str(Path(__file__).resolve()), "--worker"],
                                   jobs=args.jobs, chunk=args.chunk, env=common.worker_env(scratch, args),
                                   workdir=scratch / "logs", timeout=args.timeout, progress=progress)
    meta = {**common.environment(), "timm": timm.__version__, "stand_ins": stand_ins, "batch": BATCH,
            "verdict": {"floor": FLOOR, "float32_tolerance": FLOAT32_TOLERANCE, "reroundings": REROUNDINGS},
            "selection": {"families": chosen, "max_params": args.max_params, "partial": bool(args.models)},
            "jobs": args.jobs, "eager_kernels": args.eager_kernels, "timeout": args.timeout,
            "seconds": round(time.perf_counter() - started, 1)}
    if args.update and args.out.exists():
        previous = json.loads(args.out.read_text())
        records, meta = common.updated(previous, "models", records, meta)
        chosen = previous["meta"]["selection"]["families"]
    summary = summarise(records, chosen)
    text = table(summary)
    common.finish(args.out, meta, summary, "models", records, text, f"{len(tasks)} models",
                  seconds=time.perf_counter() - started)
    if args.write_docs:
        common.replace_between_markers(RESULTS_PAGE, MARKERS, text)


if __name__ == "__main__":
    main()
