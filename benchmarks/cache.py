"""First-call latency, cold vs warm, as a user waits for it (issue 22).

Each (backend, model) pair runs in a fresh process twice: first on empty cache
directories (cold), then again on the same directories (warm), the way a
restarted server or the next rank of a job starts. The number is the wall
time of the model's first call (for a training step: forward, loss and
backward), which holds everything a user waits for: Dynamo's trace,
AOTAutograd (or its cache), the backend, and the imports the first call
triggers. The headline is ``first_result``, from ``torch.compile(...)`` (which
imports the backend, and where PyTorch's precompile loads) to the first
call's result; ``first_call`` alone is beside it. The process's start,
``import torch`` and ``torch._dynamo`` come before and are the same for every
backend.

tpu uses both its own cache directory (StableHLO and executables) and
PyTorch's (``TORCHINDUCTOR_CACHE_DIR``: AOTAutograd's traced graphs);
Inductor uses PyTorch's (AOTAutograd and FX graph caches). Both point at a
fresh directory per cold/warm pair. Medians over ``--repeats`` pairs, the
pairs of both backends interleaved.

Bars: tpu's warm first call <= 25% of its cold one, and <= Inductor's warm,
for each model.

Run: python benchmarks/cache.py [--repeats 3] [--json benchmarks/results/cache.json]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Callable

ROOT = Path(__file__).resolve().parent.parent
BACKENDS = ("tpu", "inductor")
MODELS = ("quickstart (inference)", "llama (inference)", "llama (train step)", "cnn (train step)")


def _quickstart() -> tuple[Any, Callable]:
    import torch

    sys.path.insert(0, str(ROOT / "examples"))
    from quickstart import TinyTransformer

    model = TinyTransformer().eval()
    tokens = torch.randint(0, 1000, (4, 64))

    def step(fn):
        with torch.no_grad():
            return fn(tokens)

    return model, step


def _llama(train: bool) -> tuple[Any, Callable]:
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(
        vocab_size=1000, hidden_size=128, intermediate_size=256, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128,
    )
    model = LlamaForCausalLM(config).train(train)
    tokens = torch.randint(0, 1000, (2, 32))

    def step(fn):
        if not train:
            with torch.no_grad():
                return fn(input_ids=tokens, use_cache=False).logits
        loss = fn(input_ids=tokens, labels=tokens, use_cache=False).loss
        loss.backward()
        return loss.detach()

    return model, step


def _cnn() -> tuple[Any, Callable]:
    import torch
    import torch.nn as nn

    model = nn.Sequential(
        nn.Conv2d(3, 16, 3, padding=1), nn.BatchNorm2d(16), nn.ReLU(), nn.MaxPool2d(2),
        nn.Conv2d(16, 32, 3, padding=1), nn.BatchNorm2d(32), nn.ReLU(),
        nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(32, 10),
    ).train()
    images, labels = torch.randn(8, 3, 32, 32), torch.randint(0, 10, (8,))

    def step(fn):
        loss = torch.nn.functional.cross_entropy(fn(images), labels)
        loss.backward()
        return loss.detach()

    return model, step


def _build(name: str) -> tuple[Any, Callable]:
    import torch

    torch.manual_seed(0)
    if name == "quickstart (inference)":
        return _quickstart()
    if name.startswith("llama"):
        return _llama(train="train" in name)
    return _cnn()


def child(backend: str, model_name: str) -> None:
    """One fresh process: the first call of one model, as JSON on the last line."""
    import copy

    import torch
    import torch._dynamo  # torch.compile imports it: the same for every backend, so not timed
    from torch._dynamo.utils import counters

    model, step = _build(model_name)
    reference = copy.deepcopy(model)
    started = time.perf_counter()
    compiled = torch.compile(model, backend=backend)  # imports the backend; precompile loads here
    called = time.perf_counter()
    got = step(compiled)
    done = time.perf_counter()
    torch.testing.assert_close(got, step(reference), rtol=2e-3, atol=2e-3)
    if torch._dynamo.config.caching_precompile:
        torch.compiler.save_cache_artifacts()  # what writes precompile's Dynamo entries
    result: dict[str, Any] = {
        "first_result": done - started,
        "first_call": done - called,
        "aot_autograd": dict(counters["aot_autograd"]),
        "dynamo_cache": dict(counters["dynamo_cache"]),
    }
    if backend == "tpu":
        from tpu_inductor import report

        record = report.current()
        result["stages"] = {k: round(v, 4) for k, v in record.stage_seconds.items()}
        result["islands"] = [f"{i.lower_source}/{i.compile_source}" for i in record.islands()]
        result["cache_events"] = {
            level: sum(e.hit for e in record.cache_events if e.level == level)
            for level in ("traced", "graph", "executable")
        }
    print(json.dumps(result))


MODES = {"default": {}, "precompile": {"TORCH_CACHING_PRECOMPILE": "1"}}
"""``default``: nothing set, the headline. ``precompile``: PyTorch's own
precompile (experimental, opt-in), which also skips Dynamo on a warm start."""


def _run_child(backend: str, model: str, cache_dir: Path, mode: str) -> dict:
    """One process's result; ``{"error": ...}`` when it failed."""
    env = {**os.environ, **MODES[mode]}
    env["TORCHINDUCTOR_CACHE_DIR"] = str(cache_dir / "torch")
    env["TPU_INDUCTOR_CACHE_DIR"] = str(cache_dir / "tpu")
    out = subprocess.run(
        [sys.executable, __file__, "--child", backend, model],
        capture_output=True, text=True, env=env,
    )
    if out.returncode != 0:
        last = [line for line in out.stderr.strip().splitlines() if line.strip()][-1:]
        return {"error": last[0] if last else f"exit status {out.returncode}"}
    return json.loads(out.stdout.strip().splitlines()[-1])


