"""What the correctness sweeps share: worker processes, outcomes, comparison, output.

Used by ``opinfo_sweep.py`` (PyTorch's OpInfo database), ``moduleinfo_sweep.py``
(PyTorch's ModuleInfo database) and ``torch_mlir_e2e.py`` (torch-mlir's own
end-to-end suite).

Worker processes and crash accounting live in :mod:`sweep_workers`; the
names are re-exported here so each sweep imports one module.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import math
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator, Optional

from benchmarks.machine import cpu_description
from benchmarks.sweep_workers import (  # noqa: F401  (re-exported for the sweeps)
    CRASH,
    CRASH_ENV,
    ERROR,
    FAILURES,
    HANG_ENV,
    MISMATCH,
    OUTCOMES,
    PASS,
    ROOT,
    SCRATCH_ENV,
    SKIPPED,
    TIMEOUT,
    WorkerLog,
    describe,
    describe_exit,
    root_cause,
    run_tasks,
    worker_main,
)
# ---------------------------------------------------------------- in the worker


TORCH_CACHE_ENV = "TORCHINDUCTOR_CACHE_DIR"
"""PyTorch's cache directory, read at each use: AOTAutograd's cache there
keeps the backend's traced graphs (tpu_inductor/aot_cache.py), and our
options do not reach it."""


@contextlib.contextmanager
def fresh_cache_dir() -> Iterator[str]:
    """A new, empty ``cache_dir`` for one compiled run, removed afterwards;
    PyTorch's cache directory points into it meanwhile, so that no level of the
    cache (AOTAutograd's traced graphs included) is hit from another run."""
    root = os.environ.get(SCRATCH_ENV) or None
    path = tempfile.mkdtemp(prefix="cache-", dir=root)
    torch_cache_before = os.environ.get(TORCH_CACHE_ENV)
    os.environ[TORCH_CACHE_ENV] = os.path.join(path, "torch")
    try:
        yield path
    finally:
        if torch_cache_before is None:
            os.environ.pop(TORCH_CACHE_ENV, None)
        else:
            os.environ[TORCH_CACHE_ENV] = torch_cache_before
        shutil.rmtree(path, ignore_errors=True)


def backend_facts(kinds: Optional[Iterable[str]] = None) -> dict:
    """What backend="tpu" did since ``report.reset()``: fallbacks, islands, graph breaks.

    ``kinds`` limits it to graphs of those kinds (``forward``/``inference`` or ``backward``)."""
    import tpu_inductor.report as report

    current = report.current()
    graphs = [g for g in current.graphs if kinds is None or g.kind in set(kinds)]
    fallbacks = [f for g in graphs for f in g.fallbacks]
    return {
        "graphs": len(graphs),
        "islands": sum(len(g.islands) for g in graphs),
        "fallbacks": sorted({f.op for f in fallbacks}),
        "fallback_reasons": sorted({f"{f.op}: {f.reason}"[:200] for f in fallbacks})[:10],
        "graph_breaks": len(current.graph_breaks),
    }


EAGER_KERNELS_ENV = "SWEEP_EAGER_KERNELS"


def tpu_options(cache_dir: str) -> dict:
    """Options for backend="tpu" in a sweep: a fresh cache directory, and (unless
    the sweep ran with ``--eager-kernels``) no routing of lowerable ops to
    PyTorch's kernels for speed, so what passes is what the device lowering computed."""
    return {"cache_dir": cache_dir, "eager_kernels": os.environ.get(EAGER_KERNELS_ENV) == "1"}


# ---------------------------------------------------------------- comparison


HALF_FLOAT_ULP = {"bfloat16": 2.0**-7, "float16": 2.0**-10}
"""One ulp relative (the spacing of floats in [1, 2)) of each half-precision dtype."""


def upcast_half(tree: Any) -> Any:
    """``tree`` with its bfloat16/float16 tensors as float32 leaves that keep
    ``requires_grad`` (exact: every half value is a float32 value): the
    inputs of the float32 reference :func:`float32_verdict` judges against."""
    from torch.utils._pytree import tree_map

    from tpu_inductor.half_precision import is_half

    def upcast(value: Any) -> Any:
        if not is_half(value):
            return value
        return value.detach().float().requires_grad_(value.requires_grad)

    return tree_map(upcast, tree)


def _half_outputs(actual, expected, in_float32) -> Optional[list[tuple[Any, Any, Any]]]:
    """(device, eager, float32) for each non-empty bfloat16/float16 output,
    or None when another output differs from eager's (float32's tolerance,
    integers exactly): the verdicts judge half outputs only."""
    import torch
    from torch.utils._pytree import tree_flatten

    from tpu_inductor.half_precision import HALF_FLOATS

    got, _ = tree_flatten(actual)
    want, _ = tree_flatten(expected)
    reference, _ = tree_flatten(in_float32)
    halves = []
    for a, e, r in zip(got, want, reference):
        if not isinstance(e, torch.Tensor) or e.dtype not in HALF_FLOATS:
            if compare(a, e, 1e-4, 1e-5, limit=1):
                return None
        elif r.numel():
            halves.append((a, e, r))
    return halves


def float32_verdict(actual, expected, in_float32) -> Optional[str]:
    """A note when every bfloat16/float16 output of ``actual`` is no further than
    eager's (``expected``) plus one ulp from ``in_float32`` and every other
    output matches eager's, else None (also when no output is half
    precision). The distance is relative, per element, floored at a
    thousandth of the float32 output's largest finite magnitude."""
    import torch

    halves = _half_outputs(actual, expected, in_float32)
    worst = []
    for a, e, r in halves or ():
        r = r.float()
        finite = r[torch.isfinite(r)]
        floor = finite.abs().amax() * 1e-3 if finite.numel() else torch.tensor(1.0)

        def distance(x):
            x = x.float()
            d = torch.where(x == r, 0.0, (x - r).abs() / r.abs().clamp(min=floor))
            d = torch.where(torch.isnan(x) & torch.isnan(r), 0.0, d)
            return float(torch.nan_to_num(d, nan=float("inf")).amax())

        device, eager = distance(a), distance(e)
        if device > eager + HALF_FLOAT_ULP[str(e.dtype).removeprefix("torch.")]:
            return None
        worst.append((device, eager))
    if not worst:
        return None
    device, eager = max(w[0] for w in worst), max(w[1] for w in worst)
    return f"against float32: {device:.3g} relative, eager {eager:.3g}"


RMSE_TOL = 1e-3
"""``same``'s tolerance in :func:`rmse_verdict`: PyTorch's Hugging Face
suite's for inference (its training steps get 1e-2)."""

RMSE_MULTIPLIER = 3.0
"""How much further from the exact result than eager a half-precision
result may be, in root-mean-square error (``same``'s for half dtypes)."""

RESOLVED = 0.1
"""A tensor eager computes to within this fraction of its own size (RMS
error over RMS): it is held to :data:`RMSE_MULTIPLIER` relative to that
size too, not only to ``same``'s absolute floor."""


@dataclasses.dataclass(frozen=True)
class Judgement:
    """A half-precision tensor against the exact one: root-mean-square errors
    of eager's and the device's, the exact tensor's RMS, and why the device's
    is too far (None when it is not)."""

    eager_error: float
    device_error: float
    size: float
    problem: Optional[str]

    @property
    def resolved(self) -> bool:
        """Whether eager computes the tensor to within :data:`RESOLVED` of its size."""
        return self.eager_error <= RESOLVED * self.size


def judge_against_exact(eager: Any, device: Any, exact: Any, tol: float) -> Judgement:
    """Whether a half-precision ``device`` tensor is further than eager's from
    the ``exact`` one (float64, or float32 judged as float64).

    PyTorch's own accuracy check for Inductor's benchmark suites
    (``torch._dynamo.utils.same`` with a float64 reference): within ``tol``
    of eager, or a root-mean-square error against ``exact`` at most 3x
    eager's plus ``tol / 10``. Both of its floors are absolute, so a tensor
    of small values (a deep layer's gradients, 5e-5) passes whatever its
    error: where eager resolves the tensor (error under :data:`RESOLVED`
    of its size) the device must also be within 3x eager's error plus
    ``tol / 10`` of its size. Tensors that are rounding noise in eager too
    (a gradient that cancels to zero, which eager may round to exactly 0)
    keep ``same``'s absolute floor."""
    from torch._dynamo.utils import rmse, same

    exact = exact.detach().double()
    eager, device = eager.detach(), device.detach().to(eager.device, eager.dtype)
    eager_error, device_error = (rmse(exact, t.double()).item() for t in (eager, device))
    size = exact.pow(2).mean().sqrt().item() if exact.numel() else 0.0
    judgement = Judgement(eager_error, device_error, size, None)
    too_far = not same(eager, device, fp64_ref=exact, tol=tol, equal_nan=True, log_error=_quiet) or (
        judgement.resolved and device_error > RMSE_MULTIPLIER * eager_error + tol / 10 * size)
    if not too_far:
        return judgement
    problem = f"RMSE to the exact result {device_error:.3g} (eager's {eager_error:.3g}, of a size {size:.3g})"
    return dataclasses.replace(judgement, problem=problem)


def rmse_verdict(actual, expected, in_float32) -> Optional[str]:
    """A note when every bfloat16/float16 output of ``actual`` is no further
    than eager's from ``in_float32`` by :func:`judge_against_exact` and every
    other output matches eager's, else None (also when no output is half
    precision).

    For modules whose outputs and gradients sum many rounded terms
    (attention, recurrent cells, losses), where :func:`float32_verdict`'s per-element
    bound fails on elements that cancel to near zero: in float16's
    ModuleInfo sweep the device's error over whole tensors was at most eager's
    on most of them while single elements stood further off than eager's."""
    halves = _half_outputs(actual, expected, in_float32)
    if not halves:
        return None
    judgements = [judge_against_exact(e, a, r, RMSE_TOL) for a, e, r in halves]
    if any(j.problem is not None for j in judgements):
        return None
    ratios = [j.device_error / j.eager_error if j.eager_error else 1.0 for j in judgements if j.resolved]
    return f"against float32 by RMSE: {max(ratios, default=0.0):.3g}x eager's where eager resolves the tensor"


def _quiet(*args: Any) -> None:
    """``same``'s own report of a failure: the sweep records its verdict instead."""


def compare(actual: Any, expected: Any, rtol: float, atol: float, path: str = "out",
            limit: int = 5) -> list[str]:
    """Differences between two output trees (empty when they match).

    Same structure, types, shapes and dtypes; floating (and complex) values
    within ``rtol``/``atol`` with NaNs equal; integers and bools exactly."""
    import torch
    from torch.utils._pytree import tree_flatten

    problems: list[str] = []
    got, got_spec = tree_flatten(actual)
    want, want_spec = tree_flatten(expected)
    if got_spec != want_spec:
        return [f"{path}: structure {_short(got_spec)} != {_short(want_spec)}"]
    for index, (a, e) in enumerate(zip(got, want)):
        where = f"{path}[{index}]" if len(want) > 1 or want_spec.num_children else path
        if isinstance(e, torch.Tensor):
            problem = _compare_tensors(a, e, rtol, atol)
        elif isinstance(e, float) and isinstance(a, (float, int)) and not isinstance(a, bool):
            ok = (math.isnan(e) and math.isnan(a)) or abs(a - e) <= atol + rtol * abs(e)
            problem = None if ok else f"{a!r} != {e!r}"
        else:
            problem = None if type(a) is type(e) and _equal(a, e) else f"{_short(a)} != {_short(e)}"
        if problem:
            problems.append(f"{where}: {problem}")
            if len(problems) >= limit:
                break
    return problems


def _equal(a: Any, b: Any) -> bool:
    try:
        return bool(a == b)
    except Exception:  # noqa: BLE001
        return False


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) < 80 else text[:77] + "..."


