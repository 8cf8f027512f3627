"""Worker processes for the correctness sweeps: a crash or a hang costs one phase of one task.

Worker protocol. The parent splits its tasks (JSON dicts with an ``id``) into
chunks and runs each chunk in a worker subprocess: the sweep script itself with
``--worker TASKS_FILE LOG_FILE``. The worker (:func:`worker_main`) runs each
task through *phases* (``eager``, ``aot_eager``, ``tpu``, ``sample3`` ...) and
appends one JSON line to the log when a phase starts and one when it ends. The
parent follows the log while the worker runs, so:

* a worker that dies (segfault, abort, OOM kill) is blamed on the phase it had
  started: that phase is recorded as ``crash`` with the signal or the last line
  of stderr, and a fresh worker takes the rest of the chunk, skipping the phases
  already recorded;
* a phase that runs past its task's ``timeout`` gets its worker killed (the
  whole process group) and is recorded as ``timeout``.

A task may declare ``phases`` (their order), ``depends`` (``{phase: phase it
needs}``) and ``reference`` (phases whose failure leaves nothing to compare
with, like the eager run). When a phase crashes or times out, the phases that
depend on it are filled in without running: ``skipped`` under a failed
reference, else the same outcome with ``not run: <phase> <outcome>``. A crash
in a reference phase or outside any phase ends the task, so a worker never
retries what killed it.

``SWEEP_CRASH_AT=ID:PHASE`` (or ``--crash-at``) makes the worker call
``os.abort()`` as that phase starts, and ``SWEEP_HANG_AT`` makes it sleep
forever: the checks that crashes and timeouts are counted.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import json
import os
import re
import shutil
import signal
import subprocess
import tempfile
import threading
import time
import traceback
from pathlib import Path
from typing import Any, Callable, Iterator, Optional

ROOT = Path(__file__).resolve().parent.parent

PASS, MISMATCH, ERROR, CRASH, TIMEOUT, SKIPPED = "pass", "mismatch", "error", "crash", "timeout", "skipped"
FAILURES = (MISMATCH, ERROR, CRASH, TIMEOUT)
OUTCOMES = (PASS, MISMATCH, ERROR, CRASH, TIMEOUT, SKIPPED)

SCRATCH_ENV = "SWEEP_SCRATCH"
CRASH_ENV, HANG_ENV = "SWEEP_CRASH_AT", "SWEEP_HANG_AT"



# ---------------------------------------------------------------- worker side


class WorkerLog:
    """The worker's side of the protocol: one JSON line per phase start and end."""

    def __init__(self, path: Path):
        self._out = open(path, "a")
        self._task: Optional[dict] = None
        self._crash_at = set(filter(None, os.environ.get(CRASH_ENV, "").split(",")))
        self._hang_at = set(filter(None, os.environ.get(HANG_ENV, "").split(",")))

    def _write(self, **entry: Any) -> None:
        self._out.write(json.dumps(entry, default=str) + "\n")
        self._out.flush()

    def info(self, **fields: Any) -> None:
        """Task-level facts (names, descriptions) kept beside the phases."""
        self._write(event="info", id=self._task["id"], info=fields)

    def skip(self, phase: str, reason: str) -> None:
        """Record ``phase`` as skipped without running it (nothing to compare with)."""
        self._write(event="result", id=self._task["id"], phase=phase,
                    record={"outcome": SKIPPED, "error": reason})

    def wants(self, phase: str) -> bool:
        """False for a phase an earlier worker already recorded (or crashed in)."""
        return phase not in self._task.get("skip", ())

    @contextlib.contextmanager
    def phase(self, name: str) -> Iterator[dict]:
        """Run one phase; the body fills the yielded record (``outcome`` at least).

        An exception escaping the body is a bug of the harness, not of the
        backend: it is recorded as ``error`` with ``harness: True`` and the
        task goes on."""
        key = f"{self._task['id']}:{name}"
        self._write(event="start", id=self._task["id"], phase=name)
        if key in self._crash_at:
            os.abort()
        if key in self._hang_at:
            while True:
                time.sleep(60)
        record: dict = {}
        started = time.perf_counter()
        try:
            yield record
        except Exception as exc:  # noqa: BLE001 - keep the chunk going
            record.update(outcome=ERROR, harness=True, error=describe(exc)["error"],
                          traceback=traceback.format_exc()[-2000:])
        record.setdefault("outcome", ERROR)
        record.setdefault("seconds", round(time.perf_counter() - started, 3))
        self._write(event="result", id=self._task["id"], phase=name, record=record)

    def run(self, tasks: list[dict], run_task: Callable[[dict, "WorkerLog"], None]) -> None:
        for task in tasks:
            self._task = task
            self._write(event="task_start", id=task["id"])
            try:
                run_task(task, self)
            except Exception:  # noqa: BLE001 - outside any phase: the harness's bug
                self._write(event="info", id=task["id"], info={"harness_error": traceback.format_exc()[-2000:]})
            self._write(event="task_done", id=task["id"])


