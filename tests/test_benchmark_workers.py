"""The benchmarks' per-path processes (benchmarks/paired_rounds.py: PathWorker).

perf.py and generate.py time each path in a process of its own, the parent
pairing the rounds: a worker must answer from its own process, keep its
state between messages, and bring a failure in its set-up or its handler
back to the parent as an error that shows the worker's traceback.
"""

from __future__ import annotations

import os

import pytest

from benchmarks.paired_rounds import PathWorker, interleaved, timed_calls


def counting_setup(start: int):
    """A handler that adds each message to a running total kept in the worker."""
    total = [start]

    def add(message: int) -> tuple[int, int]:
        total[0] += message
        return total[0], os.getpid()

    return add, {"pid": os.getpid()}


def failing_setup():
    raise ValueError("no such workload")


def timed_setup():
    return timed_calls(lambda: sum(range(100))), None


def test_a_worker_answers_from_its_own_process_and_keeps_its_state():
    worker = PathWorker(counting_setup, 10, quiet_start=False)
    try:
        assert worker.info["pid"] != os.getpid()
        assert worker.ask(5) == (15, worker.info["pid"])
        assert worker.ask(7)[0] == 22
    finally:
        worker.close()


def test_a_failing_set_up_is_raised_in_the_parent_with_the_workers_traceback():
    with pytest.raises(RuntimeError, match="ValueError: no such workload"):
        PathWorker(failing_setup, quiet_start=False)


def test_paired_rounds_time_workers_like_calls_in_this_process():
    worker = PathWorker(timed_setup, quiet_start=False)
    try:
        samples = interleaved({"here": timed_calls(lambda: sum(range(100))), "there": worker.ask}, rounds=3, batch=50)
    finally:
        worker.close()
    assert [len(samples.per_call_s[path]) for path in ("here", "there")] == [3, 3]
    assert all(seconds > 0 for times in samples.per_call_s.values() for seconds in times)
