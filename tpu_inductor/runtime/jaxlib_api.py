"""Every jaxlib and jax API tpu_inductor calls, in one module.

Why one module: jaxlib's Python API below ``jax.jit`` (``jaxlib._jax``, ``jax._src``)
is not public and changes between releases. tpu_inductor supports jax and jaxlib
0.10 to 0.11 (``pyproject.toml``); a name that moves is then handled here, with
the versions named, instead of as an ``AttributeError`` in whichever module
called it first. Run with jaxlib 0.10.2 (CI) and 0.11.2 (the suite on Python 3.12,
docs/versions.md); the one difference met so far is handled in
:func:`single_device_result_handler`.

MLIR's own Python bindings (``jaxlib.mlir.ir``) are imported where a module is
edited (lowering/sharding_annotations.py), with the context from here.

The helper process that compiles for XLA (runtime/isolated_compile.py) imports
this module without torch: it imports nothing but jaxlib at import time, and
``jax`` only inside the functions that need it.

The per-call functions are jaxlib's own, bound once (no wrapper in between):
an argument's import and a result's export run on every island call.
"""

from __future__ import annotations

import os
from typing import Any, Sequence

import numpy as np
from jaxlib import _hlo, _jax

# Bound as they are: called per argument and per result.
buffer_from_dlpack = _jax.dlpack_managed_tensor_to_buffer
"""``(capsule, device, stream)`` -> a PJRT buffer aliasing the capsule's memory."""
dlpack_from_buffer = _jax.buffer_to_dlpack_managed_tensor
"""A single-device array -> a DLPack capsule of its memory (waits until it is defined)."""
ArrayImpl = _jax.ArrayImpl
"""``(aval, sharding, per-device buffers, committed)``: a global array of device buffers."""

CompileOptions = _jax.CompileOptions
DeviceAssignment = _jax.DeviceAssignment
DeviceList = _jax.DeviceList


def with_option_override(options: Any, override: tuple[str, Any]) -> Any:
    """A copy of the compile ``options`` with one more ``(debug option, value)``
    in its ``env_option_overrides``, which XLA applies to that executable only."""
    copy = CompileOptions.ParseFromString(options.SerializeAsString())
    copy.env_option_overrides = [*options.env_option_overrides, override]
    return copy


def shaped_array(shape: Sequence[int], numpy_dtype: Any) -> Any:
    """jax's abstract value of an array: what an ``ArrayImpl`` or a result handler is built from."""
    from jax._src import core

    return core.ShapedArray(tuple(shape), numpy_dtype)


def hlo_sharding(devices: Any, text: str) -> Any:
    """A sharding over ``devices`` (a :data:`DeviceList`) from its HLO text (``{devices=[4,1]0,1,2,3}``)."""
    return _jax.GSPMDSharding(devices, hlo_sharding_from_string(text))


def hlo_sharding_from_string(text: str) -> Any:
    """An ``HloSharding`` from its HLO text (``{devices=[4,1]0,1,2,3}``)."""
    return _hlo.HloSharding.from_string(text)


def sharding_from_proto(proto: Any) -> Any:
    """An ``HloSharding`` from the ``OpSharding`` a compiled program reports
    (``LoadedExecutable.get_output_shardings``)."""
    return _hlo.HloSharding.from_proto(proto)


def single_device_result_handler(aval: Any, device: Any) -> Any:
    """A C++ handler that wraps one output buffer of ``device`` as a jax array, unchecked."""
    import jax
    from jaxlib import xla_client

    sharding = jax.sharding.SingleDeviceSharding(device)
    if xla_client._version >= _HANDLERS_UNCHECKED_FROM:
        return _jax.array_result_handler(aval, sharding, committed=True)
    return _jax.array_result_handler(aval, sharding, committed=True, _skip_checks=True)


