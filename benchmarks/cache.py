"""Cold vs warm compile time with the compiled-artifact cache directory (issue 5).

Compiles the quickstart transformer (inference) and a small CNN (one training
step: forward and backward graphs) in a fresh process with an empty cache
directory, then again in a second fresh process on the same directory, and
prints the backend's compile time for both. The bar: warm <= 10% of cold.

"Backend" is tpu_inductor's own work per ATen graph (passes, partitioning,
torch-mlir lowering, XLA compile -- or, warm, the cache lookups that replace the
last two); it is what the cache can remove. Tracing by Dynamo and AOTAutograd
happens before the backend sees a graph and is the same cold or warm; it is
reported separately. Each pair of processes is repeated (--repeats) and the
medians are printed, because other work on the machine makes single timings noisy.

Run: python benchmarks/cache.py [--repeats 3]
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def _models():
    import torch
    import torch.nn as nn

    sys.path.insert(0, str(ROOT / "examples"))
    from quickstart import TinyTransformer

    class SmallCNN(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.features = nn.Sequential(
                nn.Conv2d(3, 16, 3, padding=1), nn.BatchNorm2d(16), nn.ReLU(), nn.MaxPool2d(2),
                nn.Conv2d(16, 32, 3, padding=1), nn.BatchNorm2d(32), nn.ReLU(),
                nn.AdaptiveAvgPool2d(1), nn.Flatten(),
            )
            self.head = nn.Linear(32, 10)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.head(self.features(x))

    torch.manual_seed(0)
    transformer = TinyTransformer().eval()
    tokens = torch.randint(0, 1000, (4, 64))

    def transformer_step(fn):
        with torch.no_grad():
            return fn(tokens)

    cnn = SmallCNN().train()
    images, labels = torch.randn(8, 3, 32, 32), torch.randint(0, 10, (8,))

    def cnn_step(fn):
        loss = torch.nn.functional.cross_entropy(fn(images), labels)
        loss.backward()
        return loss.detach()

    return [("transformer (inference)", transformer, transformer_step), ("cnn (train step)", cnn, cnn_step)]


def child(cache_dir: str) -> None:
    """One fresh process: compile both models, print timings as JSON."""
    import torch

    import tpu_inductor.compiled_graph as compiled_graph
    import tpu_inductor.report as report

    backend_seconds = [0.0]
    build = compiled_graph.build_compiled_graph

    def timed_build(*args, **kwargs):
        started = time.perf_counter()
        try:
            return build(*args, **kwargs)
        finally:
            backend_seconds[0] += time.perf_counter() - started

    compiled_graph.build_compiled_graph = timed_build  # time our backend per ATen graph
    results = {}
    for name, model, step in _models():
        torch._dynamo.reset()
        report.reset()
        backend_seconds[0] = 0.0
        compiled = torch.compile(model, backend="tpu", options={"cache_dir": cache_dir})
        started = time.perf_counter()
        got = step(compiled)
        first = time.perf_counter() - started
        started = time.perf_counter()
        step(compiled)
        steady = time.perf_counter() - started
        torch.testing.assert_close(got, step(model), rtol=1e-4, atol=1e-4)
        record = report.current()
        results[name] = {
            "first_call": first,
            "backend": backend_seconds[0],
            "tracing": max(first - backend_seconds[0] - steady, 0.0),
            "lower": sum(i.lower_seconds for i in record.islands()),
            "compile": sum(i.compile_seconds for i in record.islands()),
            "islands": [f"{i.lower_source}/{i.compile_source}" for i in record.islands()],
            "hits": record.cache_hits(),
            "misses": record.cache_misses(),
        }
    print(json.dumps(results))


def _run_child(cache_dir: str) -> dict:
    out = subprocess.run(
        [sys.executable, __file__, "--child", cache_dir], capture_output=True, text=True, check=True
    )
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=3, help="cold/warm process pairs (median)")
    parser.add_argument("--child", metavar="CACHE_DIR", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child(args.child)
        return 0

    runs: dict[str, list[dict]] = {"cold": [], "warm": []}
    for _ in range(args.repeats):
        with tempfile.TemporaryDirectory(prefix="tpu_inductor_cache_bench_") as cache_dir:
            runs["cold"].append(_run_child(cache_dir))
            runs["warm"].append(_run_child(cache_dir))
    models = list(runs["cold"][0])

    def median(phase: str, model: str, field: str) -> float:
        return statistics.median(r[model][field] for r in runs[phase])

    print(f"medians of {args.repeats} cold/warm process pairs; seconds")
    header = f"{'model':26} {'':5} {'backend':>8} {'lower':>7} {'compile':>8} {'tracing':>8} {'1st call':>9}  islands (lowered/compiled from)"
    print(header)
    for model in models:
        for phase in ("cold", "warm"):
            last = runs[phase][-1][model]
            print(
                f"{model:26} {phase:5} {median(phase, model, 'backend'):8.3f} "
                f"{median(phase, model, 'lower'):7.3f} {median(phase, model, 'compile'):8.3f} "
                f"{median(phase, model, 'tracing'):8.3f} {median(phase, model, 'first_call'):9.3f}  "
                f"{','.join(last['islands'])}"
            )
    cold = sum(median("cold", m, "backend") for m in models)
    warm = sum(median("warm", m, "backend") for m in models)
    ratio = warm / cold
    print(
        f"backend compile time, both models: cold {cold:.3f} s, warm {warm:.3f} s, "
        f"warm/cold = {ratio:.1%} (bar: <= 10%: {'met' if ratio <= 0.10 else 'NOT met'})"
    )
    tracing = [sum(median(p, m, "tracing") for m in models) for p in ("cold", "warm")]
    print(f"Dynamo + AOTAutograd tracing (not cached by tpu_inductor): cold {tracing[0]:.3f} s, warm {tracing[1]:.3f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
