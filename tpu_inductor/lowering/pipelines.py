"""torch-mlir's two pass pipelines (Torch IR -> backend IR -> StableHLO), in a
helper process that may crash (which also compiles for XLA:CPU:
runtime/isolated_compile.py).

Why: MLIR aborts the whole process on some inputs (``LLVM ERROR: Failed to
infer result type(s)`` for a broadcasting shift, assertion failures in a
conversion), and an abort cannot be caught: the user's program died with
it. The promise is that a lowering problem never fails the user's call, so
the pipelines run in a helper process (``pipeline_worker.py``, which imports
only torch-mlir's bindings). When it dies, the island's lowering fails like
any other (:class:`IslandLoweringError`, naming the crash and what MLIR
printed), the culprit search proves which op caused it, and that op runs in
eager PyTorch; the next lowering starts a new helper.

Cost: one process start (about 0.5 s of CPU, begun when the backend is
first called, so it overlaps tracing: a cold first call of an MLP took 0.10 s
longer, median of 5 paired runs on 2 cores) and a bytecode round trip per
island, a few milliseconds next to the pipelines themselves. The FX import stays here:
it is Python building IR, not where MLIR aborts. ``isolate_lowering=False``
runs the pipelines in this process.
"""

from __future__ import annotations

import atexit
import logging
import os
import re
import subprocess
import sys
import tempfile
import threading
from pathlib import Path
from typing import Any, Optional

from tpu_inductor.errors import LoweringError
from tpu_inductor.lowering import pipeline_worker

log = logging.getLogger(__name__)

TORCH_TO_BACKEND = (
    "builtin.module(func.func(torch-match-quantized-custom-ops),"
    " torchdynamo-export-to-torch-backend-pipeline{ extra-library=})"
)
BACKEND_TO_STABLEHLO = "builtin.module(torch-backend-to-stablehlo-backend-pipeline{allow-non-finites=True})"
# Both spellings torch-mlir uses for an op it could not convert:
#   "torch.operator"(...) <{name = "torch.aten._fft_r2c"}>  and  'torch.aten.i0'
_OP_IN_DIAGNOSTIC = re.compile(r"""name = "torch\.(aten\.[\w.]+)"|'torch\.(aten\.[\w.]+)'""")


class IslandLoweringError(LoweringError):
    """torch-mlir failed; ``failed_ops`` are the ATen op names it blamed."""

    def __init__(self, stage: str, diagnostics: list[str], ir: str) -> None:
        self.stage = stage
        self.diagnostics = diagnostics
        self.ir = ir
        self.failed_ops = sorted({a or b for d in diagnostics for a, b in _OP_IN_DIAGNOSTIC.findall(d)})
        summary = "\n".join(diagnostics[:5]) or "(no diagnostics)"
        super().__init__(f"torch-mlir failed at {stage}:\n{summary}")

_PACKAGE_PARENT = str(Path(pipeline_worker.__file__).resolve().parents[2])
_STDERR_TAIL = 4000


class _Worker:
    """One helper process, started on first use and again after a crash;
    ``background``: the one for compiles no call waits for
    (pipeline_worker.py's ``--background``)."""

    def __init__(self, background: bool = False) -> None:
        self._arguments = ["--background"] if background else []
        self._stopped_now = False
        self._lock = threading.Lock()
        self._process: Optional[subprocess.Popen] = None
        self._stderr: Any = None

    def start(self) -> None:
        with self._lock:
            self._ensure_started()

    def _ensure_started(self) -> subprocess.Popen:
        if self._process is None or self._process.poll() is not None:
            self._stderr = tempfile.TemporaryFile()
            # This package's own copy, installed or not.
            environment = dict(os.environ, PYTHONPATH=os.pathsep.join(
                filter(None, [_PACKAGE_PARENT, os.environ.get("PYTHONPATH")])))
            self._process = subprocess.Popen(
                [sys.executable, "-m", "tpu_inductor.lowering.pipeline_worker", *self._arguments],
                stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self._stderr, env=environment,
            )
        return self._process

    def run(self, request: dict) -> dict:
        """The worker's reply, or ``{"crashed": <how>, "stderr": <its last words>}``."""
        with self._lock:
            process = self._ensure_started()
            try:
                pipeline_worker.write_message(process.stdin, request)
                reply = pipeline_worker.read_message(process.stdout)
            except (BrokenPipeError, OSError):
                reply = None
            if reply is not None:
                return reply
            if self._stopped_now:  # our doing, not a crash to warn of
                return {"error": "the helper was stopped as the program ends"}
            return {"crashed": _how_it_ended(process), "stderr": self._last_words()}

    def _last_words(self) -> str:
        self._stderr.seek(0, 2)
        size = self._stderr.tell()
        self._stderr.seek(max(0, size - _STDERR_TAIL))
        return self._stderr.read().decode(errors="replace")

    def stop(self, now: bool = False) -> None:
        """End the helper once its request is done, or ``now``, in the middle of it."""
        process = self._process
        if process is None or process.poll() is not None:
            return
        if now:
            self._stopped_now = True
            process.kill()
            process.wait()
        else:
            process.stdin.close()  # the worker ends at end of input
            try:
                process.wait(timeout=5)
            except subprocess.TimeoutExpired:
                process.kill()


