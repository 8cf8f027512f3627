"""XLA:CPU's scheduler is chosen per executable by the temporary memory each
needs, once the executable is hot (runtime/xla_schedule.py); the choice
never changes a result."""

from __future__ import annotations

import os
import threading
import types

import pytest
import torch

import tpu_inductor
import tpu_inductor.report as report
from tpu_inductor.lowering import pipeline_worker, pipelines
from tpu_inductor.runtime import schedule_choice, xla_schedule
from tpu_inductor.runtime.isolated_compile import XlaCompileError

from new_process import fresh_process


def _scaled_chain(x, weights, scales):
    # Each folded weight depends on parameters only: the default (breadth
    # first) schedule computes all of them before the first product and keeps
    # them alive together; the memory-optimized one makes each just before use.
    for weight, scale in zip(weights, scales):
        x = torch.relu(x @ (weight * scale))
    return x


def _inputs(width: int):
    generator = torch.Generator().manual_seed(0)
    x = torch.randn(8, width, generator=generator)
    weights = [torch.randn(width, width, generator=generator) / width**0.5 for _ in range(6)]
    scales = [torch.rand(width, generator=generator) for _ in range(6)]
    return x, weights, scales


def _compiled_islands(width: int, calls: int = 1, **options):
    args = _inputs(width)
    compiled = torch.compile(_scaled_chain, backend="tpu", options={"cache": False, "strict": True, **options})
    for _ in range(calls):
        torch.testing.assert_close(compiled(*args), _scaled_chain(*args), rtol=1e-5, atol=1e-5)
    return report.current().islands()


def _hold_background_compiles(monkeypatch) -> threading.Event:
    """The schedule choice's compiles wait until the event returned is set."""
    release = threading.Event()
    compile_and_load = schedule_choice.compile_and_load

    def held(*args, **kwargs):
        release.wait(timeout=30)
        return compile_and_load(*args, **kwargs)

    monkeypatch.setattr(schedule_choice, "compile_and_load", held)
    return release


def test_the_schedule_that_needs_less_memory_is_kept_once_the_executable_is_hot():
    (island,) = _compiled_islands(64, calls=xla_schedule.HOT_CALLS - 1)
    assert island.compile_source == "xla" and island.xla_schedule is None  # not chosen yet: one compile
    xla_seconds = report.current().stage_seconds["xla"]
    (island,) = _compiled_islands(64)  # the same graph's 100th call
    assert tpu_inductor.wait_for_background_compiles(timeout=120)
    assert island.xla_schedule is not None and island.xla_schedule.startswith("memory-optimized")
    # The second compile ran beside the program: counted, but not as compile time a call waited for.
    assert report.current().stage_seconds["xla"] == xla_seconds
    assert report.current().background_seconds["xla"] > 0
    assert "Compiled beside the program" in str(report.current())
    _compiled_islands(64)  # the executable kept runs, with the same numbers


def test_a_choice_counts_its_compile_in_the_record_current_when_it_began(monkeypatch):
    release = _hold_background_compiles(monkeypatch)
    _compiled_islands(68, calls=xla_schedule.HOT_CALLS)
    began_in = report.current()
    report.reset()  # as a user's program may, while the choice compiles
    release.set()
    assert tpu_inductor.wait_for_background_compiles(timeout=120)
    assert began_in.background_seconds["xla"] > 0
    assert report.current().background_seconds == {} and report.current().stage_seconds == {}


def test_the_hot_call_does_not_wait_for_the_second_compile(monkeypatch):
    # The choice's compile is held until released: calls go on meanwhile
    # (a hot call that waited for it would wait here for the timeout, and
    # find the choice made).
    release = _hold_background_compiles(monkeypatch)
    (island,) = _compiled_islands(72, calls=xla_schedule.HOT_CALLS + 20)
    assert island.compile_source == "xla" and island.xla_schedule is None  # the default ran on
    release.set()
    assert tpu_inductor.wait_for_background_compiles(timeout=120)
    assert island.xla_schedule.startswith("memory-optimized")
    _compiled_islands(72)  # the executable kept runs, with the same numbers


def test_the_second_compile_runs_in_a_helper_of_lower_priority():
    _compiled_islands(80, calls=xla_schedule.HOT_CALLS)
    assert tpu_inductor.wait_for_background_compiles(timeout=120)
    helper = pipelines._BACKGROUND_WORKER._process
    assert helper is not None and helper.poll() is None
    ours = os.getpriority(os.PRIO_PROCESS, 0)
    assert os.getpriority(os.PRIO_PROCESS, helper.pid) == min(19, ours + pipeline_worker.BACKGROUND_NICENESS)