def worker_main(argv: list[str], run_task: Callable[[dict, WorkerLog], None],
                setup: Optional[Callable[[], None]] = None) -> None:
    """Entry point of a worker: ``argv`` is ``[TASKS_FILE, LOG_FILE]``."""
    tasks_file, log_file = argv
    if setup is not None:
        setup()
    WorkerLog(Path(log_file)).run(json.loads(Path(tasks_file).read_text()), run_task)


# ---------------------------------------------------------------- parent side


_GLOG_INFO = re.compile(r"^[IW]\d{4} ")


def describe_exit(returncode: int, stderr: str) -> str:
    """``SIGABRT`` or ``exit 1: <last meaningful stderr line>``."""
    lines = [line.strip() for line in stderr.strip().splitlines() if line.strip() and not _GLOG_INFO.match(line)]
    last = lines[-1][:300] if lines else ""
    if returncode < 0:
        try:
            name = signal.Signals(-returncode).name
        except ValueError:
            name = f"signal {-returncode}"
        if returncode == -signal.SIGKILL:
            name += " (out of memory?)"
        return f"{name}: {last}" if last else name
    return f"exit {returncode}: {last}" if last else f"exit {returncode}"


class _Task:
    def __init__(self, spec: dict):
        self.spec = spec
        self.id = spec["id"]
        self.phases_declared: list[str] = list(spec.get("phases", ()))
        self.depends: dict[str, str] = dict(spec.get("depends", {}))
        self.reference: set[str] = set(spec.get("reference", ()))
        self.record: dict = {"id": self.id, "phases": {}}
        self.done = False

    def recorded(self) -> set[str]:
        return set(self.record["phases"])

    def dependents(self, phase: str) -> list[str]:
        """The declared phases that need ``phase``, directly or through others."""
        out = []
        for candidate in self.phases_declared:
            parent, seen = self.depends.get(candidate), set()
            while parent is not None and parent not in seen:
                if parent == phase:
                    out.append(candidate)
                    break
                seen.add(parent)
                parent = self.depends.get(parent)
        return out

    def fail(self, phase: str, outcome: str, error: str, seconds: float) -> None:
        """Record a crash/timeout of ``phase`` and what it takes down with it."""
        self.record["phases"][phase] = {"outcome": outcome, "error": error, "seconds": round(seconds, 3)}
        for dependent in self.dependents(phase):
            if dependent in self.record["phases"]:
                continue
            filled = SKIPPED if phase in self.reference else outcome
            self.record["phases"][dependent] = {"outcome": filled, "error": f"not run: {phase} {outcome}"}
        if phase in self.reference or (self.phases_declared and phase not in self.phases_declared):
            self.finish(f"not run: {phase} {outcome}")
        elif self.phases_declared and all(p in self.record["phases"] for p in self.phases_declared):
            self.done = True

    def finish(self, note: str = "not run") -> None:
        for phase in self.phases_declared:
            self.record["phases"].setdefault(phase, {"outcome": SKIPPED, "error": note})
        self.done = True