def _how_it_ended(process: subprocess.Popen) -> str:
    try:
        code = process.wait(timeout=10)
    except subprocess.TimeoutExpired:
        process.kill()
        return "stopped answering"
    if code < 0:
        import signal

        try:
            return f"killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"killed by signal {-code}"
    return f"exited with status {code}"


_WORKER = _Worker()
atexit.register(_WORKER.stop)

# Compiles beside the user's program (runtime/schedule_choice.py's
# ScheduleChoice): at a lower priority, and never ahead of a lowering that a
# call waits for in the helper above.
_BACKGROUND_WORKER = _Worker(background=True)
atexit.register(_BACKGROUND_WORKER.stop)


def stop_background_helper() -> None:
    """End the background helper now, a compile it is running included."""
    _BACKGROUND_WORKER.stop(now=True)


def start_worker() -> None:
    """Start the helper now, so it is ready by the first lowering."""
    _WORKER.start()


def last_words(crashed: dict, doing: str) -> list[str]:
    """Log that the helper died while ``doing``; the non-empty lines it printed last."""
    log.warning("tpu_inductor: the helper process %s while %s", crashed["crashed"], doing)
    return [line for line in crashed["stderr"].splitlines() if line.strip()]


def run_in_helper(request: dict, background: bool = False) -> dict:
    """The helper's reply to ``request``, or ``{"crashed": <how>, "stderr": <its last words>}``
    (the next request starts a new helper); ``background``: a request nothing
    waits for, served by a second helper at a lower priority."""
    return (_BACKGROUND_WORKER if background else _WORKER).run(request)


def to_stablehlo(
    module: Any, *, isolate: bool, fix_up: bool = True, for_cpu: bool = False, text: bool = False,
    label: str = "",
) -> dict:
    """``module`` (torch-mlir's FX import) lowered to StableHLO and, with
    ``fix_up``, given fixups.py's rewrites (symbolic modules get them after
    refinement instead):
    ``{"bytecode": ..., "text": ... when asked}``. Raises
    :class:`IslandLoweringError` when a stage fails or the helper crashes.
    ``label`` qualifies the stage names (`` (dynamic shapes)``)."""
    pipelines = [(TORCH_TO_BACKEND, f"FX -> Torch backend IR{label}"),
                 (BACKEND_TO_STABLEHLO, f"Torch backend IR -> StableHLO{label}")]
    if not isolate:
        failure = pipeline_worker.lower(module, pipelines, fix_up=fix_up, for_cpu=for_cpu)
        if failure is not None:
            raise IslandLoweringError(**failure)
        return pipeline_worker.finished(module, text)
    reply = _WORKER.run({"module": pipeline_worker.bytecode_of(module), "pipelines": pipelines, "fix_up": fix_up,
                         "for_cpu": for_cpu, "text": text})
    if "crashed" in reply:
        said = last_words(reply, "lowering an island")
        raise IslandLoweringError(
            f"torch-mlir's pass pipelines (the helper process {reply['crashed']})",
            said[-3:] or [f"the helper process {reply['crashed']}"],
            module.operation.get_asm(large_elements_limit=16),
        )
    if "stage" in reply:
        raise IslandLoweringError(**reply)
    return reply
