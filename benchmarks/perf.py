"""Steady-state speed, per-call overhead and compile time against eager, Inductor and JAX (issue 7).

Why: the other benchmarks check that tpu_inductor compiles and caches; this one
says whether what it produces is fast. The same workloads run, in one process
and one run, through four paths:

- ``eager``     -- the PyTorch module itself;
- ``inductor``  -- ``torch.compile(m, backend="inductor")``;
- ``tpu``       -- ``torch.compile(m, backend="tpu")`` (PJRT, jaxlib's CPU client here);
- ``jax``       -- the same computation written directly in JAX under ``jax.jit``,
  with the same weights (the torch module's state_dict through numpy) passed as
  arguments. It is the limit for our path: XLA on the same StableHLO-level
  program without PyTorch in front. At startup every path's output is checked
  against eager's (rtol/atol 1e-4), so the comparison is of one computation.

Workloads (float32, fixed seeds, inference in eval mode under no_grad):

- ``overhead``: ``x + 1`` on a (4,) tensor -- the cost of one call;
- ``mlp``: 3 Linear 1024x1024 layers with ReLU between, batch 64;
- ``decoder``: GPT-style, 2 pre-LN blocks, d=256, 4 heads, causal attention
  (``F.scaled_dot_product_attention(is_causal=True)``; JAX: explicit softmax under
  a causal mask), GELU MLP 4d, learned positions, untied LM head over 1000 tokens;
  seq 128, batch 4;
- ``decode``: the same decoder on one token, batch 1 -- the shape of a
  generation step (without a KV cache), where every Linear multiplies a single
  row; not part of the bars;
- ``mobilenet``: MobileNetV3-style (issue 21): a stride-2 3x3 stem, 7 inverted
  residual blocks (1x1 expand, depthwise 3x3 or 5x5, squeeze-excite on the
  last five, 1x1 project; Hardswish), a 1x1 head to 576 channels, average
  pool, Linear to 10; 64x64 images, batch 8; BatchNorm in eval mode (JAX:
  the eval affine transform, grouped convolutions for the depthwise ones);
- ``cnn``: ResNet-style, conv3x3+BN+ReLU stem (32 ch), 3 basic blocks (32, 64,
  128 ch; stride 1, 2, 2; 1x1 conv+BN shortcuts where the shape changes), global
  average pool, Linear to 10; 32x32 images, batch 16. BatchNorm runs in eval mode;
  the JAX version applies it as the eval affine transform computed from the same
  running statistics on every call (not folded into the convolutions), as eager does;
- ``mlp_frozen``, ``cnn_frozen``: the MLP and the CNN with parameters frozen
  where each path offers it: Inductor's ``freezing`` (constants, BatchNorm folded, weights prepacked),
  tpu's ``freeze_parameters`` (parameter-only work kept while the parameters
  are unchanged), JAX with the parameters closed over as constants; not part
  of the bars, which compare default settings;
- ``train``: the MLP's training step: forward, MSE loss, backward and an SGD
  step, the whole step function compiled (JAX: ``value_and_grad`` + SGD, params donated);
- ``dynamic``: the MLP called once for each batch size 1..64 in a fixed random
  order. The first pass includes every compile (Dynamo's default dynamic-shape
  handling for the torch paths; jax.jit compiles each new shape), the second
  runs on what the first compiled. Each path starts from a reset Dynamo and an
  empty in-memory executable cache.

Timing: each path of a workload runs in a process of its own (``paired_rounds.PathWorker``:
a user runs one backend in a process, and paths sharing one slowed each other
through OpenMP's and XLA's threads and glibc's malloc state; ``--one-process``
runs them side by side in this process, as before 2026-12-04). Each path's
first call (the compile) is timed alone, then steady state
is measured in interleaved rounds: every round runs the same number of calls on
each path, in an order rotated from round to round, and records the time per
call. Printed are medians over rounds and *paired* speed ratios: for each round
``other path's time / tpu's time``, then the median over rounds (> 1: tpu is
faster). Cold compile is a path's first-call latency minus its steady per-call
time; Inductor's caches point at a fresh temporary directory with the FX-graph
and AOTAutograd caches off, the tpu backend runs with ``options={"cache": False}``,
so both compile from scratch. One throwaway compile per backend happens first, so
one-time process setup (imports, PJRT client, compiler workers) is in no
workload's number.

Settings: the headline run (no ``--threads``) changes nothing a user would
not: threads, allocator and XLA flags are what each runtime picks by itself
on this machine (issue 21: "measure what users get"); the tpu path's CPU
client fixes glibc's malloc thresholds for its own process, as it does for
any user (runtime/malloc_thresholds.py). ``--threads N`` is the
lab setting beside it: every path gets N intra-op threads --
``torch.set_num_threads`` (eager and Inductor's generated kernels),
``PJRT_NPROC`` for XLA (the size of the PJRT CPU client's pools) plus, for
one thread, ``--xla_cpu_multi_thread_eigen=false`` in ``XLA_FLAGS``, set
before torch, jax or tpu_inductor is imported -- and glibc's malloc
thresholds are pinned: glibc serves blocks above a *dynamic* threshold with
fresh mmap'd pages (page faults on every call) and raises the threshold as
such blocks are freed, so every path's speed depended on what had run before
it in the process (eager's CNN took 29 ms in a fresh process and 17 ms after
the decoder workload); pinned, the thresholds sit where glibc's adjustment
stops (``mallopt``: mmap 32 MiB, trim 64 MiB). Either way the process CPU
time per wall second of each path's timed calls is recorded
(``cpu_per_wall``) and printed as a second table.

Bars (printed with PASS/FAIL). At defaults (issue 21): tpu >= 0.95x eager on
each of mlp, decoder, cnn, mobilenet; their geomean >= 1.1x eager and >=
1.0x Inductor; tiny-graph per-call time at most 1.5x Inductor's; training
step >= 1.0x Inductor; decoder cold compile <= 0.2x Inductor's. Pinned
(``--threads 1``): tpu >= 0.95x jax.jit on each of mlp, decoder, cnn; their
geomean >= 1.1x eager and >= 1.0x Inductor; per-call time no more than
Inductor's; decoder cold compile <= 0.2x Inductor's; training step >= 1.0x eager.

The workloads are built in ``perf_workloads.py`` (models in ``perf_models.py``);
the bars and tables are ``perf_report.py``'s.

Run:
    python benchmarks/perf.py --write-docs              # defaults: benchmarks/results/perf.json, first table
    python benchmarks/perf.py --threads 1 --write-docs  # pinned: perf-1-thread.json, second table
    python benchmarks/perf.py --quick --only mlp,overhead   # development: few rounds, no files
Options: --threads N, --rounds N, --json PATH.
"""

