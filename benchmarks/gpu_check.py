"""One short run on an NVIDIA machine (issues 21 and 24): is the CUDA path right, and how fast is it.

Installs nothing: run it where tpu_inductor, torch-mlir, a CUDA build of torch
and jax's CUDA plugin are importable (``benchmarks/device/run.sh`` sets that up
on the lent test machine from what ``benchmarks/device/prepare.sh`` packed
here). Every section is recorded in the JSON even when it fails, so one run
answers everything it can:

- ``zero_copy``: a CUDA tensor crosses to XLA and back through DLPack without
  a copy (the data pointers of the torch tensor, the PJRT buffer and the
  tensor handed back are compared) and the values survive the trip;
- ``stream``: a tensor written by a torch kernel on a side stream (behind a
  long ``torch.cuda._sleep``, so a missing wait reads stale memory) is read
  by an island, inside that stream's context and after ``wait_stream``;
- ``models``: the model suite of tests/models.py, inference and one training
  step's gradients against eager, compiled ``strict`` for the device (any
  node placed in eager raises) with at least one island; then the inference
  step's time through eager, Inductor and tpu;
- ``call_cost``: where a call of perf.py's MLP spends its microseconds
  (inputs handed to XLA, the executable, outputs handed back, the rest);
- ``stream_handshake``: the stream test and ``call_cost`` again with a
  candidate hand-over that does not wait on the host (DLPack's stream
  argument: an event torch records, XLA's stream waits for);
- ``perf``: perf.py's workloads (MLP, decoder, ResNet-style CNN,
  MobileNet-style CNN, the MLP training step) through eager, Inductor and tpu
  on the device, in paired interleaved rounds (``paired_rounds.py``);
- ``generate``: ``benchmarks/generate.py --device cuda --timing`` on a few
  architectures, in its own processes, in the time left of ``--budget-s``.

TF32 is off, so CUDA matmuls stay float32 and eager's numbers are float32's.

    python benchmarks/gpu_check.py                # on the GPU machine (under 10 minutes)
    python benchmarks/gpu_check.py --device cpu   # dry run of the same code here
    python benchmarks/gpu_check.py --write-docs   # the README's table from the JSON of the last run

Writes ``benchmarks/results/gpu_check.json`` (``--out``).
"""

from __future__ import annotations

import argparse
import copy
import json
import statistics
import subprocess
import sys
import time
import traceback
from pathlib import Path
from typing import Any, Callable

import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))

from models import MODELS  # noqa: E402  (the model suite's own builders)

from benchmarks.paired_rounds import calls_per_round, interleaved, paired_ratios, timed_calls  # noqa: E402

DEFAULT_OUT = ROOT / "benchmarks" / "results" / "gpu_check.json"
README = ROOT / "README.md"
MARKERS = ("<!-- gpu-table:start -->", "<!-- gpu-table:end -->")
# The model suite's tolerances (tests/test_models.py: float32 reorderings in dot/conv).
RTOL, ATOL = 1e-4, 1e-5
PATHS = ("eager", "inductor", "tpu")
GENERATE_ROWS = "llama:static,gpt2:static,llama:dynamic"
SECTIONS = ("zero_copy", "stream", "models", "call_cost", "stream_handshake", "perf", "generate")
"""In the order they run: correctness first, then speed, generation in the time left."""


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def tpu_options(device: torch.device, **extra: Any) -> dict[str, Any]:
    return {"cache": False, "platform": device.type, **extra}


def section(name: str, run: Callable[[], Any]) -> dict[str, Any]:
    """``run()``'s result, or the error it raised (a failing section does not end the run)."""
    started = time.perf_counter()
    try:
        result: dict[str, Any] = {"result": run()}
    except Exception as error:  # noqa: BLE001  every failure is a finding to record
        result = {"error": f"{type(error).__name__}: {error}"[:2000], "traceback": traceback.format_exc()[-4000:]}
    result["seconds"] = time.perf_counter() - started
    print(f"{name}: {'FAILED ' + result['error'] if 'error' in result else 'ok'} ({result['seconds']:.1f} s)",
          flush=True)
    return result


# ------------------------------------------------------------------ correctness


