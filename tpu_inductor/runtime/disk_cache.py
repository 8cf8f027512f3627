"""On-disk cache of compiled PJRT executables, so the next process starts warm.

Layout: ``<cache_dir>/executables/<key>/`` holds ``module.mlir`` (the
StableHLO), ``executable.bin`` (the serialized PJRT executable) and
``manifest.json`` (key parts, sizes, checksum, times). Every file is written to
a temporary name and renamed into place, so a reader never sees half an entry;
the manifest is written last and carries the executable's checksum, so an entry
without a valid manifest is simply a miss. Any unreadable entry is evicted and
recompiled; a directory we cannot write degrades to no disk cache with one
warning.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any, Callable, Optional

log = logging.getLogger(__name__)

SCHEMA_VERSION = 1


def _atomic_write(path: Path, data: bytes) -> None:
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


class ExecutableDiskCache:
    """Serialized executables keyed by a hash of everything that shapes them."""

    def __init__(self, root: Path) -> None:
        self.root = root / "executables"
        self._disabled_reason: Optional[str] = None

    def entry_dir(self, key: str) -> Path:
        return self.root / key

    def load(self, key: str, deserialize: Callable[[bytes], Any]) -> Optional[Any]:
        """The cached executable for ``key``, or None (a miss)."""
        entry = self.entry_dir(key)
        manifest_path = entry / "manifest.json"
        if not manifest_path.exists():
            return None
        try:
            manifest = json.loads(manifest_path.read_text())
            blob = (entry / "executable.bin").read_bytes()
            if manifest.get("schema") != SCHEMA_VERSION:
                raise ValueError(f"schema {manifest.get('schema')} != {SCHEMA_VERSION}")
            if hashlib.sha256(blob).hexdigest() != manifest["executable_sha256"]:
                raise ValueError("checksum mismatch (truncated or corrupted)")
            executable = deserialize(blob)
        except Exception as exc:  # a bad entry must never fail the user's call
            log.warning("tpu_inductor: evicting unreadable cache entry %s: %s", entry, exc)
            shutil.rmtree(entry, ignore_errors=True)
            return None
        manifest["last_used"] = time.time()
        self._write_quietly(manifest_path, json.dumps(manifest, indent=1).encode())
        return executable

    def store(self, key: str, module_text: str, blob: bytes, manifest: dict) -> None:
        if self._disabled_reason:
            return
        entry = self.entry_dir(key)
        try:
            entry.mkdir(parents=True, exist_ok=True)
            _atomic_write(entry / "module.mlir", module_text.encode())
            _atomic_write(entry / "executable.bin", blob)
            now = time.time()
            manifest = {
                "schema": SCHEMA_VERSION,
                **manifest,
                "executable_bytes": len(blob),
                "executable_sha256": hashlib.sha256(blob).hexdigest(),
                "created": now,
                "last_used": now,
            }
            _atomic_write(entry / "manifest.json", json.dumps(manifest, indent=1).encode())
        except OSError as exc:
            self._disabled_reason = str(exc)
            log.warning(
                "tpu_inductor: cannot write the cache directory %s (%s); continuing "
                "without the disk cache (set cache_dir / TPU_INDUCTOR_CACHE_DIR to a "
                "writable directory, or cache=False to silence this)",
                self.root,
                exc,
            )

    def _write_quietly(self, path: Path, data: bytes) -> None:
        try:
            _atomic_write(path, data)
        except OSError:
            pass
