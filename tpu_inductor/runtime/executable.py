"""Compile StableHLO with PJRT and run it on torch tensors.

Compiled executables are shared through a process-wide memory cache and the
on-disk cache, both keyed by the StableHLO text, the platform and device kind,
and the versions of every component that shapes the result.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import logging
import time
from typing import Any, Optional, Sequence

import torch
from jaxlib import _jax

from tpu_inductor.runtime import transfer
from tpu_inductor.runtime.disk_cache import ExecutableDiskCache
from tpu_inductor.runtime.platform import Platform

log = logging.getLogger(__name__)


@functools.cache
def component_versions() -> dict[str, str]:
    """Versions that change compiled code; part of every cache key."""
    from importlib import metadata

    versions = {}
    for dist in ("torch", "torch-mlir", "jaxlib", "libtpu", "tpu_inductor"):
        try:
            versions[dist] = metadata.version(dist)
        except metadata.PackageNotFoundError:
            versions[dist] = "absent"
    return versions


@dataclasses.dataclass
class CompileStats:
    """What one :func:`compile_stablehlo` call did, for the report."""

    source: str  # "memory", "disk" or "xla"
    seconds: float
    key: str


@dataclasses.dataclass(frozen=True)
class TensorSpec:
    """Shape and dtype that an executable's output must have."""

    shape: tuple[int, ...]
    dtype: torch.dtype


class DeviceExecutable:
    """A loaded PJRT executable called with and returning torch tensors."""

    def __init__(
        self,
        loaded: Any,
        platform: Platform,
        output_specs: Sequence[TensorSpec],
        name: str,
    ) -> None:
        self._loaded = loaded
        self._platform = platform
        self._output_specs = tuple(output_specs)
        self._outputs_checked = False
        self.name = name

    def __call__(self, *tensors: torch.Tensor) -> list[torch.Tensor]:
        platform = self._platform
        buffers = [transfer.to_device(t, platform) for t in tensors]
        results = self._loaded.execute(buffers)
        outputs = [transfer.to_torch(r, platform) for r in results]
        if not self._outputs_checked:
            self._check_outputs(outputs)
        return outputs

    def _check_outputs(self, outputs: list[torch.Tensor]) -> None:
        """A wrong dtype or shape is a wrong number: refuse it, once per executable."""
        from tpu_inductor.errors import LoweringError

        got = [TensorSpec(tuple(o.shape), o.dtype) for o in outputs]
        if got != list(self._output_specs):
            raise LoweringError(
                f"{self.name}: the device returned {got} but the graph promises "
                f"{list(self._output_specs)}; refusing a silently different result"
            )
        self._outputs_checked = True


_memory_cache: dict[str, Any] = {}


def _cache_key(module_text: str, platform: Platform) -> str:
    digest = hashlib.sha256()
    for part in (
        module_text,
        platform.name,
        platform.device_kind,
        platform.version,
        repr(sorted(component_versions().items())),
    ):
        digest.update(part.encode())
        digest.update(b"\0")
    return digest.hexdigest()[:32]


def compile_stablehlo(
    module_text: str,
    platform: Platform,
    disk_cache: Optional[ExecutableDiskCache],
) -> tuple[Any, CompileStats]:
    """A loaded executable for ``module_text``: from memory, disk, or XLA."""
    started = time.perf_counter()
    key = _cache_key(module_text, platform)
    devices = _jax.DeviceList((platform.device,))
    loaded = _memory_cache.get(key)
    source = "memory"
    if loaded is None and disk_cache is not None:
        loaded = disk_cache.load(
            key, lambda blob: platform.client.deserialize_executable(blob, devices)
        )
        source = "disk"
    if loaded is None:
        source = "xla"
        loaded = platform.client.compile_and_load(module_text, devices, _jax.CompileOptions())
        if disk_cache is not None:
            disk_cache.store(
                key,
                module_text,
                platform.client.serialize_executable(loaded),
                {
                    "key": key,
                    "platform": platform.name,
                    "device_kind": platform.device_kind,
                    "versions": component_versions(),
                    "compile_seconds": time.perf_counter() - started,
                },
            )
    _memory_cache[key] = loaded
    stats = CompileStats(source=source, seconds=time.perf_counter() - started, key=key)
    log.debug("tpu_inductor: executable %s from %s in %.3fs", key, source, stats.seconds)
    return loaded, stats
