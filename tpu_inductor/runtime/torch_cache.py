"""Our entries in PyTorch's cache directory, found without importing torch.

Why: the traced level of our cache (tpu_inductor/aot_cache.py) is PyTorch's
AOTAutogradCache, which keeps its entries under PyTorch's cache directory,
beside Inductor's. ``tpu-inductor cache info`` and ``clear`` must see and
remove ours there, and the CLI imports no torch.
"""

from __future__ import annotations

import getpass
import os
import re
import tempfile
from pathlib import Path

TRACED_MARK = b"tpu_inductor.aot_cache"
"""Bytes each of our entries holds: the module name of the class it pickles."""


def torch_cache_dir() -> Path:
    """PyTorch's cache directory, as ``torch._inductor.runtime.cache_dir_utils.cache_dir``
    finds it (``TORCHINDUCTOR_CACHE_DIR``, else ``<tmp>/torchinductor_<user>``)."""
    configured = os.environ.get("TORCHINDUCTOR_CACHE_DIR")
    if configured:
        return Path(os.path.abspath(configured))
    try:
        user = getpass.getuser()
    except (KeyError, ModuleNotFoundError, OSError):
        user = f"uid_{os.getuid()}" if hasattr(os, "getuid") else "unknown_user"
    return Path(tempfile.gettempdir()) / ("torchinductor_" + re.sub(r'[\\/:*?"<>|]', "_", user))


def traced_entries() -> list[Path]:
    """Our AOTAutogradCache entries (``aotautograd/<key>/<entry>``); Inductor's are left alone."""
    root = torch_cache_dir() / "aotautograd"
    found = []
    for path in sorted(root.glob("*/*")) if root.is_dir() else ():
        try:
            if path.is_file() and TRACED_MARK in path.read_bytes():
                found.append(path)
        except OSError:
            continue
    return found


def clear_traced_entries() -> int:
    """Remove our entries (and key directories left empty); returns how many."""
    removed = 0
    for path in traced_entries():
        try:
            path.unlink()
            removed += 1
            path.parent.rmdir()  # fails, harmlessly, while other entries share the key
        except OSError:
            continue
    return removed