_HANDLERS_UNCHECKED_FROM = 489
"""jaxlib's extension version (``xla_client._version``: 467 in 0.10.2, 495 in
0.11.2) from which ``array_result_handler`` has no ``_skip_checks`` argument
and checks nothing (jax's own ``_array_global_result_handler`` branches on
the same number); before it, the argument is what turns the checks off."""


def preload() -> None:
    """Import what a client needs now (the compile helper does while it waits)."""
    from jaxlib import xla_client  # noqa: F401


def device_put(array: Any, device: Any) -> Any:
    """A copy of the numpy ``array`` in a buffer on ``device``, of its own dtype."""
    import jax

    if device.platform == "cpu":
        # The CPU client aliases an aligned numpy array instead of copying it,
        # so the buffer would see later writes to the tensor behind it, as no
        # accelerator's does: ``zero_copy=False``, which stands in for a TPU's
        # path, would then hide a stale device copy.
        array = np.array(array, copy=True)
    # jax canonicalises dtypes unless 64-bit types are on: without this an
    # int64 tensor would silently arrive as int32. The context is thread-local.
    with jax.enable_x64(True):
        return jax.device_put(array, device)


def make_cpu_client(num_devices: int, threads: int) -> Any:
    """A synchronous XLA:CPU client of its own with ``num_devices`` devices and
    an intra-op pool of ``threads`` (XLA reads ``PJRT_NPROC`` as the client
    starts; the process's own value is put back after)."""
    from jaxlib import xla_client

    before = os.environ.get("PJRT_NPROC")
    os.environ["PJRT_NPROC"] = str(threads)
    try:
        return xla_client.make_cpu_client(asynchronous=False, num_devices=num_devices)
    finally:
        if before is None:
            del os.environ["PJRT_NPROC"]
        else:
            os.environ["PJRT_NPROC"] = before


# jax's settings of how much GPU memory its client takes; a user who set one has chosen.
_GPU_MEMORY_SETTINGS = ("XLA_PYTHON_CLIENT_PREALLOCATE", "XLA_CLIENT_MEM_FRACTION", "XLA_PYTHON_CLIENT_MEM_FRACTION",
                        "XLA_PYTHON_CLIENT_ALLOCATOR")


def jax_backend(platform: str) -> Any:
    """jax's shared client for ``platform`` (``cuda``, ``tpu``): the plugin's devices belong to it.

    On a GPU, torch's caching allocator shares the device with XLA's: jax's
    default of reserving 75% of GPU memory when its client starts would leave
    the user's torch code a quarter of the card. XLA allocates as it goes
    instead, unless the user set one of jax's memory settings themselves.
    """
    from jax._src import xla_bridge

    if platform == "cuda" and not any(name in os.environ for name in _GPU_MEMORY_SETTINGS):
        os.environ["XLA_PYTHON_CLIENT_PREALLOCATE"] = "false"
    return xla_bridge.get_backend(platform)


def mlir_context() -> Any:
    """An MLIR context with the StableHLO and Shardy dialects loaded (jax's own)."""
    from jax._src.interpreters import mlir as jax_mlir

    return jax_mlir.make_ir_context()


# ---------------------------------------------------------------- many processes


def distributed_runtime_service(address: str, world_size: int) -> Any:
    """The coordination service every rank's client joins (started by rank 0)."""
    return _jax.get_distributed_runtime_service(address, world_size)


def distributed_runtime_client(address: str, rank: int, init_timeout_s: int) -> Any:
    return _jax.get_distributed_runtime_client(address, rank, init_timeout=init_timeout_s)


def distributed_cpu_client(coordinator: Any, rank: int, world_size: int, num_devices: int = 1) -> Any:
    """This rank's XLA:CPU client, one of ``world_size`` joined through
    ``coordinator``; collectives between the processes run over gloo."""
    return _jax.get_tfrt_cpu_client(
        asynchronous=False,
        distributed_client=coordinator,
        node_id=rank,
        num_nodes=world_size,
        collectives=_jax.make_gloo_tcp_collectives(coordinator),
        num_devices=num_devices,
    )
