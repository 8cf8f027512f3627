"""perf.py's bars and its output: the PASS/FAIL bars, the markdown tables
printed and written to docs/performance.md, progress lines, and the versions
and commit recorded in the results JSON."""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path
from typing import Any, Mapping, Sequence

from benchmarks.perf_workloads import BUILDERS, LABELS, OTHERS, PATHS

ROOT = Path(__file__).resolve().parent.parent
RESULTS_PAGE = ROOT / "docs" / "performance.md"
STEADY = ("mlp", "decoder", "cnn")
"""The workloads of the one-thread (pinned) bars."""
STEADY_AT_DEFAULTS = ("mlp", "decoder", "cnn", "mobilenet")
"""The workloads of the default-settings bars (issue 21)."""


# ------------------------------------------------------------------------ bars


@dataclasses.dataclass(frozen=True)
class Bar:
    name: str
    measured: float
    needed: float
    at_most: bool = False
    """True: the measured value must not exceed ``needed`` (else: reach it)."""

    @property
    def passed(self) -> bool:
        return self.measured <= self.needed if self.at_most else self.measured >= self.needed

    def row(self) -> list[str]:
        needed = f"{'<=' if self.at_most else '>='} {self.needed:.2f}x"
        return [self.name, f"{self.measured:.3f}x", needed, "PASS" if self.passed else "FAIL"]


def geomean(values: Sequence[float]) -> float:
    return math.exp(sum(math.log(v) for v in values) / len(values))


def evaluate_bars(results: Mapping[str, Any], pinned: bool) -> list[Bar]:
    """Every bar whose workloads ran: the one-thread lab bars when ``pinned``,
    else the default-settings bars of issue 21."""
    bars: list[Bar] = []
    steady = STEADY if pinned else STEADY_AT_DEFAULTS
    reference = "jax" if pinned else "eager"  # what each workload must reach 0.95x of
    for name in steady:
        if name in results:
            bars.append(Bar(f"tpu vs {LABELS[reference]}, {name}", results[name]["speed_ratio"][reference], 0.95))
    if all(name in results for name in steady):
        for other, needed in (("eager", 1.1), ("inductor", 1.0)):
            ratios = [results[name]["speed_ratio"][other] for name in steady]
            label = f"geomean {'/'.join(steady)}, tpu vs {LABELS[other]}"
            bars.append(Bar(label, geomean(ratios), needed))
    if "overhead" in results:
        ratio = results["overhead"]["speed_ratio"]["inductor"]
        # At defaults: tpu's per-call time at most 1.5x Inductor's.
        bars.append(Bar("per-call overhead, Inductor time / tpu time", ratio, 1.0 if pinned else 1 / 1.5))
    if "decoder" in results:
        cold = results["decoder"]["cold_compile_s"]
        ratio = cold["tpu"] / cold["inductor"]
        bars.append(Bar("decoder cold compile, tpu / Inductor", ratio, 0.2, at_most=True))
    if "train" in results:
        other = "eager" if pinned else "inductor"
        ratio = results["train"]["speed_ratio"][other]
        bars.append(Bar(f"MLP train step, tpu vs {LABELS[other]}", ratio, 1.0))
    return bars


# ------------------------------------------------------------------------ output


def fmt_time(seconds: float) -> str:
    if seconds < 1e-3:
        return f"{seconds * 1e6:.1f} us"
    if seconds < 1:
        return f"{seconds * 1e3:.2f} ms"
    return f"{seconds:.2f} s"


def markdown(header: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "| " + " | ".join("---" for _ in header) + " |"]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    return "\n".join(lines)


def _row(label: str, times: Mapping[str, float], ratios: Mapping[str, float]) -> list[str]:
    cells = [fmt_time(times[p]) if p in times else "-" for p in PATHS]
    return [label, *cells, *(f"{ratios[o]:.2f}x" if o in ratios else "-" for o in OTHERS)]


def result_rows(results: Mapping[str, Any]) -> list[list[str]]:
    """Steady workloads, the dynamic sweep's two passes, then cold compiles."""
    rows = [
        _row(results[name]["description"], results[name]["median_s"], results[name]["speed_ratio"])
        for name in BUILDERS
        if name in results
    ]
    if "dynamic" in results:
        sweep = results["dynamic"]
        for kind in ("first_pass", "second_pass"):
            label = f"{sweep['description']}, {kind.replace('_', ' ')} (total)"
            rows.append(_row(label, sweep[f"{kind}_s"], sweep["speed_ratio"][kind]))
    for name in ("decoder", "cnn", "mlp", "train"):
        if name in results:
            cold = results[name]["cold_compile_s"]
            ratios = {o: cold[o] / cold["tpu"] for o in ("inductor", "jax")}
            rows.append(_row(f"cold compile, {name} (first call - steady call)", cold, ratios))
    return rows


