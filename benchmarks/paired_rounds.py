"""Paired, interleaved rounds: how the benchmarks time several paths of one computation.

Every round runs the same number of calls of each path, in an order rotated
from round to round, and records the time per call; a speed ratio is the
median over rounds of one path's time over another's in the same round, so a
slow stretch of a noisy machine hits both sides of each ratio. A call must
return only once its work is done (on CUDA: after a synchronize).

Each path can run in a process of its own (:class:`PathWorker`), the rounds
still paired and rotated by the parent: a user runs one backend in a
process, and paths that share one were measured slowing each other. Eager's
and Inductor's OpenMP workers, XLA's pools (ours and jax's) and glibc's
malloc thresholds are process state that one path leaves to the next: the
GPT-style decoder at default threads on 2 cores, tpu 16.1 ms a call beside
the three other paths in perf.py's process and 13.7-13.9 ms in a process of
its own (eager 14.9 and 14.6-17.9 ms).
"""

from __future__ import annotations

import contextlib
import dataclasses
import gc
import multiprocessing
import statistics
import time
import traceback
from multiprocessing.connection import Connection
from typing import Any, Callable, Iterator, Mapping, Sequence

Call = Callable[[], Any]
Timer = Callable[[int], tuple[float, float]]
"""Runs a path's call ``n`` times; returns (wall seconds, CPU seconds of its process)."""
Handler = Callable[[Any], Any]
"""What a :class:`PathWorker`'s process does with each message it is sent."""


def timed_calls(call: Call) -> Timer:
    """``call`` as a :data:`Timer`."""

    def run(count: int) -> tuple[float, float]:
        cpu_started, started = time.process_time(), time.perf_counter()
        for _ in range(count):
            call()
        return time.perf_counter() - started, time.process_time() - cpu_started

    return run


def calls_per_round(timers: Mapping[str, Timer], target_s: float) -> int:
    """Enough calls that the slowest path's batch takes about ``target_s``."""
    slowest = max(timer(1)[0] for timer in timers.values())
    return max(1, min(100_000, round(target_s / max(slowest, 1e-7))))


@dataclasses.dataclass
class Samples:
    per_call_s: dict[str, list[float]]
    """Per-call seconds, one entry per round, for each path."""
    cpu_per_wall: dict[str, float]
    calls_per_round: int


def rotated(names: Sequence[str], round_index: int) -> list[str]:
    """The order the paths run in, in round ``round_index``: shifted by one each
    round, so that no path always follows the same other one."""
    shift = round_index % len(names)
    return [*names[shift:], *names[:shift]]


def interleaved(timers: Mapping[str, Timer], rounds: int, batch: int) -> Samples:
    """``rounds`` rounds; each times ``batch`` calls of every path, order rotated per round."""
    names = list(timers)
    per_call: dict[str, list[float]] = {name: [] for name in names}
    cpu = dict.fromkeys(names, 0.0)
    wall = dict.fromkeys(names, 0.0)
    gc.collect()
    gc.disable()
    try:
        for index in range(rounds):
            for name in rotated(names, index):
                elapsed, cpu_seconds = timers[name](batch)
                per_call[name].append(elapsed / batch)
                wall[name] += elapsed
                cpu[name] += cpu_seconds
    finally:
        gc.enable()
    return Samples(per_call, {name: cpu[name] / wall[name] for name in names}, batch)


def paired_ratios(per_call: Mapping[str, list[float]], others: Sequence[str], reference: str = "tpu") -> dict[str, float]:
    """Median over rounds of other path's time / ``reference``'s time (> 1: ``reference`` faster)."""
    return {
        other: statistics.median(o / t for o, t in zip(per_call[other], per_call[reference]))
        for other in others
    }


