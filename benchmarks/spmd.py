"""The same data-parallel training step on 1, 2 and 4 devices (issue 23).

Each device count runs in a fresh process with ``options={"mesh": {"data":
n}}`` (no mesh for 1 device): a model, SGD, ``--steps`` timed steps after
two warm-up steps. It prints the median step time (wall clock, default
settings: nothing pinned) and the collectives XLA put in each compiled
graph, counted from its HLO (``IslandRecord.collectives``), and checks every
loss against single-device eager PyTorch.

On this 2-core machine the point is correctness and the HLO: jaxlib's CPU
devices share the same cores, so more devices is not faster. On a machine
with several accelerators the same table shows the scaling.

Run: python benchmarks/spmd.py [--steps 20] [--json benchmarks/results/spmd.json]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DEVICES = (1, 2, 4)
MODELS = ("mlp", "transformer")

_CHILD = r"""
import copy, json, statistics, sys, time
import torch
import tpu_inductor

model_name, devices, steps = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
torch.manual_seed(0)
if model_name == "mlp":
    model = torch.nn.Sequential(torch.nn.Linear(256, 1024), torch.nn.ReLU(), torch.nn.Linear(1024, 256))
    x, target = torch.randn(64, 256), torch.randn(64, 256)
else:
    layer = torch.nn.TransformerEncoderLayer(d_model=128, nhead=4, dim_feedforward=512, dropout=0.0, batch_first=True)
    model = torch.nn.Sequential(layer, torch.nn.Linear(128, 128))
    x, target = torch.randn(16, 32, 128), torch.randn(16, 32, 128)
reference = copy.deepcopy(model)
options = {"cache": False, "strict": True, **({"mesh": {"data": devices}} if devices > 1 else {})}
compiled = torch.compile(model, backend="tpu", options=options)

def run(m, optimizer):
    loss = torch.nn.functional.mse_loss(m(x), target)
    loss.backward()
    optimizer.step()
    optimizer.zero_grad()
    return loss.item()

optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
reference_optimizer = torch.optim.SGD(reference.parameters(), lr=0.01)
seconds, worst = [], 0.0
for step in range(steps + 2):
    started = time.perf_counter()
    loss = run(compiled, optimizer)
    if step >= 2:
        seconds.append(time.perf_counter() - started)
    expected = run(reference, reference_optimizer)
    worst = max(worst, abs(loss - expected) / max(abs(expected), 1e-12))
collectives = {
    g.kind: {name: sum((i.collectives or {}).get(name, 0) for i in g.islands)
             for name in sorted({n for i in g.islands for n in (i.collectives or {})})}
    for g in tpu_inductor.report.current().graphs
}
print(json.dumps({"step_ms": statistics.median(seconds) * 1e3, "loss_rel_diff": worst, "collectives": collectives}))
"""


def _measure(model: str, devices: int, steps: int) -> dict:
    done = subprocess.run(
        [sys.executable, "-c", _CHILD, model, str(devices), str(steps)],
        capture_output=True, text=True, cwd=ROOT, timeout=600,
    )
    if done.returncode != 0:
        return {"error": (done.stderr.strip().splitlines() or ["exit " + str(done.returncode)])[-1]}
    return json.loads(done.stdout.strip().splitlines()[-1])


def _collectives(row: dict) -> str:
    parts = [
        f"{kind}: " + (", ".join(f"{name} x{n}" for name, n in counts.items()) or "none")
        for kind, counts in row.get("collectives", {}).items()
    ]
    return "; ".join(parts)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--json", type=Path, help="write the results here")
    args = parser.parse_args()
    results = {model: {str(n): _measure(model, n, args.steps) for n in DEVICES} for model in MODELS}
    print("| model | devices | step ms (median) | loss vs eager (rel.) | collectives in the compiled graphs |")
    print("| --- | --- | --- | --- | --- |")
    for model, rows in results.items():
        for devices, row in rows.items():
            if "error" in row:
                print(f"| {model} | {devices} | error: {row['error']} | | |")
                continue
            print(
                f"| {model} | {devices} | {row['step_ms']:.2f} | {row['loss_rel_diff']:.1e} | {_collectives(row)} |"
            )
    if args.json:
        args.json.write_text(json.dumps(results, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