def _median(results: list[dict]) -> float | None:
    times = [r["first_result"] for r in results if "error" not in r]
    return statistics.median(times) if len(times) == len(results) else None


def _cell(value: float | None, width: int = 10, form: str = "{:.3f}") -> str:
    return (form.format(value) if value is not None else "failed").rjust(width)


def _table(mode: str, runs: dict, models: list[str]) -> tuple[dict, bool]:
    print(f"\n{mode}: torch.compile to first result, seconds")
    print(f"{'model':24} {'tpu cold':>9} {'tpu warm':>9} {'warm/cold':>10} {'ind. cold':>10} "
          f"{'ind. warm':>10} {'tpu/ind. warm':>14}")
    medians: dict[str, dict[str, float | None]] = {}
    met = True
    for model in models:
        values = {f"{b} {p}": _median(runs[model][b][p]) for b in BACKENDS for p in ("cold", "warm")}
        if values["tpu warm"] is None or values["tpu cold"] is None:
            errors = {r["error"] for b in BACKENDS for p in ("cold", "warm") for r in runs[model][b][p] if "error" in r}
            print(f"{model:24} failed: {'; '.join(sorted(errors))[:200]}")
            medians[model] = values
            met = False
            continue
        ratio = values["tpu warm"] / values["tpu cold"]
        inductor = values["inductor warm"]
        versus = values["tpu warm"] / inductor if inductor else None
        medians[model] = {**values, "tpu warm/cold": ratio, "tpu warm/inductor warm": versus}
        met &= ratio <= 0.25 and (versus is None or versus <= 1.0)
        print(f"{model:24} {_cell(values['tpu cold'], 9)} {_cell(values['tpu warm'], 9)} "
              f"{_cell(ratio, 10, '{:.1%}')} {_cell(values['inductor cold'])} {_cell(inductor)} "
              f"{_cell(versus, 14, '{:.2f}')}")
        warm = runs[model]["tpu"]["warm"][-1]
        print(f"{'':24} tpu warm: stages {warm['stages']}, cache hits {warm['cache_events']}")
    return medians, met


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=3, help="cold/warm process pairs per backend and model")
    parser.add_argument("--models", nargs="*", default=list(MODELS), choices=MODELS)
    parser.add_argument("--modes", nargs="*", default=list(MODES), choices=list(MODES))
    parser.add_argument("--json", type=Path, help="write the runs and medians here")
    parser.add_argument("--child", nargs=2, metavar=("BACKEND", "MODEL"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child(*args.child)
        return 0

    load_start = os.getloadavg()[0]
    runs = {
        mode: {m: {b: {"cold": [], "warm": []} for b in BACKENDS} for m in args.models} for mode in args.modes
    }
    for _ in range(args.repeats):
        for mode in args.modes:
            for model in args.models:
                for backend in BACKENDS:
                    with tempfile.TemporaryDirectory(prefix="tpu_inductor_cache_bench_") as directory:
                        for phase in ("cold", "warm"):
                            result = _run_child(backend, model, Path(directory), mode)
                            runs[mode][model][backend][phase].append(result)
    print(f"medians of {args.repeats} cold/warm process pairs "
          f"(load average {load_start:.2f} at start, {os.getloadavg()[0]:.2f} at end)")
    medians, verdicts = {}, {}
    for mode in args.modes:
        medians[mode], verdicts[mode] = _table(mode, runs[mode], args.models)
        print(f"bars (warm <= 25% of cold and <= Inductor's warm, every model): "
              f"{'met' if verdicts[mode] else 'NOT met'}")
    if args.json:
        args.json.write_text(json.dumps({"repeats": args.repeats, "medians": medians, "runs": runs}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
