"""The components the backend is built from, and their installed versions.

One list: every cache key holds these versions (:func:`key_versions`), so
that a new torch, torch-mlir, jax, jaxlib or libtpu never reuses what the
old one compiled, and ``tpu-inductor doctor`` prints the same list. The
learned files are named by :func:`versions_digest`.
Importing this module is cheap (no torch, no jax).
"""

from __future__ import annotations

import functools
import hashlib
from importlib import metadata
from pathlib import Path
from typing import Optional

COMPONENTS = ("tpu_inductor", "torch", "torch-mlir", "jax", "jaxlib", "libtpu")


def installed(distribution: str) -> Optional[str]:
    """The installed version of ``distribution``, or None."""
    try:
        return metadata.version(distribution)
    except metadata.PackageNotFoundError:
        return None


@functools.cache
def component_versions() -> dict[str, str]:
    """Each of :data:`COMPONENTS` with its version (``absent`` when not installed)."""
    return {dist: installed(dist) or "absent" for dist in COMPONENTS}


# The source that turns a cached input into a cached output: the
# decompositions shape the ATen graph AOTAutogradCache keeps (aot_cache.py),
# the rest what an island compiles to. Placement only decides which ops reach
# an island, and the island itself is in the graph key; leaving it (and the
# passes, the report...) out keeps edits there from turning every
# developer's cache cold.
_KEYED_SOURCE = (
    "decompositions/*.py", "lowering/*.py", "runtime/executable.py", "runtime/platform.py", "runtime/disk_cache.py",
)


@functools.cache
def _source_digest() -> str:
    """A digest of the package source that produces cached artifacts.

    An editable install keeps its version while its lowering code changes;
    without this a developer's cache would return what the old code compiled.
    """
    digest = hashlib.sha256()
    package = Path(__file__).resolve().parent
    paths = {p for pattern in _KEYED_SOURCE for p in package.glob(pattern)}
    for path in sorted(paths):
        digest.update(str(path.relative_to(package)).encode())
        digest.update(path.read_bytes())
    return digest.hexdigest()[:16]


def key_versions() -> dict[str, str]:
    """The ``versions`` group of every cache key."""
    return {**component_versions(), "tpu_inductor source": _source_digest()}


def versions_digest() -> str:
    """:func:`key_versions` in 12 hex digits, for names of files that hold what
    one set of versions learned (unsupported ops, kernel timings)."""
    return hashlib.sha256(repr(sorted(key_versions().items())).encode()).hexdigest()[:12]