def zero_copy(device: torch.device) -> dict[str, Any]:
    """Data pointers of a tensor, its PJRT buffer and the tensor that comes back."""
    from tpu_inductor.runtime import transfer
    from tpu_inductor.runtime.platform import get_platform

    tensor = torch.arange(4096, dtype=torch.float32, device=device)
    platform = get_platform(device.type)
    if device.type == "cuda":
        buffer = transfer.to_device(tensor, platform)
        back = transfer.to_torch(buffer, platform)
    else:  # the CPU client's path: kept host views in, DLPack out
        buffer = transfer.HostViews(platform).buffers((tensor,))[0]
        back = transfer.host_tensor(buffer)
    pointer = buffer.unsafe_buffer_pointer()
    found = {
        "input_shared": pointer == tensor.data_ptr(),
        "output_shared": back.data_ptr() == pointer,
        "values_equal": bool(torch.equal(back, tensor)),
        "result_device": str(back.device),
    }
    if device.type == "cuda":  # XLA's client is up: it must not have taken the card from torch
        free, total = torch.cuda.mem_get_info(device)
        found["free_gpu_memory_fraction"] = round(free / total, 3)
    if not all(found[key] for key in ("input_shared", "output_shared", "values_equal")):
        raise AssertionError(f"copied or changed on the way: {found}")
    return found


def stream(device: torch.device) -> dict[str, Any]:
    if device.type != "cuda":
        return {"skipped": "needs CUDA streams"}
    compiled = torch.compile(lambda t: (t * 2).sum(dim=0), backend="tpu", options=tpu_options(device, strict=True))
    base = torch.zeros(2048, 2048, device=device)
    compiled(base)  # the compile happens here, not in the race below
    side = torch.cuda.Stream(device)
    wrong = []
    for trial, inside in ((1, True), (2, True), (3, False), (4, False)):
        with torch.cuda.stream(side):
            written = torch.zeros(2048, 2048, device=device)
            torch.cuda._sleep(200_000_000)  # ~0.1 s of the side stream before the write
            written.fill_(float(trial))
            if inside:
                got = compiled(written)
        if not inside:
            torch.cuda.current_stream(device).wait_stream(side)
            got = compiled(written)
        synchronize(device)
        if not torch.equal(got, torch.full_like(got, 2.0 * trial * 2048)):
            wrong.append({"trial": trial, "inside_side_stream": inside, "first": float(got[0])})
    if wrong:
        raise AssertionError(f"the island read memory before the side stream wrote it: {wrong}")
    return {"trials": 4, "wrong": 0}


def islands_run() -> int:
    from tpu_inductor import report

    return sum(island.executions for island in report.current().islands())


def check_model(name: str, device: torch.device, repeats: int) -> dict[str, Any]:
    from tpu_inductor import report

    model, inputs, targets, loss_fn = MODELS[name](0)
    model, targets = model.to(device), targets.to(device)
    inputs = [x.to(device) for x in inputs]
    strict = tpu_options(device, strict=True)
    report.reset()
    model.eval()
    with torch.no_grad():
        expected = model(*inputs)
        got = torch.compile(copy.deepcopy(model), backend="tpu", options=strict)(*inputs)
        torch.testing.assert_close(got, expected, rtol=RTOL, atol=ATOL)
    model.train()
    trained = copy.deepcopy(model)
    loss_fn(torch.compile(trained, backend="tpu", options=strict)(*inputs), targets).backward()
    loss_fn(model(*inputs), targets).backward()
    for (param_name, p), q in zip(model.named_parameters(), trained.parameters()):
        if p.grad is not None:
            torch.testing.assert_close(q.grad, p.grad, rtol=RTOL, atol=ATOL, msg=lambda m: f"{param_name}: {m}")
    executions = islands_run()
    if not executions:
        raise AssertionError("no island ran: the compiled model did not reach the device")
    model.eval()
    with torch.no_grad():
        calls = {
            path: _synchronized(fn, inputs, device)
            for path, fn in (
                ("eager", model),
                ("inductor", torch.compile(copy.deepcopy(model), backend="inductor")),
                ("tpu", torch.compile(copy.deepcopy(model), backend="tpu", options=tpu_options(device))),
            )
        }
        timed = _paired(calls, rounds=repeats)
    return {"model": name, "matches_eager": True, "island_executions": executions, **timed}


# ------------------------------------------------------------------------ speed