from __future__ import annotations

import argparse
import atexit
import dataclasses
import functools
import json
import os
import platform
import random
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

ROOT = Path(__file__).resolve().parent.parent
DEFAULT_JSON = ROOT / "benchmarks" / "results" / "perf.json"
PINNED_JSON = ROOT / "benchmarks" / "results" / "perf-{threads}-thread.json"
MARKERS = ("<!-- perf-table:start -->", "<!-- perf-table:end -->")
PINNED_MARKERS = ("<!-- perf-table-pinned:start -->", "<!-- perf-table-pinned:end -->")
PINNED = ("XLA_FLAGS", "PJRT_NPROC", "OMP_NUM_THREADS")


def _threads_from_argv(argv: Sequence[str]) -> int:
    """``--threads`` alone, before anything is imported (the full parser comes later)."""
    parser = argparse.ArgumentParser(add_help=False)
    parser.add_argument("--threads", type=int, default=0)
    return parser.parse_known_args(argv)[0].threads


def _pinning_environment(threads: int, environ: Mapping[str, str]) -> dict[str, str]:
    """Variables that give torch, Inductor's kernels and XLA ``threads`` intra-op threads
    (none for 0: defaults), and give Inductor an empty cache directory."""
    inductor_cache = tempfile.mkdtemp(prefix="perf-inductor-")
    atexit.register(shutil.rmtree, inductor_cache, ignore_errors=True)
    if not threads:
        return {"TORCHINDUCTOR_CACHE_DIR": inductor_cache}
    xla_flags = environ.get("XLA_FLAGS", "")
    if threads == 1:
        xla_flags = f"{xla_flags} --xla_cpu_multi_thread_eigen=false"
    return {
        "OMP_NUM_THREADS": str(threads),
        "MKL_NUM_THREADS": str(threads),
        "PJRT_NPROC": str(threads),
        "XLA_FLAGS": xla_flags.strip(),
        "TORCHINDUCTOR_CACHE_DIR": inductor_cache,
    }