BAR_HEADER = ["bar", "measured", "needed", "verdict"]
RESULT_HEADER = ["workload", *(LABELS[p] for p in PATHS), *(f"tpu vs {LABELS[o]}" for o in OTHERS)]


def _cpu(meta: Mapping[str, Any]) -> str:
    """The header's words for the CPU (``" of an AMD EPYC (avx2, fma; no AVX-512)"``);
    nothing for results made before perf.py recorded it (2026-12-07)."""
    return f" of an {meta['cpu']}" if meta.get("cpu") else ""


def _paths_in(meta: Mapping[str, Any]) -> str:
    """Where the paths ran (runs before 2026-12-04 ran them in one process)."""
    if meta.get("paths_in", "one process") == "one process":
        return "every path in one process"
    return "each path in a process of its own"


def report_text(report: Mapping[str, Any]) -> str:
    """The results and bars as markdown tables (printed, and put in docs/performance.md)."""
    meta = report["meta"]
    command = "python benchmarks/perf.py" + (f" --threads {meta['threads']}" if meta["threads"] else "")
    settings = (
        f"{meta['threads']} intra-op thread(s) for every path, malloc thresholds pinned, "
        if meta["threads"]
        else "default settings (threads, allocator and XLA flags as a user gets them), "
    )
    lines = [
        f"`{command}` on {meta['date']}: {meta['cpu_count']} CPU cores{_cpu(meta)} "
        f"(load average {meta['load_start']:.2f} at start, {meta['load_end']:.2f} at end), "
        f"{settings}"
        f"torch {meta['versions']['torch']}, "
        f"jaxlib {meta['versions']['jaxlib']}, tpu_inductor {meta['commit']}. Medians over "
        f"{report['settings']['rounds']} interleaved rounds, "
        f"{_paths_in(meta)}; \"tpu vs X\" is the median over "
        "rounds of X's time / tpu's time (> 1: tpu is faster).",
        "",
        markdown(RESULT_HEADER, result_rows(report["workloads"])),
        "",
        "CPU time per wall-clock second of each path's timed calls (2.0: both cores busy):",
        "",
        markdown(CPU_HEADER, cpu_rows(report["workloads"])),
        "",
        markdown(BAR_HEADER, [Bar(**b["bar"]).row() for b in report["bars"]]),
    ]
    return "\n".join(lines)


CPU_HEADER = ["workload", *(LABELS[p] for p in PATHS)]


def cpu_rows(results: Mapping[str, Any]) -> list[list[str]]:
    return [
        [name, *(f"{results[name]['cpu_per_wall'][p]:.2f}" for p in PATHS)]
        for name in BUILDERS
        if name in results and "cpu_per_wall" in results[name]
    ]


def write_docs(text: str, markers: tuple[str, str], page: Path = RESULTS_PAGE) -> None:
    """Replace what lies between ``markers`` (the default or the pinned table's) with ``text``."""
    from benchmarks.sweep_common import replace_between_markers

    replace_between_markers(page, markers, text)


def versions() -> dict[str, str]:
    from importlib import metadata

    dists = ("torch", "torch-mlir", "jax", "jaxlib", "numpy")
    return {dist: metadata.version(dist) for dist in dists}


def commit() -> str:
    """The commit of the tpu_inductor being measured (``+dirty``: its package has edits)."""
    from benchmarks.sweep_common import git, head_commit

    return head_commit()[:7] + ("+dirty" if git("status", "--porcelain", "--", "tpu_inductor") else "")


def print_progress(name: str, result: Mapping[str, Any]) -> None:
    if name == "dynamic":
        for kind in ("first_pass", "second_pass"):
            times = "  ".join(f"{LABELS[p]} {fmt_time(result[f'{kind}_s'][p])}" for p in PATHS)
            print(f"  {kind.replace('_', ' ')}: {times}", flush=True)
        return
    for key in ("median_s", "first_call_s"):
        print(f"  {key}: " + "  ".join(f"{LABELS[p]} {fmt_time(result[key][p])}" for p in PATHS))
    print("  tpu vs: " + "  ".join(f"{LABELS[o]} {result['speed_ratio'][o]:.2f}x" for o in OTHERS))
    utilisation = "  ".join(f"{LABELS[p]} {result['cpu_per_wall'][p]:.2f}" for p in PATHS)
    print(f"  cpu/wall: {utilisation}", flush=True)