def call_cost(device: torch.device, calls: int = 300) -> dict[str, Any]:
    """Where one call of a small compiled model goes, in microseconds per call:
    the whole call, the island's call inside it, and within that the inputs'
    hand-over to XLA and the outputs' hand-back (each wrapped with a timer
    for this section only); synchronized after every call, as perf's rounds
    are. A dry run on CPU takes the same path with ``zero_copy=False``."""
    from benchmarks.perf_models import MLP, _seeded
    from benchmarks.perf_workloads import mlp_inputs
    from tpu_inductor.runtime import executable, transfer

    spent = dict.fromkeys(("island_call", "to_device", "to_torch"), 0.0)

    def timed(name: str, fn: Callable[..., Any]) -> Callable[..., Any]:
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            started = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                spent[name] += time.perf_counter() - started
        return wrapper

    island = executable.DeviceExecutable
    originals = transfer.to_device, transfer.to_torch, island._call_through_transfers
    # Patched before the compile: an executable binds its call when it is made.
    transfer.to_device, transfer.to_torch = timed("to_device", originals[0]), timed("to_torch", originals[1])
    island._call_through_transfers = timed("island_call", originals[2])
    try:
        model, x = _seeded(MLP).eval().to(device), mlp_inputs(64).to(device)
        options = tpu_options(device, strict=True, **({"zero_copy": False} if device.type == "cpu" else {}))
        compiled = torch.compile(model, backend="tpu", options=options)
        with torch.no_grad():
            for _ in range(20):
                compiled(x)
            synchronize(device)
            spent.update(dict.fromkeys(spent, 0.0))
            started = time.perf_counter()
            for _ in range(calls):
                compiled(x)
                synchronize(device)
            whole = time.perf_counter() - started
            eager_started = time.perf_counter()
            for _ in range(calls):
                model(x)
                synchronize(device)
            eager = time.perf_counter() - eager_started
    finally:
        transfer.to_device, transfer.to_torch, island._call_through_transfers = originals
    us = {name: seconds / calls * 1e6 for name, seconds in spent.items()}
    return {"tpu_call_us": whole / calls * 1e6, "eager_call_us": eager / calls * 1e6, **us,
            "execute_us": us["island_call"] - us["to_device"] - us["to_torch"],
            "outside_island_us": whole / calls * 1e6 - us["island_call"]}


def _handshake_to_device(tensor: torch.Tensor, platform: Any, resident: Any = None) -> Any:
    """A candidate hand-over without the host wait: torch records an event on
    its current stream that XLA's external-ready stream waits for (DLPack's
    stream argument, as ``jax.dlpack.from_dlpack`` passes it)."""
    from tpu_inductor.runtime import jaxlib_api

    if not tensor.is_contiguous():
        tensor = tensor.contiguous()
    device = platform.client.local_devices()[tensor.device.index or 0]
    ready = device.get_stream_for_external_ready_events()
    return jaxlib_api.buffer_from_dlpack(tensor.__dlpack__(stream=ready), device, ready)


def stream_handshake(device: torch.device) -> dict[str, Any]:
    """The stream test and the call's cost again with :func:`_handshake_to_device`
    in place of the backend's hand-over: whether it is right, and what it saves."""
    if device.type != "cuda":
        return {"skipped": "needs CUDA streams"}
    from tpu_inductor.runtime import transfer

    original = transfer.to_device
    transfer.to_device = _handshake_to_device
    try:
        torch._dynamo.reset()
        return {"stream": stream(device), "call_cost": call_cost(device)}
    finally:
        transfer.to_device = original


def _synchronized(fn: Callable[..., Any], inputs: list[Any], device: torch.device) -> Callable[[], Any]:
    def call() -> Any:
        result = fn(*inputs)
        synchronize(device)
        return result

    return call


def _paired(calls: dict[str, Callable[[], Any]], rounds: int) -> dict[str, Any]:
    """First-call seconds (compiles included), medians of paired rounds and ratios vs tpu."""
    first = {}
    for path, call in calls.items():
        started = time.perf_counter()
        call()
        first[path] = time.perf_counter() - started
        call()
    timers = {path: timed_calls(call) for path, call in calls.items()}
    samples = interleaved(timers, rounds, calls_per_round(timers, 0.05))
    return {
        "first_call_s": first,
        "median_s": {path: statistics.median(times) for path, times in samples.per_call_s.items()},
        "speed_ratio": paired_ratios(samples.per_call_s, ("eager", "inductor")),
    }


