"""Which PJRT platform runs the graphs, and its client.

:func:`select_platform` is the one place the device is chosen; clients are
created on first use and kept for the process.
"""

from __future__ import annotations

import dataclasses
import functools
import importlib.util
import logging
from typing import Any, Optional, Sequence

import torch

from tpu_inductor.errors import PlatformUnavailableError

log = logging.getLogger(__name__)

INSTALL_HINT = {
    "cpu": "pip install jaxlib",
    "cuda": "pip install 'tpu_inductor[cuda]' (jax's CUDA 13 plugin; '[cuda12]' for CUDA 12) on a machine with an NVIDIA GPU",
    "tpu": "pip install 'tpu_inductor[tpu]' (libtpu) on a TPU VM",
}


@dataclasses.dataclass(frozen=True)
class Platform:
    """A PJRT client and the device that compiled graphs run on."""

    name: str
    client: Any  # jaxlib._jax.Client
    device: Any  # jaxlib._jax.Device
    xla_threads: Optional[int] = None
    """The CPU client's intra-op pool size (None on other platforms)."""
    zero_copy: bool = True
    """False makes even the CPU client copy tensors in and out, exercising the
    path a TPU takes (device-resident parameters) on any machine."""

    @property
    def shares_host_memory(self) -> bool:
        """True when torch CPU tensors and device buffers can alias (DLPack)."""
        return self.name == "cpu" and self.zero_copy

    @property
    def shares_cuda_memory(self) -> bool:
        """True when torch CUDA tensors and device buffers can alias (DLPack)."""
        return self.name == "cuda" and self.zero_copy

    @property
    def keeps_device_copies(self) -> bool:
        """True when torch's tensors cross by copy and each keeps a device copy
        while unchanged (runtime/transfer.py's ``ResidentBuffers``): a TPU, or ``zero_copy=False``."""
        return not (self.shares_host_memory or self.shares_cuda_memory)

    @property
    def device_kind(self) -> str:
        return str(self.device.device_kind)

    @property
    def version(self) -> str:
        return str(self.client.platform_version)


def _make_cpu_client(num_devices: int = 1) -> tuple[Any, int]:
    """Our own CPU client with ``num_devices`` devices, executing on the calling thread.

    jax's shared client dispatches asynchronously: the computation ends on an
    XLA worker thread, which then drops the DLPack references to the torch
    inputs. Dropping one takes the GIL, and a worker that does so while Python
    shuts down is killed mid-unwind (``terminate called without an active
    exception``, about one run in six). Synchronous execution releases the
    inputs on the caller's thread, under the GIL, before the call returns;
    callers wait for the outputs anyway, and tiny graphs skip a thread handoff.

    Its intra-op pool gets PyTorch's thread count (runtime/threads.py), and
    glibc's malloc thresholds are fixed (runtime/malloc_thresholds.py).
    """
    from tpu_inductor.config import Config
    from tpu_inductor.runtime import jaxlib_api, malloc_thresholds
    from tpu_inductor.runtime.threads import xla_cpu_threads

    config = Config.load()
    if config.pin_malloc_thresholds:
        malloc_thresholds.pin()
    threads = xla_cpu_threads(config.pjrt_nproc)
    client = jaxlib_api.make_cpu_client(num_devices, threads)
    log.debug("tpu_inductor: XLA:CPU client with %d intra-op threads", threads)
    return client, threads


def _tpu_available() -> bool:
    """libtpu is installed and finds a TPU (only then is a TPU client tried)."""
    if importlib.util.find_spec("libtpu") is None:
        return False
    try:
        _client("tpu")
    except PlatformUnavailableError:
        return False
    return True


PLUGINS = {"cpu": ("jaxlib",), "cuda": ("jax-cuda13-plugin", "jax-cuda12-plugin"), "tpu": ("libtpu",)}
"""The distributions that provide each platform's PJRT client, newest first."""


def _cuda_plugin_installed() -> bool:
    return any(
        importlib.util.find_spec(name) is not None
        for name in ("jax_cuda13_plugin", "jax_cuda12_plugin")
    )


def select_platform(requested: Optional[str], example_inputs: Sequence[Any]) -> str:
    """The platform to compile for: the one asked for, else the best one present.

    Unset means: ``tpu`` when libtpu finds a TPU; else ``cuda`` when the inputs
    are CUDA tensors and jax's CUDA plugin is installed; else ``cpu``.
    """
    if requested:
        chosen, why = requested, "requested"
    elif _tpu_available():
        chosen, why = "tpu", "libtpu found a TPU"
    elif _cuda_plugin_installed() and any(
        isinstance(x, torch.Tensor) and x.device.type == "cuda" for x in example_inputs
    ):
        chosen, why = "cuda", "the inputs are CUDA tensors and jax's CUDA plugin is installed"
    else:
        chosen, why = "cpu", "no TPU, and no CUDA inputs with jax's CUDA plugin"
    _log_choice_once(chosen, why)
    return chosen


@functools.cache
def _log_choice_once(name: str, why: str) -> None:
    log.info("tpu_inductor: running on PJRT platform %s (%s)", name, why)


def get_platform(name: str, zero_copy: bool = True, num_devices: int = 1) -> Platform:
    """The PJRT client for ``name``; raises with an install hint when missing.
    ``num_devices``: how many devices the CPU client makes (a mesh's size);
    other platforms have the devices they have."""
    client, device, threads = _client(name, num_devices if name == "cpu" else 1)
    return Platform(name=name, client=client, device=device, xla_threads=threads, zero_copy=zero_copy)


@functools.cache
def _client(name: str, num_devices: int = 1) -> tuple[Any, Any, Optional[int]]:
    from tpu_inductor.runtime import jaxlib_api

    try:
        client, threads = (
            _make_cpu_client(num_devices) if name == "cpu" else (jaxlib_api.jax_backend(name), None)
        )
    except RuntimeError as exc:
        raise PlatformUnavailableError(
            f"PJRT platform {name!r} is not available here ({exc}). "
            f"To use it: {INSTALL_HINT.get(name, 'install its PJRT plugin')}; "
            "or choose another with the 'platform' option / TPU_INDUCTOR_PLATFORM."
        ) from None
    return client, client.local_devices()[0], threads
