"""On-disk cache of compiled artifacts, so the next process starts warm.

Why it exists: lowering with torch-mlir and compiling with XLA cost seconds
(minutes on TPU) per graph; a second process (the next run, a restarted
server, every rank of a job) should not pay them again.

Layout, one directory per entry::

    <cache_dir>/graphs/<key>/        ATen graph -> StableHLO (skips torch-mlir)
        module.mlirbc  manifest.json
    <cache_dir>/executables/<key>/   StableHLO -> PJRT executable (skips XLA)
        module.mlirbc  executable.bin  manifest.json

(The traced level, Dynamo graph -> ATen graphs, is PyTorch's AOTAutogradCache
in PyTorch's directory: tpu_inductor/aot_cache.py.) Entries another cache
exported come in through :meth:`CacheDir.import_entry`, checked against
their manifests; every entry stored or hit is shown to
:attr:`CacheDir.entry_observer`, which is how PyTorch's portable cache
bundle carries them (runtime/cache_artifacts.py).

``<key>`` is ``<identity>-<environment>``: the identity digest covers what is
compiled (ATen graph or StableHLO bytes plus input avals), the environment
digest everything else that changes the result (versions, platform, compile
options, XLA flags). Entries that share an identity but not an environment
tell a miss's reason ("version changed", "options changed") with one
directory listing.

Safety rules, each for a failure users hit with other persistent caches:

- An entry is written into a hidden temporary directory and published with
  one ``rename``; readers never see half an entry, and when two processes
  publish the same key the loser's rename fails and it keeps its own
  in-memory result, leaving one valid entry. A process killed mid-write leaves
  only a hidden directory, ignored by readers and removed once stale.
- The manifest holds a sha256 per file and the key parts; an entry that does
  not match (truncated, corrupted, written by other versions) is logged,
  evicted and reported as a miss, never trusted.
- A directory we cannot write (read-only, full, not a directory) turns writes
  off for the process with exactly one warning; the caller carries on.
- Past ``max_bytes`` the least-recently-used entries (manifest ``last_used``)
  are evicted.

This module only moves bytes; callers build keys and decode entries. It imports
neither torch nor jaxlib, so the CLI stays light.
"""

from __future__ import annotations

import dataclasses
import datetime
import hashlib
import json
import logging
import os
import re
import shutil
import tempfile
import threading
import time
import uuid
from pathlib import Path
from typing import Any, Callable, Iterator, Optional

from tpu_inductor.process_state import STATE
from tpu_inductor.versions import versions_digest

log = logging.getLogger(__name__)

SCHEMA_VERSION = 2
"""Bumped when the layout or manifest format changes; part of every key."""

KINDS = ("graphs", "executables")
MANIFEST = "manifest.json"
STALE_TEMP_SECONDS = 3600.0
"""A hidden temporary directory older than this belongs to a dead writer."""

# A miss's reason, per group of key parts that differs from the nearest entry.
_GROUP_REASONS = {"versions": "version changed", "options": "options changed", "platform": "platform changed"}
NO_ENTRY = "no entry"
CORRUPTED = "corrupted"
VERSION_CHANGED = "version changed"


def atomic_write(path: Path, data: bytes) -> None:
    """Write ``path`` so that readers see the old bytes or the new, never a mix."""
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as handle:
            _write_file(path, handle, data)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def _write_file(path: Path, handle: Any, data: bytes) -> None:
    """Every byte the cache writes goes through here, bound for ``path`` (tests
    make it fail, or kill the process in it)."""
    handle.write(data)


def _publish(tmp_dir: Path, entry_dir: Path) -> bool:
    """Move a complete entry into place; False when another process got there first."""
    try:
        os.rename(tmp_dir, entry_dir)
        return True
    except OSError:
        if entry_dir.is_dir():  # rename onto a non-empty directory: someone else won
            shutil.rmtree(tmp_dir, ignore_errors=True)
            return False
        raise