def perf_workloads(device: torch.device, rounds: int) -> dict[str, Any]:
    """perf.py's models and input shapes, on ``device``; outputs checked against eager's first."""
    from benchmarks.perf_models import MLP, Decoder, _mobilenet, _resnet, _seeded
    from benchmarks.perf_workloads import (
        CNN_IMAGES,
        MOBILENET_IMAGES,
        decoder_tokens,
        mlp_inputs,
        random_images,
        torch_train_step,
    )

    inference = {
        "mlp": (_seeded(MLP), mlp_inputs(64)),
        "decoder": (_seeded(Decoder), decoder_tokens()),
        "cnn": (_resnet(), random_images(CNN_IMAGES)),
        "mobilenet": (_mobilenet(), random_images(MOBILENET_IMAGES)),
    }
    results: dict[str, Any] = {}
    for name, (model, x) in inference.items():
        model, x = model.eval().to(device), x.to(device)
        compiled = {"eager": model, "inductor": torch.compile(model, backend="inductor"),
                    "tpu": torch.compile(model, backend="tpu", options=tpu_options(device))}
        with torch.no_grad():
            expected = model(x)
            # Recorded, not asserted: a difference must not cost the timing (the model suite asserts).
            error = {path: float((compiled[path](x) - expected).abs().max()) for path in ("inductor", "tpu")}
            results[name] = {"max_abs_error_vs_eager": error,
                             **_paired({p: _synchronized(f, [x], device) for p, f in compiled.items()}, rounds)}
        print(f"  {name}: tpu vs eager {results[name]['speed_ratio']['eager']:.2f}x, "
              f"vs Inductor {results[name]['speed_ratio']['inductor']:.2f}x", flush=True)
    x, y = mlp_inputs(64).to(device), mlp_inputs(64, seed=2).to(device)  # perf.py's training batch
    steps = {}
    for path in PATHS:
        step = torch_train_step(_seeded(MLP).to(device), x, y)
        if path != "eager":
            options = {} if path == "inductor" else {"options": tpu_options(device)}
            step = torch.compile(step, backend=path, **options)
        steps[path] = _synchronized(step, [], device)
    results["train"] = _paired(steps, rounds)
    return results