# Before torch, jax or tpu_inductor is imported: XLA and OpenMP read these once.
THREADS = _threads_from_argv(sys.argv[1:])
os.environ.update(_pinning_environment(THREADS, os.environ))
if THREADS:  # every path, as the tpu backend's CPU client does for its own process
    from tpu_inductor.runtime.malloc_thresholds import pin  # noqa: E402

    ALLOCATOR = pin()
else:
    ALLOCATOR = {"pinned": False, "why": "defaults (the tpu path's CPU client pins its own: runtime/malloc_thresholds.py)"}

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
import torch  # noqa: E402
import torch._dynamo  # noqa: E402
import torch._functorch.config  # noqa: E402
import torch._inductor.config  # noqa: E402

import tpu_inductor  # noqa: E402
from tpu_inductor.process_state import STATE  # noqa: E402
from tpu_inductor.runtime.xla_schedule import HOT_CALLS  # noqa: E402

sys.path.insert(0, str(ROOT))
from benchmarks.paired_rounds import (  # noqa: E402
    Call,
    Handler,
    Timer,
    calls_per_round,
    interleaved,
    paired_ratios,
    path_workers,
    timed_calls,
)
from benchmarks.machine import cpu_description  # noqa: E402
from benchmarks.perf_models import MLP, _seeded, mlp_jax, to_jax  # noqa: E402
from benchmarks.perf_report import (  # noqa: E402
    RESULTS_PAGE,
    commit,
    evaluate_bars,
    print_progress,
    report_text,
    versions,
    write_docs,
)
from benchmarks.perf_workloads import (  # noqa: E402
    BUILDERS,
    COMPILED,
    OTHERS,
    PATHS,
    Workload,
    compile_for,
    jax_call,
    mlp_inputs,
)

if THREADS:
    torch.set_num_threads(THREADS)
torch._inductor.config.fx_graph_cache = False
torch._inductor.config.autotune_local_cache = False
torch._functorch.config.enable_autograd_cache = False

WORKLOADS = (
    "overhead", "mlp", "decoder", "decode", "cnn", "mobilenet", "mlp_frozen", "cnn_frozen", "train", "dynamic"
)
TOLERANCE = {"rtol": 1e-4, "atol": 1e-4}
WARMUP_CALLS = HOT_CALLS
"""Calls before timing, every path alike: up to the call where the tpu
backend starts choosing XLA:CPU's schedule for a hot executable, which
compiles once more in the background (runtime/xla_schedule.py); a user's
steady state is after it."""


# --------------------------------------------------------------------- measuring


def as_numpy(value: Any) -> np.ndarray:
    if isinstance(value, torch.Tensor):
        return value.detach().numpy()
    return np.asarray(value)


def check_against_eager(name: str, outputs: Mapping[str, Any]) -> None:
    expected = as_numpy(outputs["eager"])
    for path, value in outputs.items():
        np.testing.assert_allclose(
            as_numpy(value), expected, **TOLERANCE, err_msg=f"{name}: {path} vs eager"
        )


def warm_up(call: Call) -> tuple[float, np.ndarray, np.ndarray]:
    """A path's first-call latency and the outputs of its first and last
    warm-up calls, to be checked against eager's (training paths follow the
    same trajectory)."""
    started = time.perf_counter()
    first_output = as_numpy(call())
    first_call = time.perf_counter() - started
    for _ in range(WARMUP_CALLS):
        call()
    tpu_inductor.wait_for_background_compiles()  # the schedule choice begun at the last call
    last_output = as_numpy(call())  # from the executable kept
    return first_call, first_output, last_output


@dataclasses.dataclass(frozen=True)
class Settings:
    rounds: int
    batch_target_s: float
    dynamic_repeats: int
    one_process: bool = False


def warmed(workload: Workload, path: str) -> tuple[Timer, dict[str, Any]]:
    """``path``'s call of ``workload`` warmed up, as a timer, and what the
    parent needs of it: its first-call seconds and outputs to check."""
    first_call, first_output, last_output = warm_up(workload.calls[path])
    info = {
        "description": workload.description,
        "first_call_s": first_call,
        "first_output": first_output,
        "last_output": last_output,
    }
    return timed_calls(workload.calls[path]), info


def serve_path(name: str, path: str) -> tuple[Handler, dict[str, Any]]:
    """In a path's own process (:class:`PathWorker`): workload ``name``'s call
    for ``path``, its backend primed and the call warmed up."""
    prime_backends((path,) if path in COMPILED else ())
    workload = BUILDERS[name]()
    torch.set_grad_enabled(workload.grad)  # for the process's life: it serves this workload only
    return warmed(workload, path)


