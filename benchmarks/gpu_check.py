"""One short run on an NVIDIA machine: the model suite on CUDA, and speed vs Inductor.

Installs nothing: run it where tpu_inductor is installed with the ``[cuda]``
extra (jax's CUDA plugin) and a CUDA build of torch. For every model of the
model suite (tests/models.py) it runs eager, ``backend="inductor"`` and
``backend="tpu"`` (platform auto-selected: CUDA inputs pick jax's CUDA
client) on the same inputs, checks tpu's inference output and training
gradients against eager, and prints median step times and paired ratios.

    python benchmarks/gpu_check.py               # on the GPU machine
    python benchmarks/gpu_check.py --device cpu  # dry run of the same code here

Writes JSON (``--out``) so the numbers can go into the README.
"""

from __future__ import annotations

import argparse
import copy
import json
import statistics
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))

from models import MODELS  # noqa: E402  (the model suite's own builders)

# Same tolerances as tests/test_models.py (float32 reorderings in dot/conv);
# TF32 is off below so CUDA matmuls stay float32.
RTOL, ATOL = 1e-4, 1e-5


def _synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def median_seconds(fn, device: torch.device, repeats: int) -> float:
    fn()
    _synchronize(device)
    times = []
    for _ in range(repeats):
        started = time.perf_counter()
        fn()
        _synchronize(device)
        times.append(time.perf_counter() - started)
    return statistics.median(times)


def check_model(name: str, device: torch.device, repeats: int) -> dict:
    model, inputs, targets, loss_fn = MODELS[name](0)
    model = model.to(device)
    inputs = [x.to(device) for x in inputs]
    targets = targets.to(device)
    result: dict = {"model": name}

    # Correctness: inference and one training step's gradients against eager.
    model.eval()
    with torch.no_grad():
        expected = model(*inputs)
        compiled = torch.compile(copy.deepcopy(model), backend="tpu", options={"cache": False})
        torch.testing.assert_close(compiled(*inputs), expected, rtol=RTOL, atol=ATOL)
    model.train()
    trained = copy.deepcopy(model)
    loss_fn(torch.compile(trained, backend="tpu", options={"cache": False})(*inputs), targets).backward()
    loss_fn(model(*inputs), targets).backward()
    for (param_name, p), q in zip(model.named_parameters(), trained.parameters()):
        if p.grad is not None:
            torch.testing.assert_close(q.grad, p.grad, rtol=RTOL, atol=ATOL, msg=lambda m: f"{param_name}: {m}")
    result["matches_eager"] = True

    # Speed: inference step, eager vs inductor vs tpu, timed in the same run.
    model.eval()
    paths = {
        "eager": model,
        "inductor": torch.compile(copy.deepcopy(model), backend="inductor"),
        "tpu": torch.compile(copy.deepcopy(model), backend="tpu"),
    }
    with torch.no_grad():
        for path, fn in paths.items():
            result[f"{path}_ms"] = 1e3 * median_seconds(lambda: fn(*inputs), device, repeats)
    result["tpu_vs_eager"] = result["eager_ms"] / result["tpu_ms"]
    result["tpu_vs_inductor"] = result["inductor_ms"] / result["tpu_ms"]
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda", help="cuda (default) or cpu for a dry run")
    parser.add_argument("--repeats", type=int, default=20)
    parser.add_argument("--models", nargs="*", default=sorted(MODELS))
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results" / "gpu_check.json")
    args = parser.parse_args()

    device = torch.device(args.device)
    if device.type == "cuda":
        if not torch.cuda.is_available():
            sys.exit("no CUDA device visible to torch: run on the NVIDIA machine, or --device cpu")
        torch.backends.cuda.matmul.allow_tf32 = False
        torch.backends.cudnn.allow_tf32 = False
    results = []
    for name in args.models:
        torch._dynamo.reset()
        try:
            results.append(check_model(name, device, args.repeats))
        except Exception as exc:  # report every model, not just the first failure
            results.append({"model": name, "matches_eager": False, "error": f"{type(exc).__name__}: {exc}"[:500]})
        row = results[-1]
        if "error" in row:
            print(f"{name:22} FAILED {row['error']}")
        else:
            print(
                f"{name:22} eager {row['eager_ms']:7.2f} ms  inductor {row['inductor_ms']:7.2f} ms  "
                f"tpu {row['tpu_ms']:7.2f} ms  tpu/eager {row['tpu_vs_eager']:.2f}x  "
                f"tpu/inductor {row['tpu_vs_inductor']:.2f}x"
            )
    timed = [r for r in results if "tpu_ms" in r]
    if timed:
        geomean = lambda xs: statistics.geometric_mean(xs)  # noqa: E731
        print(
            f"geomean speedup: tpu vs eager {geomean([r['tpu_vs_eager'] for r in timed]):.2f}x, "
            f"vs inductor {geomean([r['tpu_vs_inductor'] for r in timed]):.2f}x; "
            f"{sum(r['matches_eager'] for r in results)}/{len(results)} models match eager"
        )
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({"device": str(device), "results": results}, indent=1))
    sys.exit(0 if all(r["matches_eager"] for r in results) else 1)


if __name__ == "__main__":
    main()