def _compare_tensors(a: Any, e: Any, rtol: float, atol: float) -> Optional[str]:
    import torch

    if not isinstance(a, torch.Tensor):
        return f"{type(a).__name__} instead of a tensor"
    if a.shape != e.shape:
        return f"shape {tuple(a.shape)} != {tuple(e.shape)}"
    if a.dtype != e.dtype:
        return f"dtype {a.dtype} != {e.dtype}"
    a, e = a.detach(), e.detach()
    if a.layout != torch.strided:
        a = a.to_dense()
    if e.layout != torch.strided:
        e = e.to_dense()
    if a.is_quantized:
        a, e = a.dequantize(), e.dequantize()
    if a.device != e.device:
        a = a.to(e.device)
    if not (e.dtype.is_floating_point or e.dtype.is_complex):
        if torch.equal(a, e):
            return None
        differ = int((a != e).sum())
        return f"{differ} of {e.numel()} values differ"
    close = torch.isclose(a, e, rtol=rtol, atol=atol, equal_nan=True)
    if bool(close.all()):
        return None
    wrong = ~close
    diff = (a.to(torch.complex128 if e.dtype.is_complex else torch.float64)
            - e.to(torch.complex128 if e.dtype.is_complex else torch.float64)).abs()
    diff = torch.where(torch.isnan(diff), torch.full_like(diff, float("inf")), diff)
    worst = int(torch.argmax(torch.where(wrong, diff, torch.zeros_like(diff))).item())
    flat_a, flat_e = a.reshape(-1), e.reshape(-1)
    return (f"{int(wrong.sum())} of {e.numel()} values differ (max abs diff {float(diff.max()):.3g}; "
            f"at flat index {worst}: {flat_a[worst].item():.6g} vs {flat_e[worst].item():.6g}; "
            f"rtol {rtol:g} atol {atol:g})")