class _LogReader:
    def __init__(self, path: Path):
        self.path, self.offset, self.partial = path, 0, ""

    def read(self) -> list[dict]:
        if not self.path.exists():
            return []
        with self.path.open() as handle:
            handle.seek(self.offset)
            text = handle.read()
            self.offset = handle.tell()
        text, self.partial = self.partial + text, ""
        lines = text.split("\n")
        if lines and lines[-1]:
            self.partial = lines.pop()
        return [json.loads(line) for line in lines if line.strip()]


def _kill_group(proc: subprocess.Popen) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    proc.wait()


def _run_chunk(tasks: list[_Task], command: list[str], workdir: Path, name: str, env: dict,
               startup_timeout: float, on_done: Callable[[dict], None], default_timeout: float) -> None:
    """Run ``tasks`` in workers until each is done, replacing workers that die."""
    attempt, barren = 0, 0
    pending = [t for t in tasks if not t.done]
    while pending:
        attempt += 1
        tasks_file = workdir / f"{name}-{attempt}.tasks.json"
        log_file, err_file = workdir / f"{name}-{attempt}.jsonl", workdir / f"{name}-{attempt}.stderr"
        tasks_file.write_text(json.dumps([dict(t.spec, skip=sorted(t.recorded())) for t in pending]))
        before = sum(len(t.recorded()) + t.done for t in pending)
        by_id = {t.id: t for t in pending}
        reader = _LogReader(log_file)
        current: Optional[_Task] = None
        open_phase: Optional[str] = None
        phase_started = last_event = time.monotonic()
        stderr_mark = 0
        killed: Optional[str] = None
        with err_file.open("w") as err:
            proc = subprocess.Popen([*command, str(tasks_file), str(log_file)], stdout=subprocess.DEVNULL,
                                    stderr=err, env=env, cwd=ROOT, start_new_session=True)
            while True:
                returncode = proc.poll()
                for entry in reader.read():
                    last_event = time.monotonic()
                    task = by_id.get(entry["id"])
                    if task is None:
                        continue
                    kind = entry["event"]
                    if kind == "task_start":
                        current, open_phase = task, None
                    elif kind == "start":
                        open_phase, phase_started = entry["phase"], time.monotonic()
                        stderr_mark = err_file.stat().st_size  # what the phase prints comes after
                    elif kind == "result":
                        task.record["phases"][entry["phase"]] = entry["record"]
                        open_phase = None
                    elif kind == "info":
                        task.record.setdefault("info", {}).update(entry["info"])
                    elif kind == "task_done":
                        task.finish()
                        on_done(task.record)
                        current, open_phase = None, None
                if returncode is not None:
                    break
                now = time.monotonic()
                limit = float(current.spec.get("timeout", default_timeout)) if current else default_timeout
                if open_phase is not None and now - phase_started > limit:
                    killed = f"over {limit:.0f} s"
                    _kill_group(proc)
                    continue  # read what the log still has, then leave
                if open_phase is None and now - last_event > startup_timeout:
                    killed = f"no progress for {startup_timeout:.0f} s"
                    _kill_group(proc)
                    continue
                time.sleep(0.1)
        raw = err_file.read_bytes() if err_file.exists() else b""
        stderr = (raw[stderr_mark:] if open_phase is not None else raw).decode(errors="replace")
        if current is not None and not current.done:
            elapsed = time.monotonic() - phase_started
            if open_phase is not None:
                outcome = TIMEOUT if killed and killed.startswith("over") else CRASH
                error = f"timeout: {killed}" if outcome == TIMEOUT else f"crash: {describe_exit(proc.returncode, stderr)}"
                current.fail(open_phase, outcome, error, elapsed)
            else:  # died between phases (sample generation, module construction)
                error = f"crash: {killed or describe_exit(proc.returncode, stderr)}"
                current.fail("setup", CRASH, error, 0.0)
                current.finish("not run: setup crashed")
            if current.done:
                on_done(current.record)
        # A worker that records nothing twice in a row (it dies on start-up, or
        # between tasks) would be restarted forever: give up on the chunk.
        barren = 0 if sum(len(t.recorded()) + t.done for t in pending) > before else barren + 1
        if barren >= 2:
            error = f"worker failed to start: {describe_exit(proc.returncode, stderr)}"
            for task in pending:
                if not task.done:
                    task.record["phases"].setdefault("setup", {"outcome": CRASH, "error": error})
                    task.finish(error)
                    on_done(task.record)
        pending = [t for t in pending if not t.done]