def generation(device: torch.device, seconds_left: float) -> dict[str, Any]:
    """generate.py's correctness rows and timing on the device, in its own processes."""
    if seconds_left < 90:
        return {"skipped": f"{seconds_left:.0f} s left of the budget"}
    out = ROOT / "benchmarks" / "results" / f"generate-{device.type}.json"
    # A row (three paths compiled, prompts checked, rounds timed) wants more
    # than the 114 s each of three got on the H200 (all three cut off); with
    # less time fewer rows finish rather than all of them cut off.
    rows = GENERATE_ROWS.split(",")[: max(1, int((seconds_left - 30) // 170))]
    per_row = int((seconds_left - 30) / len(rows))  # generate.py ends a row that runs past this itself
    command = [sys.executable, str(ROOT / "benchmarks" / "generate.py"), "--device", device.type, "--timing",
               "--timing-modes", "static,dynamic", "--rounds", "3", "--only", ",".join(rows), "--out", str(out),
               "--timeout", str(per_row)]
    done = subprocess.run(command, capture_output=True, text=True, cwd=ROOT)
    if not out.exists():
        raise RuntimeError(f"generate.py wrote nothing (exit {done.returncode}): {done.stderr[-1500:]}")
    return {"exit": done.returncode, "json": str(out.relative_to(ROOT)), **json.loads(out.read_text())}


# ----------------------------------------------------------------------- output


def _verdict(row: dict[str, Any]) -> str:
    if "error" in row:
        return "FAILED: " + " ".join(row["error"].split())[:160]  # one table cell: no line breaks
    skipped = row.get("skipped") or row.get("result", {}).get("skipped")
    return f"skipped ({skipped})" if skipped else "ok"


def table(report: dict[str, Any]) -> str:
    """Markdown: the checks, then per workload the median times and tpu's ratios."""
    lines = [f"`python benchmarks/gpu_check.py` on {report['meta']['date']}: {report['meta']['device_name']}, "
             f"torch {report['meta']['torch']}, jaxlib {report['meta']['jaxlib']}, tpu_inductor "
             f"{report['meta']['tpu_inductor_commit'][:7]}. Ratios: medians of paired rounds of the other path's time / tpu's "
             "(> 1: tpu is faster).", ""]
    checks = {name: report[name] for name in ("zero_copy", "stream")}
    checks.update({f"model {row['model']}": row for row in report["models"]})
    lines += ["| check | result |", "| --- | --- |"]
    lines += [f"| {name} | {_verdict(row)} |" for name, row in checks.items()]
    rows = [(f"model suite: {row['model']}", row) for row in report["models"] if "median_s" in row]
    rows += [(f"perf.py: {name}", row) for name, row in report["perf"].get("result", {}).items()]
    lines += ["", "| workload | eager | Inductor | tpu | tpu vs eager | tpu vs Inductor |", "| --- | --- | --- | --- | --- | --- |"]
    for label, row in rows:
        times = " | ".join(f"{row['median_s'][p] * 1e3:.3f} ms" for p in PATHS)
        ratios = " | ".join(f"{row['speed_ratio'][p]:.2f}x" for p in ("eager", "inductor"))
        lines.append(f"| {label} | {times} | {ratios} |")
    generated = report["generate"].get("result", {})
    for row in generated.get("rows", []):
        if "timing" in row:
            t = row["timing"]
            lines.append(f"| generate {row['arch']} {row['mode']}: decode per token | "
                         + " | ".join(f"{t[p]['decode'] * 1e3:.3f} ms" for p in PATHS)
                         + f" | {t['eager']['decode'] / t['tpu']['decode']:.2f}x | "
                         f"{t['inductor']['decode'] / t['tpu']['decode']:.2f}x |")
    return "\n".join(lines)


def metadata(device: torch.device) -> dict[str, Any]:
    from benchmarks.sweep_common import environment

    name = torch.cuda.get_device_name(device) if device.type == "cuda" else "CPU (dry run)"
    return {**environment(), "device": str(device), "device_name": name}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda", help="cuda (default) or cpu for a dry run")
    parser.add_argument("--rounds", type=int, default=10, help="paired rounds per workload")
    parser.add_argument("--models", nargs="*", default=sorted(MODELS))
    parser.add_argument("--sections", default=",".join(SECTIONS))
    parser.add_argument("--budget-s", type=float, default=540, help="generate.py gets what is left of this")
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT)
    parser.add_argument("--write-docs", action="store_true", help="put the table of --out's run in the README")
    args = parser.parse_args()
    if args.write_docs:
        from benchmarks.sweep_common import replace_between_markers

        replace_between_markers(README, MARKERS, table(json.loads(args.out.read_text())))
        return 0
    started = time.perf_counter()
    device = torch.device(args.device)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    if device.type == "cuda":
        if not torch.cuda.is_available():
            sys.exit("no CUDA device visible to torch: run on the NVIDIA machine, or --device cpu")
        torch.backends.cuda.matmul.allow_tf32 = False
        torch.backends.cudnn.allow_tf32 = False
    wanted = set(args.sections.split(","))
    skipped = {"skipped": "not in --sections"}
    report: dict[str, Any] = {"meta": metadata(device), "models": []}
    pending = {name: skipped for name in SECTIONS if name != "models"}

    def save() -> None:
        """The JSON so far: a run the device tool cuts off at its time limit still brings back what it did."""
        report["meta"]["seconds"] = time.perf_counter() - started
        args.out.write_text(json.dumps({**pending, **report}, indent=1, default=str) + "\n")

    def record(name: str, run: Callable[[], Any]) -> None:
        if name in wanted:
            report[name] = section(name, run)
            save()

    record("zero_copy", lambda: zero_copy(device))
    record("stream", lambda: stream(device))
    for name in args.models if "models" in wanted else ():
        torch._dynamo.reset()
        row = section(f"model {name}", lambda: check_model(name, device, args.rounds))
        report["models"].append({"model": name, **row.pop("result", {}), **row})
        save()
    record("call_cost", lambda: call_cost(device))
    record("stream_handshake", lambda: stream_handshake(device))
    record("perf", lambda: perf_workloads(device, args.rounds))
    record("generate", lambda: generation(device, args.budget_s - (time.perf_counter() - started)))
    report = {**pending, **report}
    save()
    print("\n" + table(report) + f"\n\nwrote {args.out}")
    failed = [name for name in SECTIONS if name != "models" and "error" in report[name]]
    failed += [row["model"] for row in report["models"] if "error" in row]
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