def clone_tree(tree: Any, keep_grad: bool = False) -> Any:
    """Clone every tensor leaf; ``keep_grad`` keeps them leaves that require grad when the originals did."""
    import torch
    from torch.utils._pytree import tree_map

    def clone(leaf: Any) -> Any:
        if not isinstance(leaf, torch.Tensor):
            return leaf
        copy = leaf.detach().clone()
        if keep_grad and leaf.requires_grad:
            copy.requires_grad_(True)
        return copy

    return tree_map(clone, tree)


def seeded(seed: int = 0) -> None:
    import random

    import torch

    random.seed(seed)
    torch.manual_seed(seed)


# ---------------------------------------------------------------- output


def count(outcomes: Iterable[str]) -> dict[str, int]:
    counts = {outcome: 0 for outcome in OUTCOMES}
    for outcome in outcomes:
        counts[outcome] = counts.get(outcome, 0) + 1
    return counts


def pct(part: int, whole: int) -> str:
    return f"{100.0 * part / whole:.1f}%" if whole else "-"


def fallback_ops(records: list[dict], phases: list[dict]) -> dict[str, list[str]]:
    """Op -> the ids of the records whose paired phase ran it eagerly (its
    ``fallbacks``, from :func:`backend_facts`), sorted."""
    ids_by_op: dict[str, list[str]] = {}
    for record, phase in zip(records, phases):
        for op in phase.get("fallbacks", []):
            ids_by_op.setdefault(op, []).append(record["id"])
    return {op: sorted(ids) for op, ids in sorted(ids_by_op.items())}


