"""PJRT clients, one per platform, created on first use and kept for the process."""

from __future__ import annotations

import dataclasses
import functools
import logging
from typing import Any

from tpu_inductor.errors import PlatformUnavailableError

log = logging.getLogger(__name__)

_INSTALL_HINT = {
    "cpu": "pip install jaxlib",
    "cuda": "pip install 'tpu_inductor[cuda]' (jax's CUDA plugin) on a machine with an NVIDIA GPU",
    "tpu": "pip install 'tpu_inductor[tpu]' (libtpu) on a TPU VM",
}


@dataclasses.dataclass(frozen=True)
class Platform:
    """A PJRT client and the device that compiled graphs run on."""

    name: str
    client: Any  # jaxlib._jax.Client
    device: Any  # jaxlib._jax.Device

    @property
    def shares_host_memory(self) -> bool:
        """True when torch CPU tensors and device buffers can alias (DLPack)."""
        return self.name == "cpu"

    @property
    def device_kind(self) -> str:
        return str(self.device.device_kind)

    @property
    def version(self) -> str:
        return str(self.client.platform_version)


def _make_cpu_client() -> Any:
    """Our own CPU client, executing on the calling thread.

    jax's shared client dispatches asynchronously: the computation ends on an
    XLA worker thread, which then drops the DLPack references to the torch
    inputs. Dropping one takes the GIL, and a worker that does so while Python
    shuts down is killed mid-unwind (``terminate called without an active
    exception``, about one run in six). Synchronous execution releases the
    inputs on the caller's thread, under the GIL, before the call returns;
    callers wait for the outputs anyway, and tiny graphs skip a thread handoff.
    """
    from jaxlib import xla_client

    return xla_client.make_cpu_client(asynchronous=False)


@functools.cache
def get_platform(name: str) -> Platform:
    """The PJRT client for ``name``; raises with an install hint when missing."""
    from jax._src import xla_bridge

    try:
        client = _make_cpu_client() if name == "cpu" else xla_bridge.get_backend(name)
    except RuntimeError as exc:
        raise PlatformUnavailableError(
            f"PJRT platform {name!r} is not available here ({exc}). "
            f"To use it: {_INSTALL_HINT.get(name, 'install its PJRT plugin')}; "
            "or choose another with the 'platform' option / TPU_INDUCTOR_PLATFORM."
        ) from None
    device = client.local_devices()[0]
    log.info("tpu_inductor: using PJRT platform %s (%s)", name, device.device_kind)
    return Platform(name=name, client=client, device=device)