def run_tasks(tasks: list[dict], command: list[str], *, jobs: int = 1, chunk: int = 50,
              timeout: float = 120.0, startup_timeout: float = 600.0, env: Optional[dict] = None,
              workdir: Optional[Path] = None, progress: Optional[Callable[[dict, int, int], None]] = None,
              ) -> dict[str, dict]:
    """Run every task in worker subprocesses; ``{id: record}`` in task order.

    ``command`` starts a worker (``[python, script, "--worker"]``); the tasks
    file and the log path are appended. ``timeout`` is per phase unless a task
    sets its own ``timeout``. ``progress(record, done, total)`` is called as
    each task finishes."""
    own_workdir = workdir is None
    workdir = Path(tempfile.mkdtemp(prefix="sweep-logs-")) if own_workdir else workdir
    workdir.mkdir(parents=True, exist_ok=True)
    env = dict(os.environ if env is None else env)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    wrapped = [_Task(spec) for spec in tasks]
    lock = threading.Lock()
    finished = [0]

    def on_done(record: dict) -> None:
        with lock:
            finished[0] += 1
            if progress is not None:
                progress(record, finished[0], len(wrapped))

    chunks = [wrapped[i:i + chunk] for i in range(0, len(wrapped), max(chunk, 1))]
    try:
        with concurrent.futures.ThreadPoolExecutor(max_workers=max(jobs, 1)) as pool:
            futures = [pool.submit(_run_chunk, c, command, workdir, f"chunk{i:04d}", env, startup_timeout,
                                   on_done, timeout) for i, c in enumerate(chunks)]
            for future in futures:
                future.result()
    finally:
        if own_workdir:
            shutil.rmtree(workdir, ignore_errors=True)
    return {t.id: t.record for t in wrapped}


def root_cause(exc: BaseException) -> BaseException:
    """The innermost exception: Dynamo wraps the backend's error in its own."""
    seen = set()
    while exc.__cause__ is not None and id(exc) not in seen:
        seen.add(id(exc))
        exc = exc.__cause__
    return exc


def _first_line(exc: BaseException) -> str:
    for line in str(exc).splitlines():
        if line.strip():
            return line.strip()
    return ""


def describe(exc: BaseException) -> dict:
    """``{"outcome": "error", "error_kind": ..., "error": "Type: first line"}``.

    ``error_kind`` is ``dynamo`` for Dynamo's own errors (an unsupported Python
    feature: not the backend's doing, and aot_eager usually hits it too),
    ``backend`` for what the backend raised (Dynamo wraps it in
    ``BackendCompilerFailed``), else ``runtime``."""
    root = root_cause(exc)
    names = {type(e).__module__ + "." + type(e).__name__ for e in (exc, root)}
    if any("BackendCompilerFailed" in n for n in names):
        kind = "backend"
    elif any(n.startswith("torch._dynamo.exc") for n in names):
        kind = "dynamo"
    else:
        kind = "runtime"
    return {"outcome": ERROR, "error_kind": kind, "error": f"{type(root).__name__}: {_first_line(root)}"[:500]}
