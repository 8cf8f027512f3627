"""Several processes (``torchrun``): one PJRT distributed runtime for every rank.

Why: PyTorch's functional collectives in a compiled graph
(``_c10d_functional.all_reduce``, ``all_gather_into_tensor``,
``reduce_scatter_tensor``, as DTensor and tensor parallelism emit them)
should run in XLA, between the executables of each rank, not through the
process group in eager. For that every rank's PJRT client joins one
distributed runtime: rank 0 starts jaxlib's coordination service on a free
port and publishes its address in torch.distributed's own store (the
rendezvous torchrun set up), every rank connects a client to it, and the
CPU client gets gloo collectives over that client. Nothing here moves data
itself: XLA's collectives do, inside the executables of
runtime/collectives.py.

The runtime is made on the first collective a rank compiles and kept for the
process; at exit every rank shuts its client down (a barrier across ranks),
then rank 0 the service.
"""

from __future__ import annotations

import atexit
import dataclasses
import datetime
import logging
import socket
from typing import Any, Optional

log = logging.getLogger(__name__)

_ADDRESS_KEY = "tpu_inductor/coordinator"
_TIMEOUT = datetime.timedelta(seconds=120)


@dataclasses.dataclass
class DistributedRuntime:
    """This rank's PJRT client in the job-wide runtime, and who is where."""

    client: Any
    rank: int
    world_size: int
    service: Any = None
    coordinator: Any = None

    @property
    def devices(self) -> tuple[Any, ...]:
        """Every rank's device, in rank order (one device per rank)."""
        return tuple(sorted(self.client.devices(), key=lambda d: (d.process_index, d.id)))

    @property
    def local_device(self) -> Any:
        return self.client.local_devices()[0]

    @property
    def platform(self) -> Any:
        """This rank's device as a :class:`~tpu_inductor.runtime.platform.Platform`
        (the CPU client: its memory is shared with torch)."""
        from tpu_inductor.runtime.platform import Platform

        return Platform("cpu", self.client, self.local_device)


_runtime: Optional[DistributedRuntime] = None


def active() -> bool:
    """torch.distributed runs with more than one rank."""
    import torch.distributed as dist

    return dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1


def runtime() -> DistributedRuntime:
    """The job's runtime, made on first use (every rank must get here: it is a rendezvous)."""
    global _runtime
    if _runtime is None:
        _runtime = _join()
    return _runtime


def store() -> Any:
    """torch.distributed's store: the rendezvous every rank already shares."""
    import torch.distributed as dist

    return dist.distributed_c10d._get_default_store()


def _join() -> DistributedRuntime:
    import torch.distributed as dist

    from tpu_inductor.runtime import jaxlib_api

    rank, world_size = dist.get_rank(), dist.get_world_size()
    shared = store()
    service = None
    if rank == 0:
        host = socket.gethostname()
        address = f"{host}:{_free_port()}"
        service = jaxlib_api.distributed_runtime_service(address, world_size)
        shared.set(_ADDRESS_KEY, address)
    shared.wait([_ADDRESS_KEY], _TIMEOUT)
    address = shared.get(_ADDRESS_KEY).decode()
    coordinator = jaxlib_api.distributed_runtime_client(address, rank, int(_TIMEOUT.total_seconds()))
    coordinator.connect()
    client = jaxlib_api.distributed_cpu_client(coordinator, rank, world_size)
    log.info("tpu_inductor: rank %d of %d joined the PJRT distributed runtime at %s", rank, world_size, address)
    joined = DistributedRuntime(client, rank, world_size, service, coordinator)
    atexit.register(_shutdown, joined)
    return joined


def _shutdown(joined: DistributedRuntime) -> None:
    try:
        joined.coordinator.shutdown()  # a barrier: every rank reaches it before the service stops
        if joined.service is not None:
            joined.service.shutdown()
    except Exception as exc:  # at exit, a peer that died first must not turn exit into a crash
        log.debug("tpu_inductor: distributed runtime shutdown: %s", exc)


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind(("", 0))
        return probe.getsockname()[1]
