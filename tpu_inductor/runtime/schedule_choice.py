"""XLA:CPU's scheduler chosen per module once an executable of it is hot,
in the background (the rules of the choice are runtime/xla_schedule.py's).

Why a module of its own: the choice is a second compile that runs on a
thread beside the user's program, hands its result to every executable of
the module, and must end cleanly at exit; runtime/executable.py compiles and
runs, and only starts it (``compile_stablehlo`` makes one per module,
``DeviceExecutable`` begins it at its hot call).
"""

from __future__ import annotations

import atexit
import logging
import threading
import time
import weakref
from typing import Any, Optional, Union

from tpu_inductor import report
from tpu_inductor.process_state import STATE
from tpu_inductor.runtime import xla_schedule
from tpu_inductor.runtime.disk_cache import CacheDir, CacheKey
from tpu_inductor.runtime.executable import DeviceExecutable, store_executable, xla_compile_options
from tpu_inductor.runtime.isolated_compile import XlaCompileError, compile_and_load
from tpu_inductor.runtime.platform import Platform

log = logging.getLogger(__name__)


class ScheduleChoice:
    """XLA:CPU's scheduler for one module (runtime/xla_schedule.py), chosen
    once an executable of it is hot: the module compiled with the
    memory-optimized scheduler, compared with the default's executable, and
    the one kept stored under the chosen key (memory and disk), so that a
    later compile of the module, here or in another process, takes it at
    once. Shared by every executable of the module in this process (a
    model's identical layers): the first to be hot chooses, the others take
    its choice.

    The choice compiles on a thread of its own (:meth:`begin`) while the
    default executable keeps running, and hands the one kept to every
    executable of the module (:meth:`serve`): made in the hot call itself, it
    stalled that call for the compile (the quickstart's 100th call took 420
    ms, its others 4). On the CPU client XLA compiles in a helper process of
    lower priority (lowering/pipelines.py), so the thread mostly waits on a
    pipe, without the GIL, and the compile takes the cores the program
    leaves idle."""

    def __init__(
        self,
        module: Union[bytes, str],
        platform: Platform,
        devices: Any,
        tunes_reductions: bool,
        isolate: bool,
        disk_cache: Optional[CacheDir],
        key: CacheKey,
        default_key: CacheKey,
    ) -> None:
        self._module, self._platform, self._devices = module, platform, devices
        self._tunes_reductions, self._isolate, self._disk_cache, self._key = tunes_reductions, isolate, disk_cache, key
        self._default_key = default_key
        self._lock = threading.Lock()
        self._thread: Optional[threading.Thread] = None
        self._kept: Optional[Any] = None
        self._served: "weakref.WeakSet[DeviceExecutable]" = weakref.WeakSet()
        self.words: Optional[str] = None
        """The report's words for the choice, once made."""
        self.records: list[report.IslandRecord] = []
        """Islands whose ``xla_schedule`` the choice fills in."""

    def begin(self, default: Any) -> None:
        """Start choosing between ``default`` (the default schedule's
        executable of the module) and the memory-optimized one, in the
        background; a later call does nothing."""
        with self._lock:  # two executables of the module hot at once: one thread
            if self._thread is not None or _EXITING.is_set():
                return
            # Its compile seconds go to the record current now, whatever resets it meanwhile.
            self._thread = threading.Thread(
                target=self._choose_in_background, args=(default, report.current()), name="tpu_inductor-xla-schedule",
                daemon=True,
            )
            self._thread.start()

    def serve(self, executable: DeviceExecutable) -> None:
        """Hand ``executable`` (of this module) the executable kept, once chosen: now, if it is."""
        with self._lock:
            self._served.add(executable)
            kept = self._kept
        if kept is not None:
            executable.take(kept)

    def wait(self, timeout: Optional[float] = None) -> bool:
        """Wait for a choice begun to be made; whether none is still compiling."""
        thread = self._thread
        if thread is not None:
            thread.join(timeout)
        return thread is None or not thread.is_alive()

    def _choose_in_background(self, default: Any, into: report.Report) -> None:
        try:
            kept = self._choose(default, into)
        except Exception:  # noqa: BLE001 - the choice is an optimisation: a failure keeps the default running
            log.warning("tpu_inductor: choosing XLA:CPU's schedule for %s failed; the default stays",
                        self._key.digest, exc_info=True)
            self.words = "default (the choice failed: see the log)"
            kept = default
        with self._lock:  # an executable served from now on takes it in serve()
            self._kept = kept
            served = list(self._served)
        for executable in served:
            executable.take(kept)

    def _choose(self, default: Any, into: report.Report) -> Any:
        """The executable kept; its compile seconds are counted in ``into``."""
        started = time.perf_counter()
        options, _ = xla_compile_options(self._module, None, (), self._tunes_reductions)  # one device: no mesh
        try:
            alternative, serialized = compile_and_load(
                self._platform, self._module, self._devices, xla_schedule.memory_optimized(options),
                isolate=self._isolate, background=True,
            )
            keep, self.words = xla_schedule.kept_schedule(default, alternative)
        except (XlaCompileError, RuntimeError) as exc:  # the default compiled: keep it
            if _EXITING.is_set():  # cut short: no choice was made, none is stored
                return default
            log.debug("tpu_inductor: the memory-optimized schedule did not compile (%s)", exc)
            keep, self.words = False, "default (the memory-optimized schedule did not compile)"
        finally:
            # Beside the program: not compile time that a call waited for.
            report.add_background_seconds(into, "xla", time.perf_counter() - started)
        kept, blob = (alternative, serialized) if keep else (default, self._default_bytes())
        STATE.executables[self._key.digest] = kept
        if self._disk_cache is not None and (keep or blob is not None):
            store_executable(
                self._disk_cache, self._key, self._module, kept, blob, self._platform, time.perf_counter() - started
            )
        for record in self.records:
            record.xla_schedule = self.words
        self._module = None  # made once: the module need not stay in memory
        log.info(
            "tpu_inductor: executable %s ran %d times: XLA:CPU schedule %s",
            self._key.digest, xla_schedule.HOT_CALLS, self.words,
        )
        return kept

    def _default_bytes(self) -> Optional[bytes]:
        """The default executable as XLA serialized it, from its own cache entry.
        Not ``serialize_executable`` of the loaded one: an executable loaded
        from bytes (the helper's, or the disk's) serializes without its
        functions ("Function ... not found" when the copy runs)."""
        if self._disk_cache is None:
            return None
        return self._disk_cache.load("executables", self._default_key, lambda files: files["executable.bin"]).value


def wait_for_schedule_choices(timeout: Optional[float] = None) -> bool:
    """Wait for the schedule choices compiling in the background, at most
    ``timeout`` seconds in all; whether none is still compiling."""
    deadline = None if timeout is None else time.monotonic() + timeout

    def left() -> Optional[float]:
        return None if deadline is None else max(0.0, deadline - time.monotonic())

    return all([choice.wait(left()) for choice in list(STATE.schedule_choices.values())])


_EXITING = threading.Event()
"""Set at exit: a choice whose compile is cut short then is dropped, not stored."""


def _end_schedule_choices() -> None:
    """At exit, a choice still compiling is dropped (the next process makes it
    again) rather than waited for: its helper is stopped, and its thread ends.
    A compile in this process (``isolate_lowering=False``) cannot be cut
    short, and a daemon thread inside jaxlib at shutdown is not safe: those
    are waited for, a minute in all at most."""
    _EXITING.set()
    from tpu_inductor.lowering.pipelines import stop_background_helper

    stop_background_helper()
    wait_for_schedule_choices(60.0)


atexit.register(_end_schedule_choices)