def batch_seconds(quick: bool, one_process: bool) -> float:
    """How long each path's batch of calls in a round lasts. A path in its own
    process starts each batch with its threads parked and its caches cold;
    half a second makes that a small part of the batch: the one-token decode
    measured 0.67-1.44 ms a call in 50 ms batches and 0.32-0.84 ms in 0.5 s
    ones, as each path does in a loop of its own."""
    if one_process:
        return 0.02 if quick else 0.05
    return 0.1 if quick else 0.5


def run_steady(name: str, settings: Settings) -> dict[str, Any]:
    if settings.one_process:
        workload = BUILDERS[name]()
        with torch.set_grad_enabled(workload.grad):
            paths = {path: warmed(workload, path) for path in PATHS}
            timers = {path: timer for path, (timer, _) in paths.items()}
            return steady_results(name, timers, {path: info for path, (_, info) in paths.items()}, settings)
    with path_workers({path: (serve_path, name, path) for path in PATHS}) as workers:
        infos = {path: worker.info for path, worker in workers.items()}
        return steady_results(name, {path: worker.ask for path, worker in workers.items()}, infos, settings)


def steady_results(
    name: str, timers: Mapping[str, Timer], infos: Mapping[str, Mapping[str, Any]], settings: Settings
) -> dict[str, Any]:
    """Outputs checked against eager's, then paired rounds over ``timers``."""
    for output in ("first_output", "last_output"):
        check_against_eager(name, {path: info[output] for path, info in infos.items()})
    batch = calls_per_round(timers, settings.batch_target_s)
    samples = interleaved(timers, settings.rounds, batch)
    median = {path: statistics.median(samples.per_call_s[path]) for path in PATHS}
    first_call = {path: info["first_call_s"] for path, info in infos.items()}
    return {
        "description": infos["eager"]["description"],
        "median_s": median,
        "speed_ratio": paired_ratios(samples.per_call_s, OTHERS),
        "first_call_s": first_call,
        "cold_compile_s": {path: first_call[path] - median[path] for path in COMPILED},
        "cpu_per_wall": samples.cpu_per_wall,
        "calls_per_round": samples.calls_per_round,
        "rounds": settings.rounds,
    }


def timed_pass(call: Callable[[Any], Any], inputs: Sequence[Any]) -> tuple[float, list[np.ndarray]]:
    started = time.perf_counter()
    outputs = [call(x) for x in inputs]
    return time.perf_counter() - started, [as_numpy(o) for o in outputs]


def run_dynamic(settings: Settings) -> dict[str, Any]:
    """The MLP over batch sizes 1..64 in a fixed random order, per path from a cold start."""
    sizes = list(range(1, 65))
    random.Random(0).shuffle(sizes)
    model = _seeded(MLP).eval()
    inputs = [mlp_inputs(size, seed=size) for size in sizes]
    jax_inputs = [jnp.asarray(x.numpy()) for x in inputs]
    params = to_jax(model)
    first: dict[str, float] = {}
    second: dict[str, float] = {}
    reference: list[np.ndarray] = []
    with torch.no_grad():
        for path in PATHS:
            torch._dynamo.reset()  # no automatic-dynamic state or code from another path
            STATE.executables.clear()  # each path compiles its own
            if path == "jax":
                jitted = jax.jit(mlp_jax)
                call, path_inputs = (lambda x: jitted(params, x).block_until_ready()), jax_inputs
            else:
                call, path_inputs = compile_for(path, model), inputs
            first[path], outputs = timed_pass(call, path_inputs)
            repeats = (timed_pass(call, path_inputs)[0] for _ in range(settings.dynamic_repeats))
            second[path] = statistics.median(repeats)
            reference = reference or outputs
            for size, got, want in zip(sizes, outputs, reference):
                np.testing.assert_allclose(
                    got, want, **TOLERANCE, err_msg=f"dynamic: {path} at batch {size}"
                )
    return {
        "description": "MLP, batch sizes 1..64 in random order",
        "sizes": sizes,
        "first_pass_s": first,
        "second_pass_s": second,
        "speed_ratio": {
            "first_pass": {other: first[other] / first["tpu"] for other in OTHERS},
            "second_pass": {other: second[other] / second["tpu"] for other in OTHERS},
        },
        "second_pass_repeats": settings.dynamic_repeats,
    }