def wait_until_quiet(busy_below: float = 0.1, window_s: float = 0.5, limit_s: float = 60.0) -> float:
    """Wait until the machine's cores are idle (under ``busy_below`` of them
    busy over ``window_s``), at most ``limit_s``; returns the seconds waited.

    Why: a path's process can leave work behind its set-up. Inductor starts
    its pool of compile processes, each importing torch, and those imports
    ran into the rounds that followed: Inductor's one-token decode measured
    1.5-3.8 ms a call in its own process, 0.4-0.9 ms once they were done.
    Linux only (``/proc/stat``); elsewhere it returns at once.
    """

    def busy_and_total() -> tuple[int, int]:
        with open("/proc/stat") as stat:
            fields = [int(x) for x in stat.readline().split()[1:]]
        idle = fields[3] + fields[4]  # idle, iowait
        return sum(fields) - idle, sum(fields)

    try:
        busy_and_total()
    except OSError:
        return 0.0
    started = time.perf_counter()
    while time.perf_counter() - started < limit_s:
        busy, total = busy_and_total()
        time.sleep(window_s)
        busy_after, total_after = busy_and_total()
        if busy_after - busy < busy_below * max(total_after - total, 1):
            break
    return time.perf_counter() - started


class PathWorker:
    """One path of a benchmark, served from a process of its own.

    It starts once the machine is quiet (:func:`wait_until_quiet`) unless
    ``quiet_start`` is false.
    ``setup(*args)`` runs in the new process (spawned: nothing inherited but
    the environment) and returns ``(handler, info)``: ``info`` comes back as
    :attr:`info`, and every later :meth:`ask` runs ``handler`` on its message
    there. The process waits, idle, between messages; the garbage collector is
    off while it serves them, as in :func:`interleaved`. ``setup`` and the
    messages must pickle (a module-level function and plain data).
    """

    def __init__(self, setup: Callable[..., tuple[Handler, Any]], *args: Any, quiet_start: bool = True) -> None:
        if quiet_start:
            # What the last path's set-up left running (Inductor's compile
            # processes) must not share the cores with this one's compile.
            wait_until_quiet()
        context = multiprocessing.get_context("spawn")
        self._connection, child = context.Pipe()
        self._process = context.Process(target=_serve, args=(child, setup, args), daemon=True)
        self._process.start()
        child.close()
        self.info = self._reply()

    def ask(self, message: Any) -> Any:
        self._connection.send(message)
        return self._reply()

    def close(self) -> None:
        if self._process.is_alive():
            self._connection.send(None)
        self._process.join(timeout=30)
        if self._process.is_alive():
            self._process.kill()

    def _reply(self) -> Any:
        try:
            status, value = self._connection.recv()
        except EOFError:
            self._process.join(timeout=5)
            raise RuntimeError(f"a path's process died (exit code {self._process.exitcode})") from None
        if status == "error":
            raise RuntimeError(f"in a path's process:\n{value}")
        return value


def _serve(connection: Connection, setup: Callable[..., tuple[Handler, Any]], args: tuple) -> None:
    """A :class:`PathWorker`'s process: set up, then answer until told to stop."""
    try:
        handler, info = setup(*args)
    except BaseException:  # everything goes back to the parent, which raises it
        connection.send(("error", traceback.format_exc()))
        return
    connection.send(("ok", info))
    gc.collect()
    gc.disable()
    while (message := connection.recv()) is not None:
        try:
            connection.send(("ok", handler(message)))
        except BaseException:
            connection.send(("error", traceback.format_exc()))
            return


@contextlib.contextmanager
def path_workers(setups: Mapping[str, tuple]) -> Iterator[dict[str, PathWorker]]:
    """A :class:`PathWorker` per path, ``setups[path]`` being its ``(setup,
    *args)``: started one at a time (each set-up, first calls included, runs
    alone), then the machine left to go quiet before the caller's rounds;
    closed on the way out."""
    workers: dict[str, PathWorker] = {}
    try:
        for path, (setup, *args) in setups.items():
            workers[path] = PathWorker(setup, *args)
        wait_until_quiet()
        yield workers
    finally:
        for worker in workers.values():
            worker.close()