def _now_iso(seconds: Optional[float] = None) -> str:
    stamp = time.time() if seconds is None else seconds
    return datetime.datetime.fromtimestamp(stamp, datetime.timezone.utc).isoformat()


def _timestamp(iso: Any) -> float:
    try:
        return datetime.datetime.fromisoformat(str(iso)).timestamp()
    except ValueError:
        return 0.0


def _digest(parts: Any) -> str:
    return hashlib.sha256(json.dumps(parts, sort_keys=True, default=str).encode()).hexdigest()


@dataclasses.dataclass(frozen=True)
class CacheKey:
    """What an entry is for, in parts a human can read in its manifest."""

    identity: dict[str, Any]
    """What is compiled: digests of the program and its input avals."""
    environment: dict[str, dict[str, Any]]
    """Everything else that changes the result, by group: ``versions``,
    ``platform``, ``options``. A miss names the group that differs."""

    @property
    def identity_digest(self) -> str:
        return _digest(self.identity)[:24]

    @property
    def digest(self) -> str:
        environment = {"schema": SCHEMA_VERSION, **self.environment}
        return f"{self.identity_digest}-{_digest(environment)[:16]}"

    def parts(self) -> dict[str, Any]:
        return {"identity": self.identity, **self.environment}


@dataclasses.dataclass
class Lookup:
    """The outcome of :meth:`CacheDir.load`: a value (hit) or a reason (miss)."""

    value: Any = None
    reason: Optional[str] = None
    """For a miss: ``no entry``, ``version changed``, ``options changed``,
    ``platform changed`` or ``corrupted``."""
    saves_seconds: float = 0.0
    """For a hit: the lowering or compile time the entry saved."""

    @property
    def hit(self) -> bool:
        return self.reason is None


@dataclasses.dataclass
class EntryInfo:
    """One entry as ``tpu-inductor cache info`` and LRU eviction see it."""

    kind: str
    path: Path
    bytes: int
    last_used: float
    hits: int
    saves_seconds: float
    readable: bool


class _CorruptEntry(Exception):
    """An entry that exists but cannot be trusted."""

    def __init__(self, reason: str, detail: str) -> None:
        super().__init__(detail)
        self.reason = reason


# Per directory and process: a directory that refused a write is not written
# again, so its warning appears once however many regions use it.
_unwritable_lock = threading.Lock()


LEARNED_UNSUPPORTED = "learned_unsupported-{digest}.json"
"""Ops that failed to lower alone (placement/support.py), one file per versions digest."""
KERNEL_TIMINGS = "kernel_timings-{device_kind}-{digest}.json"
"""Eager vs XLA timings per op signature (placement/kernel_choice.py)."""
TRACED_INDEX = "traced_graphs.json"
"""What each Dynamo graph was traced with (inputs, versions), to name why a
lookup in the traced level missed (aot_cache.py)."""
_SIDE_FILES = (LEARNED_UNSUPPORTED, KERNEL_TIMINGS, TRACED_INDEX)
REPRO_DIR = "repro"
"""Reproducer bundles of failed lowerings when no report directory is set (reporting/repro.py)."""


def _name_pattern(template: str) -> str:
    """``learned_unsupported-{digest}.json`` as a regex of the names it makes."""
    parts = re.split(r"(\{\w+\})", template)
    return "".join(r"[\w.-]+" if part.startswith("{") else re.escape(part) for part in parts)