def prime_backends(paths: Sequence[str] = COMPILED) -> dict[str, float]:
    """One throwaway compile per backend of ``paths``, so that one-time process
    setup (imports, PJRT client, compile workers) lands in no workload; returns
    its seconds."""

    def double(x: Any) -> Any:
        return x * 2

    seconds = {}
    for path in paths:
        if path == "jax":
            call = jax_call(double, jnp.ones(8))
        else:
            call = functools.partial(compile_for(path, double), torch.ones(8))
        started = time.perf_counter()
        call()
        seconds[path] = time.perf_counter() - started
    return seconds


# --------------------------------------------------------------------------- main


def parse_args(argv: Sequence[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add = parser.add_argument
    add("--threads", type=int, default=0,
        help="pin every path to this many intra-op threads, and the allocator (default 0: nothing pinned)")
    add("--quick", action="store_true", help="few rounds, for development; writes no files")
    add("--only", type=lambda s: s.split(","), default=list(WORKLOADS),
        help=f"comma-separated subset of {','.join(WORKLOADS)}; writes no files")
    add("--rounds", type=int, help="interleaved rounds (default 20, 30 with --one-process, 5 with --quick)")
    add("--one-process", action="store_true",
        help="run every path in this process, side by side (default: a process per path)")
    add("--json", type=Path,
        help=f"where to write results (default {DEFAULT_JSON.relative_to(ROOT)})")
    add("--write-docs", action="store_true", help="regenerate the results table in docs/performance.md")
    add("--table-from", type=Path, help="print the tables of a saved results JSON (another machine's run) and exit")
    args = parser.parse_args(argv)
    unknown = sorted(set(args.only) - set(WORKLOADS))
    if unknown:
        parser.error(f"unknown workload(s) {unknown}; choose from {','.join(WORKLOADS)}")
    partial = args.quick or set(args.only) != set(WORKLOADS)
    if args.write_docs and partial:
        parser.error("--write-docs needs a full run (no --quick, no --only)")
    if args.json is None and not partial:
        args.json = Path(str(PINNED_JSON).format(threads=args.threads)) if args.threads else DEFAULT_JSON
    return args


def main(argv: Sequence[str]) -> int:
    args = parse_args(argv)
    if args.table_from:
        print(report_text(json.loads(args.table_from.read_text())))
        return 0
    settings = Settings(
        rounds=args.rounds or (5 if args.quick else 30 if args.one_process else 20),
        batch_target_s=batch_seconds(args.quick, args.one_process),
        dynamic_repeats=1 if args.quick else 3,
        one_process=args.one_process,
    )
    load_start = os.getloadavg()[0]
    pins = " ".join(f"{k}={os.environ.get(k)!r}" for k in PINNED)
    print(f"threads={THREADS} {pins} allocator={ALLOCATOR} load={load_start:.2f}", flush=True)
    # Paths in processes of their own prime their backends there; the dynamic
    # workload and --one-process run here.
    setup_s = prime_backends() if args.one_process or "dynamic" in args.only else {}
    results: dict[str, Any] = {}
    for name in (w for w in WORKLOADS if w in args.only):
        print(f"{name} ...", flush=True)
        if name == "dynamic":
            results[name] = run_dynamic(settings)
        else:
            results[name] = run_steady(name, settings)
        print_progress(name, results[name])
    bars = evaluate_bars(results, pinned=bool(THREADS))
    report = {
        "meta": {
            "date": time.strftime("%Y-%m-%d"),
            "threads": THREADS,
            "environment": {k: os.environ.get(k) for k in PINNED},
            "allocator": ALLOCATOR,
            "cpu_count": os.cpu_count(),
            "cpu": cpu_description(),
            "load_start": load_start,
            "load_end": os.getloadavg()[0],
            "python": platform.python_version(),
            "versions": versions(),
            "commit": commit(),
            "inductor_compile_threads": torch._inductor.config.compile_threads,
            "first_compile_in_process_s": setup_s,
            "paths_in": "one process" if args.one_process else "a process each",
        },
        "settings": {**dataclasses.asdict(settings), "quick": args.quick},
        "workloads": results,
        "bars": [{"bar": dataclasses.asdict(b), "pass": b.passed} for b in bars],
    }
    text = report_text(report)
    print("\n" + text)
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(report, indent=2, allow_nan=False) + "\n")
        print(f"\nwrote {args.json}")
    if args.write_docs:
        write_docs(text, PINNED_MARKERS if THREADS else MARKERS)
        print(f"updated {RESULTS_PAGE}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