def markdown_table(header: list[str], rows: list[list[Any]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + " --- |" * len(header)]
    lines += ["| " + " | ".join(str(cell) for cell in row) + " |" for row in rows]
    return "\n".join(lines)


def finish(path: Path, meta: dict, summary: dict, records_key: str, records: Any, table_text: str, counted: str,
           seconds: Optional[float] = None) -> None:
    """Write a sweep's results JSON and print its table and a closing line;
    ``seconds``: this run's, where ``meta`` is an earlier run's (``--update``)."""
    write_json(path, {"meta": meta, "summary": summary, records_key: records})
    print()
    print(table_text)
    print(f"\n{counted} in {meta['seconds'] if seconds is None else seconds:.0f} s; wrote {path}")


def updated(previous: dict, records_key: str, records: dict, meta: dict) -> tuple[dict, dict]:
    """An ``--update`` run's records and meta: the earlier run's records stay
    where this one did not redo them, its meta stays, and this run is noted
    as an update of it (with the ids it redid)."""
    merged = {**previous[records_key], **records}
    update = {**meta, "redone": sorted(records)}
    return merged, {**previous["meta"], "updates": [*previous["meta"].get("updates", []), update]}


def replace_between_markers(page: Path, markers: tuple[str, str], text: str) -> None:
    """Put ``text`` between a page's two marker comments (a generated table)."""
    content = page.read_text()
    start, end = content.index(markers[0]) + len(markers[0]), content.index(markers[1])
    page.write_text(content[:start] + "\n" + text + "\n" + content[end:])


def write_json(path: Path, data: Any) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data, indent=1, sort_keys=True, default=str) + "\n")


