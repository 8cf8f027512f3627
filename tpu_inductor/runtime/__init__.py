"""PJRT runtime: clients per platform, compile, executable cache, transfers.

Owns every byte that crosses host <-> device and every on-disk artifact.
Names are loaded on first use: ``runtime.disk_cache`` (all the CLI's
``cache`` commands need) must not pay for importing torch and jaxlib.
"""

from __future__ import annotations

import importlib
import os
from typing import Any

# jaxlib's C++ logging prints INFO lines to stderr when a PJRT client starts
# ("PjRt-IFRT device count: ..."); it reads its level once, as jaxlib loads,
# and every module here that imports jaxlib imports this package first.
# WARNING and above still show; a user's own setting wins.
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "1")

_EXPORTS = {
    "DeviceExecutable": "tpu_inductor.runtime.executable",
    "compile_stablehlo": "tpu_inductor.runtime.executable",
    "Platform": "tpu_inductor.runtime.platform",
    "get_platform": "tpu_inductor.runtime.platform",
    "select_platform": "tpu_inductor.runtime.platform",
}

__all__ = ["DeviceExecutable", "Platform", "compile_stablehlo", "get_platform", "select_platform"]


def __getattr__(name: str) -> Any:
    if name in _EXPORTS:
        return getattr(importlib.import_module(_EXPORTS[name]), name)
    raise AttributeError(f"module 'tpu_inductor.runtime' has no attribute {name!r}")
