"""Changing shapes: traces, lowerings and compiles, and first-pass time (issue 4).

Two workloads, each called once per size in a fixed random order:

(a) an MLP (64 -> 256 -> 256 -> 10) called with batch sizes 1..64;
(b) a 2-layer causal transformer (examples/quickstart.py: dim 128, 4 heads,
    vocab 1000) called with batch 2 and 30 random sequence lengths in 5..200.

For each, backend="tpu", backend="inductor" and eager run the same sequence in
fresh processes (no compiled code, no cache directory, an empty Inductor cache:
every compile is cold). Printed: Dynamo traces, torch-mlir lowerings and XLA
compiles (counted from tpu_inductor.report), the total time of the first pass
including every compile, the time of a second pass over the same sizes, and
whether every output matched eager (rtol 1e-4, atol 1e-5). The bars: (a) <= 2
traces and <= 7 XLA compiles, (b) <= 2 traces and <= 9 XLA compiles, first
pass faster than Inductor's, every output equal to eager's.

Dynamo's default (dynamic=None) traces the first call static and specialises
size 1 into a graph of its own, so (a) is also run with dynamic=True, with
mark_dynamic on the batch dim, and with Dynamo's
``torch.fx.experimental._config.backed_size_oblivious`` (size 1 stays in the
symbolic graph).

Run: python benchmarks/dynamic.py [--quick]   (--quick: default mode only)
"""

from __future__ import annotations

import argparse
import json
import os
import random
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
TOLERANCE = dict(rtol=1e-4, atol=1e-5)
BARS = {"mlp": (2, 7), "transformer": (2, 9)}


def _workload(name: str):
    """(model, list of input tuples) with fixed seeds."""
    import torch
    import torch.nn as nn

    torch.manual_seed(0)
    if name == "mlp":
        model = nn.Sequential(
            nn.Linear(64, 256), nn.ReLU(), nn.Linear(256, 256), nn.ReLU(), nn.Linear(256, 10)
        ).eval()
        sizes = list(range(1, 65))
        random.Random(0).shuffle(sizes)
        generator = torch.Generator().manual_seed(1)
        return model, [(torch.randn(b, 64, generator=generator),) for b in sizes]
    sys.path.insert(0, str(ROOT / "examples"))
    from quickstart import TinyTransformer

    model = TinyTransformer().eval()
    rng = random.Random(0)
    lengths = [rng.randint(5, 200) for _ in range(30)]
    generator = torch.Generator().manual_seed(1)
    return model, [(torch.randint(0, 1000, (2, n), generator=generator),) for n in lengths]


def _run(workload: str, backend: str, mode: str) -> dict:
    """One cold run in this process; returns the measurements."""
    import torch

    # One intra-op thread everywhere: on a shared 2-core machine, OpenMP's
    # spin-waiting makes even a 1 MB copy swing between 0.02 and 10 ms.
    torch.set_num_threads(1)
    if mode == "size-oblivious":
        import torch.fx.experimental._config as fx_config

        fx_config.backed_size_oblivious = True  # size 1 joins the symbolic graph
    model, inputs = _workload(workload)
    with torch.no_grad():
        expected = [model(*args) for args in inputs]
    if backend == "eager":
        fn = model
    else:
        options = {"cache": False} if backend == "tpu" else None
        fn = torch.compile(model, backend=backend, options=options, dynamic=True if mode == "dynamic=True" else None)

    def one_pass() -> tuple[float, list]:
        outputs = []
        started = time.perf_counter()
        with torch.no_grad():
            for index, args in enumerate(inputs):
                if mode == "mark_dynamic" and index == 0 and backend != "eager":
                    torch._dynamo.mark_dynamic(args[0], 0)
                outputs.append(fn(*args))
        return time.perf_counter() - started, outputs

    first, outputs = one_pass()
    second, _ = one_pass()
    matched = all(
        got.shape == want.shape and torch.allclose(got, want, **TOLERANCE)
        for got, want in zip(outputs, expected)
    )
    worst = max(float((g - w).abs().max()) for g, w in zip(outputs, expected) if g.shape == w.shape)
    result = {"first": first, "second": second, "matched": matched, "max_abs_diff": worst}
    if backend == "tpu":
        import tpu_inductor.report as report

        result.update(report.compile_counts())
        result["buckets"] = sorted({tuple(r.bucket.values())[0] for r in report.current().recompiles if r.bucket})
    elif backend == "inductor":
        from torch._dynamo.utils import counters

        result["dynamo_traces"] = int(counters["stats"]["unique_graphs"])
    return result


def _fresh_process(workload: str, backend: str, mode: str) -> dict:
    env = dict(os.environ)
    with tempfile.TemporaryDirectory() as cache:
        env.update(
            TORCHINDUCTOR_CACHE_DIR=cache,  # empty: Inductor compiles cold
            TORCHINDUCTOR_FX_GRAPH_CACHE="0",
            TPU_INDUCTOR_CACHE_DIR=cache,
            PYTHONPATH=str(ROOT),
        )
        out = subprocess.run(
            [sys.executable, __file__, "--child", workload, backend, mode],
            env=env, capture_output=True, text=True,
        )
    if out.returncode != 0:
        raise SystemExit(f"{workload}/{backend}/{mode} failed:\n{out.stderr[-3000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="Dynamo's default mode only")
    parser.add_argument("--child", nargs=3, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(_run(*args.child)))
        return
    runs = [("mlp", "default"), ("transformer", "default")]
    if not args.quick:
        runs[1:1] = [("mlp", "dynamic=True"), ("mlp", "mark_dynamic"), ("mlp", "size-oblivious")]
    header = (
        f"{'workload':<12} {'mode':<15} {'backend':<9} {'traces':>6} {'lower':>5} {'XLA':>4} "
        f"{'1st pass s':>10} {'2nd pass s':>10}  eager-equal  buckets"
    )
    print(header)
    print("-" * len(header))
    verdicts = []
    for workload, mode in runs:
        results = {b: _fresh_process(workload, b, mode) for b in ("tpu", "inductor", "eager")}
        for backend, r in results.items():
            print(
                f"{workload:<12} {mode:<15} {backend:<9} {r.get('dynamo_traces', '-'):>6} "
                f"{r.get('torch_mlir_lowerings', '-'):>5} {r.get('xla_compiles', '-'):>4} "
                f"{r['first']:>10.2f} {r['second']:>10.3f}  {str(r['matched']):<11}  "
                f"{r.get('buckets', '')}"
            )
        tpu, inductor = results["tpu"], results["inductor"]
        max_traces, max_compiles = BARS[workload]
        checks = {
            f"traces {tpu['dynamo_traces']} <= {max_traces}": tpu["dynamo_traces"] <= max_traces,
            f"XLA compiles {tpu['xla_compiles']} <= {max_compiles}": tpu["xla_compiles"] <= max_compiles,
            f"first pass {tpu['first']:.1f}s < Inductor {inductor['first']:.1f}s": tpu["first"] < inductor["first"],
            "every output equal to eager": tpu["matched"],
        }
        verdicts.append((workload, mode, checks))
    print()
    for workload, mode, checks in verdicts:
        status = "meets the bars" if all(checks.values()) else "MISSES a bar"
        details = "; ".join(f"{'ok' if ok else 'NO'}: {text}" for text, ok in checks.items())
        print(f"{workload} ({mode}): {status} -- {details}")


if __name__ == "__main__":
    main()
