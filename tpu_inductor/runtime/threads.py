"""One thread budget for PyTorch's kernels and XLA:CPU's, on the same cores.

Why: on the CPU client, eager kernels (OpenMP, ``torch.get_num_threads()``
threads) and XLA's executables (its own intra-op pool) share the machine's
cores, and each runtime sized and scheduled its threads as if alone:

* XLA's pool had as many threads as the machine has cores whatever PyTorch
  was told, so ``torch.set_num_threads(1)`` left XLA on every core.
  :func:`xla_cpu_threads` sizes it by PyTorch's setting instead.
* After a parallel region, libgomp's workers spin for milliseconds waiting
  for the next one. An island that runs right after an eager kernel then
  has one core fewer: a MobileNet-style model (2 cores, default threads)
  whose first convolution ran on oneDNN took 10.6 ms a call, 8.0 ms with
  the spinning workers released before each island that follows eager work
  (all on XLA: 7.9 ms; eager: 7.5 ms; one process, 20 paired rounds).
  Releasing costs ~0.1 ms at the next parallel region, which starts its
  workers again; perf.py's ResNet-style CNN (8 convolutions on oneDNN, 3
  islands) measured the same either way. :func:`release_eager_workers`.
  An optimizer step that runs in place on PyTorch's kernels (backend.py)
  releases them after it, for the next step's forward and backward: perf.py's
  MLP training step, each path alone in its process, 17.0/18.5 ms without
  and 14.2/11.2 ms with (Inductor 17.2/15.1, eager 16.4/11.0; two runs).
"""

from __future__ import annotations

import ctypes
import functools
import logging
from pathlib import Path
from typing import Callable, Optional

import torch

log = logging.getLogger(__name__)

_OMP_PAUSE_SOFT = 1
"""``omp_pause_soft`` (OpenMP 5.0): the runtime's threads stop; the next parallel region starts them."""


def xla_cpu_threads(configured: Optional[int]) -> int:
    """Threads for XLA:CPU's intra-op pool: ``Config.pjrt_nproc`` when set,
    else as many as PyTorch's kernels use."""
    return configured or torch.get_num_threads()


@functools.cache
def _omp_pause() -> Optional[Callable[[int], int]]:
    """``omp_pause_resource_all`` of the OpenMP runtime PyTorch runs on, if it has one."""
    candidates = [Path(torch.__file__).parent / "lib" / name for name in ("libgomp.so.1", "libiomp5.so", "libomp.so")]
    for path in candidates:
        if not path.exists():
            continue
        try:
            pause = ctypes.CDLL(str(path)).omp_pause_resource_all
        except (OSError, AttributeError):
            continue
        pause.argtypes, pause.restype = [ctypes.c_int], ctypes.c_int
        return pause
    log.debug("tpu_inductor: no OpenMP runtime with omp_pause_resource_all beside torch; eager workers keep spinning")
    return None


def eager_workers_compete(shares_host_cores: bool) -> bool:
    """Whether islands that follow eager kernels should release OpenMP's
    workers first: XLA runs on the same cores (the CPU client) and PyTorch
    runs parallel regions (more than one thread)."""
    return shares_host_cores and torch.get_num_threads() > 1 and _omp_pause() is not None


def release_eager_workers() -> None:
    """Stop OpenMP's spinning workers so that the next island has every core."""
    pause = _omp_pause()
    if pause is not None:
        pause(_OMP_PAUSE_SOFT)


def after_releasing_eager_workers(run: Callable[..., tuple]) -> Callable[..., tuple]:
    """``run`` (an island's call), releasing OpenMP's workers first."""

    def run_with_every_core(*tensors: torch.Tensor) -> tuple:
        release_eager_workers()
        return run(*tensors)

    return run_with_every_core


def then_releasing_eager_workers(run: Callable[..., object]) -> Callable[..., object]:
    """``run`` (eager work: an optimizer step run in place), releasing OpenMP's workers after it."""

    def run_then_release(*args: object) -> object:
        result = run(*args)
        release_eager_workers()
        return result

    return run_then_release
