"""tpu_inductor: a ``torch.compile`` backend that runs PyTorch on XLA via PJRT.

Use it with ``torch.compile(model, backend="tpu")``; no import is needed.
Importing this package is cheap: heavy modules load on first compile.
"""

from __future__ import annotations

import sys
from typing import Optional

__version__ = "0.1.0"

__all__ = ["__version__", "explain", "report", "shard", "shards", "tpu_backend", "wait_for_background_compiles"]


def wait_for_background_compiles(timeout: Optional[float] = None) -> bool:
    """Wait for the compiles that run beside your program: on the CPU client,
    an island compiled once more at its 100th call with XLA:CPU's other
    scheduler (runtime/xla_schedule.py), which the island then runs. For
    benchmarks: time after this. Returns whether none is still running
    after at most ``timeout`` seconds in all."""
    choices = sys.modules.get("tpu_inductor.runtime.schedule_choice")  # imported with the first choice
    return choices is None or choices.wait_for_schedule_choices(timeout)


def __getattr__(name: str):
    if name == "tpu_backend":
        from tpu_inductor.backend import tpu_backend

        return tpu_backend
    if name == "explain":
        from tpu_inductor.reporting.explain import explain

        return explain
    if name == "shard":
        from tpu_inductor.placement.shardings import shard

        return shard
    if name == "shards":
        from tpu_inductor.runtime.result_shards import shards

        return shards
    if name == "report":
        import importlib

        return importlib.import_module("tpu_inductor.report")
    raise AttributeError(f"module 'tpu_inductor' has no attribute {name!r}")


if "torch" in sys.modules:
    # Where torch is loaded already, registering our entries' type with its
    # portable cache bundle is cheap, and must precede load_cache_artifacts()
    # (runtime/cache_artifacts.py). The CLI, which imports no torch, skips it.
    from tpu_inductor.runtime import cache_artifacts as _cache_artifacts  # noqa: F401
