"""Paired, interleaved rounds: how the benchmarks time several paths of one computation.

Every round runs the same number of calls of each path, in an order rotated
from round to round, and records the time per call; a speed ratio is the
median over rounds of one path's time over another's in the same round, so a
slow stretch of a noisy machine hits both sides of each ratio. A call must
return only once its work is done (on CUDA: after a synchronize).
"""

from __future__ import annotations

import dataclasses
import gc
import statistics
import time
from typing import Any, Callable, Mapping, Sequence

Call = Callable[[], Any]


def calls_per_round(calls: Mapping[str, Call], target_s: float) -> int:
    """Enough calls that the slowest path's batch takes about ``target_s``."""
    slowest = 0.0
    for call in calls.values():
        started = time.perf_counter()
        call()
        slowest = max(slowest, time.perf_counter() - started)
    return max(1, min(100_000, round(target_s / max(slowest, 1e-7))))


@dataclasses.dataclass
class Samples:
    per_call_s: dict[str, list[float]]
    """Per-call seconds, one entry per round, for each path."""
    cpu_per_wall: dict[str, float]
    calls_per_round: int


def interleaved(calls: Mapping[str, Call], rounds: int, batch: int) -> Samples:
    """``rounds`` rounds; each times ``batch`` calls of every path, order rotated per round."""
    names = list(calls)
    per_call: dict[str, list[float]] = {name: [] for name in names}
    cpu = dict.fromkeys(names, 0.0)
    wall = dict.fromkeys(names, 0.0)
    gc.collect()
    gc.disable()
    try:
        for index in range(rounds):
            shift = index % len(names)
            for name in names[shift:] + names[:shift]:
                call = calls[name]
                cpu_started, started = time.process_time(), time.perf_counter()
                for _ in range(batch):
                    call()
                elapsed = time.perf_counter() - started
                per_call[name].append(elapsed / batch)
                wall[name] += elapsed
                cpu[name] += time.process_time() - cpu_started
    finally:
        gc.enable()
    return Samples(per_call, {name: cpu[name] / wall[name] for name in names}, batch)


def paired_ratios(per_call: Mapping[str, list[float]], others: Sequence[str], reference: str = "tpu") -> dict[str, float]:
    """Median over rounds of other path's time / ``reference``'s time (> 1: ``reference`` faster)."""
    return {
        other: statistics.median(o / t for o, t in zip(per_call[other], per_call[reference]))
        for other in others
    }
