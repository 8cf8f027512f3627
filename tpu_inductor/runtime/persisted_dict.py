"""A small JSON dict kept beside the cache, for what one process learns for the next."""

from __future__ import annotations

import json
import logging
import threading
from pathlib import Path
from typing import Any, Callable, Optional

from tpu_inductor.runtime.disk_cache import atomic_write

log = logging.getLogger(__name__)


class PersistedDict:
    """A small JSON dict kept beside the cache: what one process learned
    (ops that do not lower, which kernel is faster) is known to the next.

    Reads are in memory; each new entry rewrites the file atomically. An
    unreadable file is ignored (and replaced on the next write): it only
    holds what can be learned again.
    """

    observer: Optional[Callable[[Path, bytes], None]] = None
    """Called with (file, its bytes) whenever one is read or written: how
    PyTorch's portable cache bundle carries what was learned (runtime/cache_artifacts.py)."""

    def __init__(self, path: Optional[Path]) -> None:
        self._path = path
        self._entries: dict[str, Any] = {}
        self._this_process_only: set[str] = set()
        self._lock = threading.Lock()
        if path is not None and path.exists():
            try:
                data = path.read_bytes()
                self._entries = dict(json.loads(data))
            except (OSError, ValueError) as exc:
                log.warning("tpu_inductor: ignoring unreadable %s: %s", path, exc)
            else:
                self._observe(data)

    def get(self, key: str) -> Any:
        return self._entries.get(key)

    def put(self, key: str, value: Any, persist: bool = True, replace: bool = False) -> None:
        """Remember ``value`` for ``key`` unless something is already known for
        it (or ``replace``); with ``persist=False`` for this process only."""
        with self._lock:
            if key in self._entries and not replace:
                return
            self._entries[key] = value
            if not persist:
                self._this_process_only.add(key)
                return
            self._this_process_only.discard(key)
            self._save()

    def merge(self, entries: dict[str, Any]) -> None:
        """Remember every entry of ``entries`` not known yet, in one write."""
        with self._lock:
            missing = {k: v for k, v in entries.items() if k not in self._entries}
            if missing:
                self._entries.update(missing)
                self._save()

    def pop(self, key: str) -> None:
        with self._lock:
            if self._entries.pop(key, None) is not None:
                self._save()

    def items(self) -> dict[str, Any]:
        return dict(self._entries)

    def __len__(self) -> int:
        return len(self._entries)

    def _save(self) -> None:
        if self._path is None:
            return
        kept = {k: v for k, v in self._entries.items() if k not in self._this_process_only}
        try:
            self._path.parent.mkdir(parents=True, exist_ok=True)
            data = json.dumps(kept, indent=1).encode()
            atomic_write(self._path, data)
        except OSError as exc:
            log.debug("tpu_inductor: cannot persist %s: %s", self._path.name, exc)
        else:
            self._observe(data)

    def _observe(self, data: bytes) -> None:
        if PersistedDict.observer is not None and self._path is not None:
            PersistedDict.observer(self._path, data)
