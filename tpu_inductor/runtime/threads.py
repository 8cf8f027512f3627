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
* Released workers start again at the next parallel region, and a kernel
  between islands pays that on every call. For a small kernel it is most of
  the kernel's time, and in some processes far more: MobileNet's stem
  convolution on oneDNN took 0.16 ms warm on two threads, 0.28-0.48 ms
  after a release, 0.33-0.40 ms on one thread, and in one process in two
  its calls after an island had a p90 of 13 ms (the main thread spins at
  OpenMP's barrier while the new worker waits for a core); the model's
  p90 went from 8-9 ms to 13-31 ms. Kernel choice therefore also times a
  kernel on the calling thread alone, and a short one that every thread
  does not make faster by more than starting the workers costs runs there
  (:func:`on_calling_thread`): no workers, nothing to release, nothing to
  spin. Work too small for PyTorch to split (:func:`starts_workers`) does
  not make the next island release either.
"""

from __future__ import annotations

import ctypes
import functools
import logging
from pathlib import Path
from typing import Callable, Optional

import torch

log = logging.getLogger(__name__)

ON_CALLING_THREAD = "tpu_inductor_on_calling_thread"
"""``node.meta`` key: this eager kernel runs on the calling thread alone (placement/kernel_choice.py)."""

PARALLEL_GRAIN = 32768
"""``at::internal::GRAIN_SIZE``: PyTorch's CPU kernels run work on fewer
elements than this on the calling thread, without OpenMP's workers."""

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


def on_calling_thread(run: Callable[..., object]) -> Callable[..., object]:
    """``run`` (an eager kernel between islands) on the calling thread alone."""

    def run_on_calling_thread(*args: object, **kwargs: object) -> object:
        threads = torch.get_num_threads()  # the user's count, restored after the kernel
        torch.set_num_threads(1)
        try:
            return run(*args, **kwargs)
        finally:
            torch.set_num_threads(threads)

    return run_on_calling_thread


def carry_thread_choice(chosen: torch.fx.Node, rewritten: torch.fx.Node) -> None:
    """A rewrite that replaces a chosen eager kernel keeps where it runs."""
    if chosen.meta.get(ON_CALLING_THREAD):
        rewritten.meta[ON_CALLING_THREAD] = True


def starts_workers(node: torch.fx.Node) -> bool:
    """Whether running ``node`` eagerly may start OpenMP's workers: it is not
    pinned to the calling thread and touches a tensor PyTorch would split
    (or has no metadata to tell)."""
    if node.meta.get(ON_CALLING_THREAD):
        return False
    values = [node.meta.get("val"), *(arg.meta.get("val") for arg in node.all_input_nodes)]
    if values[0] is None:
        return True
    tensors = [t for v in values for t in (v if isinstance(v, (list, tuple)) else (v,)) if isinstance(t, torch.Tensor)]
    return any(not isinstance(t.numel(), int) or t.numel() >= PARALLEL_GRAIN for t in tensors)