class CacheDir:
    """The cache directory: every path under it is named here, and the backend
    and the CLI reach each through this class.

    It holds entries of two kinds (``graphs``, ``executables``), the files of
    what processes learned beside them (:meth:`learned_unsupported_file`,
    :meth:`kernel_timings_file`, :attr:`traced_index_file`) and reproducer
    bundles (:attr:`repro_dir`)."""

    entry_observer: Optional[Callable[[str, str, dict[str, bytes]], None]] = None
    """Called with (kind, entry name, files and manifest) for every entry this
    process stores or hits: how PyTorch's portable cache bundle learns of
    them (runtime/cache_artifacts.py)."""

    def __init__(self, root: Path, max_bytes: int = 2 * 1024**3) -> None:
        self.root = Path(root)
        self.max_bytes = max_bytes

    @classmethod
    def of(cls, config: Any) -> "CacheDir":
        """The cache directory a :class:`~tpu_inductor.config.Config` names, with its size cap."""
        return cls(config.resolved_cache_dir, config.cache_max_bytes)

    # -- the learned files ---------------------------------------------------------

    def learned_unsupported_file(self) -> Path:
        """What failed to lower alone with this set of versions (a new torch-mlir,
        XLA or lowering code may lower it)."""
        return self.root / LEARNED_UNSUPPORTED.format(digest=versions_digest())

    def kernel_timings_file(self, device_kind: str) -> Path:
        """Eager and XLA timings, which belong to one machine and one set of versions."""
        return self.root / KERNEL_TIMINGS.format(device_kind=device_kind, digest=versions_digest())

    @property
    def traced_index_file(self) -> Path:
        return self.root / TRACED_INDEX

    def learned_file(self, name: str) -> Path:
        """A learned file named by another machine (a portable cache bundle);
        ValueError unless ``name`` is one of the learned files' names."""
        if not any(re.fullmatch(_name_pattern(template), name) for template in _SIDE_FILES):
            raise ValueError(f"not a learned file of the cache directory: {name!r}")
        return self.root / name

    # -- reading -------------------------------------------------------------------

    def load(self, kind: str, key: CacheKey, decode: Callable[[dict[str, bytes]], Any]) -> Lookup:
        """The decoded entry for ``key`` (a hit), or a miss with its reason.

        ``decode`` turns the entry's verified files into the value; if it raises,
        the entry is treated as corrupted.
        """
        entry = self.root / kind / key.digest
        try:
            manifest = self._read_manifest(entry)
        except FileNotFoundError:
            if entry.is_dir():  # published entries always have one: this one is broken
                return self._evict_corrupt(entry, _CorruptEntry(CORRUPTED, "manifest is missing"))
            return Lookup(reason=self._miss_reason(kind, key))
        except NotADirectoryError:
            return Lookup(reason=NO_ENTRY)
        except _CorruptEntry as exc:
            return self._evict_corrupt(entry, exc)
        except OSError as exc:  # unreadable directory: behave as if empty
            log.debug("tpu_inductor: cannot read cache entry %s: %s", entry, exc)
            return Lookup(reason=NO_ENTRY)
        try:
            self._check_parts(manifest, key)
            files = self._read_files(entry, manifest)
            value = decode(files)
            saves_seconds = float(manifest.get("saves_seconds", 0.0))
            hits = int(manifest.get("hits", 0))
        except _CorruptEntry as exc:
            return self._evict_corrupt(entry, exc)
        except FileNotFoundError:
            if not (entry / MANIFEST).exists():  # evicted by another process meanwhile
                return Lookup(reason=NO_ENTRY)
            return self._evict_corrupt(entry, _CorruptEntry(CORRUPTED, "a file is missing"))
        except Exception as exc:  # decode failed: the bytes are not what they claim
            return self._evict_corrupt(entry, _CorruptEntry(CORRUPTED, f"cannot be loaded: {exc}"))
        if CacheDir.entry_observer is not None:
            CacheDir.entry_observer(kind, key.digest, {**files, MANIFEST: json.dumps(manifest, indent=1).encode()})
        self._touch(entry, {**manifest, "hits": hits + 1, "last_used": _now_iso()})
        return Lookup(value=value, saves_seconds=saves_seconds)

    def _read_manifest(self, entry: Path) -> dict[str, Any]:
        raw = (entry / MANIFEST).read_bytes()
        try:
            manifest = json.loads(raw)
        except ValueError as exc:
            raise _CorruptEntry(CORRUPTED, f"manifest is not JSON ({exc})") from None
        if not isinstance(manifest, dict) or not isinstance(manifest.get("files"), dict):
            raise _CorruptEntry(CORRUPTED, "manifest lacks its file list")
        return manifest

    @staticmethod
    def _check_parts(manifest: dict[str, Any], key: CacheKey) -> None:
        if manifest.get("schema") != SCHEMA_VERSION:
            raise _CorruptEntry(
                VERSION_CHANGED, f"cache format {manifest.get('schema')} != {SCHEMA_VERSION}"
            )
        stored = manifest.get("key_parts", {})
        expected = json.loads(json.dumps(key.parts(), default=str))
        if stored.get("versions") != expected.get("versions"):
            raise _CorruptEntry(VERSION_CHANGED, f"built by {stored.get('versions')}")
        if stored != expected:
            raise _CorruptEntry(CORRUPTED, "key parts do not match the key")

    @staticmethod
    def _read_files(entry: Path, manifest: dict[str, Any]) -> dict[str, bytes]:
        files = {name: (entry / name).read_bytes() for name in manifest["files"]}
        CacheDir._check_files(files, manifest)
        return files

    @staticmethod
    def _check_files(files: dict[str, bytes], manifest: dict[str, Any]) -> None:
        """Raise unless each file the manifest lists has its size and sha256."""
        for name, meta in manifest["files"].items():
            data = files[name]
            if len(data) != meta.get("bytes") or hashlib.sha256(data).hexdigest() != meta.get("sha256"):
                raise _CorruptEntry(
                    CORRUPTED, f"{name}: {len(data)} bytes fail the checksum (truncated or corrupted)"
                )

    def _miss_reason(self, kind: str, key: CacheKey) -> str:
        """Why there is no entry: compare with entries of the same identity."""
        prefix = key.identity_digest + "-"
        try:
            siblings = [p for p in (self.root / kind).iterdir() if p.name.startswith(prefix)]
        except OSError:
            return NO_ENTRY
        expected = json.loads(json.dumps(key.environment, default=str))
        best: Optional[list[str]] = None
        for sibling in siblings:
            try:
                stored = json.loads((sibling / MANIFEST).read_bytes()).get("key_parts", {})
            except (OSError, ValueError, AttributeError):
                continue
            differing = [g for g in _GROUP_REASONS if stored.get(g) != expected.get(g)]
            if differing and (best is None or len(differing) < len(best)):
                best = differing
        return _GROUP_REASONS[best[0]] if best else NO_ENTRY

    def _evict_corrupt(self, entry: Path, error: _CorruptEntry) -> Lookup:
        log.warning(
            "tpu_inductor: evicting cache entry %s (%s: %s); it will be recompiled",
            entry,
            error.reason,
            error,
        )
        self._remove(entry)
        return Lookup(reason=error.reason)

    def _touch(self, entry: Path, manifest: dict[str, Any]) -> None:
        """Record the hit for LRU and ``cache info``; losing it is harmless."""
        if str(self.root) in STATE.unwritable_dirs:
            return
        try:
            atomic_write(entry / MANIFEST, json.dumps(manifest, indent=1).encode())
        except OSError as exc:
            log.debug("tpu_inductor: cannot update %s: %s", entry / MANIFEST, exc)

    # -- writing -------------------------------------------------------------------

    def store(
        self,
        kind: str,
        key: CacheKey,
        files: dict[str, bytes],
        saves_seconds: float,
        extra: Optional[dict[str, Any]] = None,
    ) -> None:
        """Publish an entry; never raises for disk trouble (see the module docstring)."""
        now = _now_iso()
        manifest = {
            "schema": SCHEMA_VERSION,
            "kind": kind,
            "key": key.digest,
            "key_parts": key.parts(),
            **(extra or {}),
            "files": {
                name: {"bytes": len(data), "sha256": hashlib.sha256(data).hexdigest()}
                for name, data in files.items()
            },
            "saves_seconds": round(saves_seconds, 6),
            "created": now,
            "last_used": now,
            "hits": 0,
        }
        self._publish_entry(kind, key.digest, {**files, MANIFEST: json.dumps(manifest, indent=1, default=str).encode()})

    def import_entry(self, kind: str, name: str, files: dict[str, bytes]) -> bool:
        """Publish an entry another cache exported (files and manifest, as
        :data:`entry_observer` saw them) unless it fails its checksums."""
        if kind not in KINDS or not re.fullmatch(r"[0-9a-f]+-[0-9a-f]+", name) or MANIFEST not in files:
            log.warning("tpu_inductor: ignoring an imported cache entry named %s/%s", kind, name)
            return False
        try:
            manifest = json.loads(files[MANIFEST])
            intact = set(manifest["files"]) == set(files) - {MANIFEST} and manifest.get("key") == name
            if intact:
                self._check_files(files, manifest)
        except (_CorruptEntry, ValueError, KeyError, TypeError, AttributeError):
            intact = False
        if not intact:
            log.warning("tpu_inductor: ignoring imported cache entry %s/%s: it fails its checksums", kind, name)
            return False
        return self._publish_entry(kind, name, files, observe=False)

    def _publish_entry(self, kind: str, name: str, files: dict[str, bytes], observe: bool = True) -> bool:
        """Write ``files`` (the manifest among them) as entry ``kind/name``:
        in a hidden directory, published with one rename."""
        if str(self.root) in STATE.unwritable_dirs:
            return False
        kind_dir = self.root / kind
        tmp_dir = kind_dir / f".tmp-{name}-{os.getpid()}-{uuid.uuid4().hex[:8]}"
        try:
            kind_dir.mkdir(parents=True, exist_ok=True)
            tmp_dir.mkdir()
            for file_name, data in files.items():
                if file_name != MANIFEST:
                    atomic_write(tmp_dir / file_name, data)
            atomic_write(tmp_dir / MANIFEST, files[MANIFEST])  # last: an entry is complete once it has one
            published = _publish(tmp_dir, kind_dir / name)
        except OSError as exc:
            shutil.rmtree(tmp_dir, ignore_errors=True)
            self._disable_writes(exc)
            return False
        if published:
            if observe and CacheDir.entry_observer is not None:
                CacheDir.entry_observer(kind, name, files)
            self.enforce_cap()
        return published

    def _disable_writes(self, exc: OSError) -> None:
        with _unwritable_lock:
            if str(self.root) in STATE.unwritable_dirs:
                return
            STATE.unwritable_dirs[str(self.root)] = str(exc)
        log.warning(
            "tpu_inductor: cannot write the cache directory %s (%s); continuing without "
            "writing to the disk cache (set cache_dir / TPU_INDUCTOR_CACHE_DIR to a writable "
            "directory, or cache=False to silence this)",
            self.root,
            exc,
        )

    # -- maintenance (LRU, CLI) ----------------------------------------------------

    def entries(self, remove_stale: bool = True) -> list[EntryInfo]:
        """Every published entry; by default also removes what dead writers left
        (temporary files and directories older than ``STALE_TEMP_SECONDS``)."""
        found = []
        for kind in KINDS:
            for path in self._children(self.root / kind):
                if path.name.startswith("."):
                    if remove_stale:
                        self._remove_if_stale(path)
                    continue
                found.append(self._entry_info(kind, path, remove_stale))
        return found

    def incomplete_writes(self) -> int:
        """Hidden temporary directories: writes in progress or killed mid-way."""
        return sum(
            1 for kind in KINDS for p in self._children(self.root / kind) if p.name.startswith(".")
        )

    def enforce_cap(self, max_bytes: Optional[int] = None) -> list[EntryInfo]:
        """Evict least-recently-used entries until the total fits; returns them."""
        limit = self.max_bytes if max_bytes is None else max_bytes
        entries = self.entries()
        total = sum(e.bytes for e in entries)
        evicted = []
        # Unreadable entries first (they would be evicted on load anyway), then LRU.
        for entry in sorted(entries, key=lambda e: (e.readable, e.last_used)):
            if total <= limit:
                break
            self._remove(entry.path)
            total -= entry.bytes
            evicted.append(entry)
        if evicted:
            log.info(
                "tpu_inductor: evicted %d least-recently-used cache entries to stay under %d bytes",
                len(evicted),
                limit,
            )
        return evicted

    def clear(self) -> int:
        """Remove every entry, temporary directory and learned file; returns the entries removed."""
        removed = 0
        for kind in KINDS:
            for path in self._children(self.root / kind):
                removed += not path.name.startswith(".")
                self._remove(path)
        for path in self.side_files():
            path.unlink(missing_ok=True)
        return removed

    @property
    def repro_dir(self) -> Path:
        return self.root / REPRO_DIR

    def clear_repros(self) -> int:
        """Remove every reproducer bundle; returns how many there were."""
        bundles = list(self._children(self.repro_dir))
        shutil.rmtree(self.repro_dir, ignore_errors=True)
        return len(bundles)

    def side_files(self, pattern: Optional[str] = None) -> list[Path]:
        """The learned files beside the entries (one of :data:`_SIDE_FILES`, or all)."""
        patterns = [pattern] if pattern else list(_SIDE_FILES)
        globs = [re.sub(r"\{\w+\}", "*", p) for p in patterns]
        try:
            return sorted({path for glob in globs for path in self.root.glob(glob)})
        except OSError:
            return []

    def learned_unsupported(self) -> list[dict[str, Any]]:
        """Every learned failure on disk: signature, reason, confirmed, file."""
        learned = []
        for path in self.side_files(LEARNED_UNSUPPORTED):
            try:
                entries = json.loads(path.read_text())
            except (OSError, ValueError):
                continue
            for signature, entry in entries.items():
                if isinstance(entry, dict):
                    learned.append({"signature": signature, **entry, "file": path.name})
        return learned

    @staticmethod
    def _children(directory: Path) -> Iterator[Path]:
        try:
            yield from list(directory.iterdir())
        except OSError:
            return

    @staticmethod
    def _entry_info(kind: str, path: Path, remove_stale: bool) -> EntryInfo:
        size = 0
        for child in CacheDir._children(path):
            if child.name.startswith("."):  # a manifest update killed mid-write
                if remove_stale:
                    CacheDir._remove_if_stale(child)
                continue
            try:
                size += child.stat().st_size
            except OSError:
                pass
        try:
            manifest = json.loads((path / MANIFEST).read_bytes())
            return EntryInfo(
                kind=kind,
                path=path,
                bytes=size,
                last_used=_timestamp(manifest.get("last_used")),
                hits=int(manifest.get("hits", 0)),
                saves_seconds=float(manifest.get("saves_seconds", 0.0)),
                readable=True,
            )
        except (OSError, ValueError, AttributeError, TypeError):
            return EntryInfo(kind, path, size, 0.0, 0, 0.0, readable=False)

    @staticmethod
    def _remove_if_stale(path: Path) -> None:
        try:
            if time.time() - path.stat().st_mtime <= STALE_TEMP_SECONDS:
                return
            if path.is_dir():
                CacheDir._remove(path)
            else:
                path.unlink()
        except OSError:
            pass

    @staticmethod
    def _remove(path: Path) -> None:
        """Rename first, so no reader sees a half-deleted entry; then delete."""
        trash = path.parent / f".evict-{uuid.uuid4().hex[:12]}"
        try:
            os.rename(path, trash)
        except OSError:
            return  # gone already, or a read-only directory
        shutil.rmtree(trash, ignore_errors=True)
