"""Our disk-cache entries in PyTorch's portable cache bundle.

Why: ``torch.compiler.save_cache_artifacts()`` packs what this process
compiled (AOTAutograd's entries, which hold our traced graphs, and
Inductor's) into bytes that ``load_cache_artifacts()`` writes into another
machine's caches, so a user can ship a warm start. Without this module the
bundle would carry our traced graphs but not the StableHLO and executables
they need, and the other machine would run torch-mlir and XLA again.

Every entry this process stores or hits is recorded (as Inductor's are), so a
warm process can export again. ``load_cache_artifacts()`` writes our entries
into the cache directory the environment names (``TPU_INDUCTOR_CACHE_DIR``,
else the default): no ``torch.compile`` options exist at that point. Entries
are checked against their manifests' checksums before they are published.

PyTorch drops the whole bundle when it meets a type nobody registered, so the
type must be registered before ``load_cache_artifacts()``: ``import
tpu_inductor`` (after ``import torch``) or any compile with the backend does it.
"""

from __future__ import annotations

import io
import logging
import zipfile

from torch.compiler._cache import CacheArtifact, CacheArtifactFactory, CacheArtifactManager

from tpu_inductor.config import Config
from tpu_inductor.runtime.disk_cache import DiskCache

log = logging.getLogger(__name__)

ARTIFACT_TYPE = "tpu_inductor"


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
        DiskCache(config.resolved_cache_dir, config.cache_max_bytes).import_entry(kind, name, files)


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


DiskCache.entry_observer = _record