def test_a_choice_cut_short_at_exit_is_not_stored(tmp_path, monkeypatch):
    # At exit the background helper is killed mid-compile: the choice must
    # not then store the default as chosen, or the next process would never choose.
    helper_stopped = threading.Event()

    def ended_with_its_helper(*args, **kwargs):
        helper_stopped.wait(timeout=30)
        raise XlaCompileError("XLA's compiler crashed (the helper process killed by SIGKILL)")

    monkeypatch.setattr(schedule_choice, "compile_and_load", ended_with_its_helper)
    monkeypatch.setattr(pipelines, "stop_background_helper", helper_stopped.set)
    monkeypatch.setattr(schedule_choice, "_EXITING", threading.Event())
    options = {"cache": True, "cache_dir": str(tmp_path)}
    (island,) = _compiled_islands(88, calls=xla_schedule.HOT_CALLS, **options)
    schedule_choice._end_schedule_choices()  # what exit runs
    assert island.xla_schedule is None
    entries = [entry for entry in (tmp_path / "executables").iterdir() if not entry.name.startswith(".")]
    assert len(entries) == 1  # the default's, stored at its compile; nothing under the chosen key


def test_the_choice_is_kept_in_the_cache_for_the_next_process(tmp_path):
    options = {"cache": True, "cache_dir": str(tmp_path)}
    (island,) = _compiled_islands(56, calls=xla_schedule.HOT_CALLS, **options)
    assert tpu_inductor.wait_for_background_compiles(timeout=120)
    assert island.compile_source == "xla" and island.xla_schedule.startswith("memory-optimized")
    fresh_process()
    (island,) = _compiled_islands(56, calls=xla_schedule.HOT_CALLS + 1, **options)
    # The kept executable, from disk: nothing left to choose, no compile.
    assert island.compile_source == "disk" and island.xla_schedule is None
    assert report.current().cache_misses() == {}


def _elementwise(x):
    return torch.relu(x) * 2 + 1


def test_a_kept_default_runs_in_the_next_process(tmp_path):
    # Both schedules need the same memory: the default is kept, and stored
    # under the chosen key from its own entry's bytes (a loaded executable
    # serialized again lacks its functions, and failed in the next process).
    options = {"cache": True, "cache_dir": str(tmp_path), "strict": True}
    x = torch.randn(64, 64)
    for _ in range(2):  # the second time as a new process, from disk
        fresh_process()
        compiled = torch.compile(_elementwise, backend="tpu", options=options)
        for _ in range(xla_schedule.HOT_CALLS):
            torch.testing.assert_close(compiled(x), _elementwise(x), rtol=0, atol=0)
    (island,) = report.current().islands()
    assert island.compile_source == "disk" and island.xla_schedule is None


def test_the_option_turns_the_choice_off():
    (island,) = _compiled_islands(48, calls=xla_schedule.HOT_CALLS, choose_xla_schedule=False)
    assert island.compile_source == "xla" and island.xla_schedule is None


def test_a_scheduler_named_in_xla_flags_stands(monkeypatch):
    # XLA's own default, named: read into the key and the choice, changes nothing else.
    monkeypatch.setenv("XLA_FLAGS", "--xla_cpu_enable_concurrency_optimized_scheduler=true")
    (island,) = _compiled_islands(40, calls=xla_schedule.HOT_CALLS)
    assert island.compile_source == "xla" and island.xla_schedule is None


def _executable(temporary_bytes: int):
    stats = types.SimpleNamespace(temp_size_in_bytes=temporary_bytes)
    return types.SimpleNamespace(get_compiled_memory_stats=lambda: stats)


@pytest.mark.parametrize(
    "default_bytes, optimized_bytes, kept",
    [(13_474_784, 4_464_640, True), (7_424, 2_240, True), (655_360, 786_432, False), (50_432, 50_432, False), (0, 0, False)],
)
def test_kept_only_where_it_needs_clearly_less(default_bytes, optimized_bytes, kept):
    keep, words = xla_schedule.kept_schedule(_executable(default_bytes), _executable(optimized_bytes))
    assert keep is kept
    assert words.startswith("memory-optimized" if kept else "default")


def test_the_override_is_added_to_a_copy():
    from tpu_inductor.runtime import jaxlib_api

    options = jaxlib_api.CompileOptions()
    changed = xla_schedule.memory_optimized(options)
    assert list(changed.env_option_overrides) == [xla_schedule.MEMORY_OPTIMIZED]
    assert list(options.env_option_overrides) == []
