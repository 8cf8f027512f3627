"""Our disk-cache entries in PyTorch's portable cache bundle.

Why: ``torch.compiler.save_cache_artifacts()`` packs what this process
compiled (AOTAutograd's entries, which hold our traced graphs, and
Inductor's) into bytes that ``load_cache_artifacts()`` writes into another
machine's caches, so a user can ship a warm start. Without this module the
bundle would carry our traced graphs but not the StableHLO and executables
they need, and the other machine would run torch-mlir and XLA again.

Every entry this process stores or hits is recorded (as Inductor's are), so a
warm process can export again; so are the files of what it learned beside the
entries (kernel timings above all: without them the other machine would
measure kernel choices again, and could partition differently and miss).
``load_cache_artifacts()`` writes them into the cache directory the
environment names (``TPU_INDUCTOR_CACHE_DIR``, else the default): no
``torch.compile`` options exist at that point. Entries are checked against
their manifests' checksums before they are published; a learned file merges
into the one there, whose entries win.

PyTorch drops the whole bundle when it meets a type nobody registered, so the
type must be registered before ``load_cache_artifacts()``: ``import
tpu_inductor`` (after ``import torch``) or any compile with the backend does it.
"""

from __future__ import annotations

import io
import json
import logging
import zipfile
from pathlib import Path

from tpu_inductor.config import Config
from tpu_inductor.torch_api import CacheArtifact, CacheArtifactFactory, CacheArtifactManager
from tpu_inductor.runtime.disk_cache import CacheDir
from tpu_inductor.runtime.persisted_dict import PersistedDict

log = logging.getLogger(__name__)

ARTIFACT_TYPE = "tpu_inductor"
LEARNED_TYPE = "tpu_inductor_learned"


@CacheArtifactFactory.register
class TpuInductorCacheArtifact(CacheArtifact):
    """One entry of our disk cache: key ``<kind>/<entry name>``, content its files zipped."""

    @staticmethod
    def type() -> str:
        return ARTIFACT_TYPE

    def populate_cache(self) -> None:
        kind, _, name = self.key.partition("/")
        config = Config.load()
        if not config.cache:
            return
        try:
            files = unpack(self.content)
        except (zipfile.BadZipFile, ValueError) as exc:
            log.warning("tpu_inductor: ignoring a cache artifact %s that does not unpack: %s", self.key, exc)
            return
        CacheDir.of(config).import_entry(kind, name, files)


@CacheArtifactFactory.register
class TpuInductorLearnedArtifact(CacheArtifact):
    """One learned file beside our entries: key its name, content its JSON.
    Loading merges it into the file of that name; what is there already wins."""

    @staticmethod
    def type() -> str:
        return LEARNED_TYPE

    def populate_cache(self) -> None:
        config = Config.load()
        if not config.cache:
            return
        try:
            path = CacheDir.of(config).learned_file(self.key)
            incoming = dict(json.loads(self.content))
        except (ValueError, TypeError) as exc:
            log.warning("tpu_inductor: ignoring the cache artifact %s: %s", self.key, exc)
            return
        PersistedDict(path).merge(incoming)


def pack(files: dict[str, bytes]) -> bytes:
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", zipfile.ZIP_STORED) as archive:  # executables do not compress
        for name in sorted(files):
            archive.writestr(name, files[name])
    return buffer.getvalue()


def unpack(content: bytes) -> dict[str, bytes]:
    with zipfile.ZipFile(io.BytesIO(content)) as archive:
        return {name: archive.read(name) for name in archive.namelist()}


def _record(kind: str, name: str, files: dict[str, bytes]) -> None:
    CacheArtifactManager.record_artifact(ARTIFACT_TYPE, f"{kind}/{name}", pack(files))


def _record_learned(path: Path, data: bytes) -> None:
    CacheArtifactManager.record_artifact(LEARNED_TYPE, path.name, data)


CacheDir.entry_observer = _record
PersistedDict.observer = _record_learned