def git(*args: str) -> str:
    """``git args`` in this checkout; "" where git or the history is missing."""
    try:
        return subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True, timeout=30).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return ""


def head_commit() -> str:
    """The commit measured. A copy of the tree on another machine (the device
    machine's, whose git metadata can be an older commit's) is told it in
    ``BENCHMARK_COMMIT`` by whoever runs it there, which then wins."""
    return os.environ.get("BENCHMARK_COMMIT") or git("rev-parse", "HEAD") or "unknown"


def environment() -> dict:
    """Versions and the tpu_inductor commit the sweep ran against."""
    from importlib import metadata

    import torch

    def version(package: str) -> Optional[str]:
        try:
            return metadata.version(package)
        except metadata.PackageNotFoundError:
            return None

    return {
        "date": time.strftime("%Y-%m-%d %H:%M"),
        "torch": torch.__version__,
        "torch_mlir": version("torch-mlir"),
        "jax": version("jax"),
        "jaxlib": version("jaxlib"),
        "tpu_inductor_commit": head_commit(),
        # A told commit is the tree measured; git's status there describes another.
        "tpu_inductor_dirty": not os.environ.get("BENCHMARK_COMMIT")
        and bool(git("status", "--porcelain", "--untracked-files=no")),
        "cpus": os.cpu_count(),
        "cpu": cpu_description(),
    }


def worker_env(scratch: Path, args: Any = None) -> dict:
    """The workers' environment: every cache under ``scratch`` (nothing from an
    earlier run can be hit), ``--eager-kernels``, and the crash/hang injections."""
    crash_at = getattr(args, "crash_at", ())
    hang_at = getattr(args, "hang_at", ())
    env = dict(os.environ)
    env[EAGER_KERNELS_ENV] = "1" if getattr(args, "eager_kernels", False) else "0"
    env[SCRATCH_ENV] = str(scratch)
    env["TPU_INDUCTOR_CACHE_DIR"] = str(scratch / "default-cache")
    env[TORCH_CACHE_ENV] = str(scratch / "torch-cache")
    env.pop("TPU_INDUCTOR_REPORT_DIR", None)
    if crash_at:
        env[CRASH_ENV] = ",".join(crash_at)
    if hang_at:
        env[HANG_ENV] = ",".join(hang_at)
    return env


def sweep_parser(argv: Optional[list[str]], run_task: Callable[[dict, WorkerLog], None], description: Optional[str],
                 setup: Optional[Callable[[], None]] = None) -> Optional[argparse.ArgumentParser]:
    """A sweep's command line: None where this process is one of its workers
    (``--worker TASKS_FILE LOG_FILE``: it has run its tasks), else the parser,
    to which the sweep adds its options (and :func:`add_worker_arguments`)."""
    argv = sys.argv[1:] if argv is None else argv
    if argv and argv[0] == "--worker":
        worker_main(argv[1:], run_task, setup=setup)
        return None
    return argparse.ArgumentParser(description=description, formatter_class=argparse.RawDescriptionHelpFormatter)


def add_worker_arguments(parser: Any) -> None:
    """The options every sweep takes for its workers."""
    parser.add_argument("-j", "--jobs", type=int, default=1, help="worker processes at a time")
    parser.add_argument("--chunk", type=int, default=50, help="tasks per worker process")
    parser.add_argument("--crash-at", action="append", default=[], metavar="ID:PHASE",
                        help="make the worker abort as this phase starts (checks crash counting)")
    parser.add_argument("--hang-at", action="append", default=[], metavar="ID:PHASE",
                        help="make the worker hang in this phase (checks timeouts)")
    parser.add_argument("--keep-logs", type=Path, help="keep the workers' logs and stderr in this directory")
    parser.add_argument("--eager-kernels", action="store_true",
                        help="let backend='tpu' route ops to PyTorch's kernels where faster (off: test the lowering)")


@contextlib.contextmanager
def scratch_dir(keep: Optional[Path] = None) -> Iterator[Path]:
    """The sweep's scratch root (worker logs, fresh cache directories); removed
    afterwards unless ``keep`` names where to keep it."""
    if keep is not None:
        keep.mkdir(parents=True, exist_ok=True)
        yield keep
        return
    path = Path(tempfile.mkdtemp(prefix="sweep-"))
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)
