"""XLA:CPU's compiler in the helper process that runs torch-mlir's pipelines.

Why: XLA aborts the process on some programs (a ``CHECK`` failure in a pass,
a fatal error in LLVM's code generation), and an abort cannot be caught: the
user's program would die with it, where the promise is that a lowering
problem never fails the user's call. So on the CPU client the executable is
compiled in the helper process (lowering/pipelines.py starts and restarts
it), serialized there, and loaded here with ``deserialize_executable``, as a
disk-cache hit is. When the helper dies, the island's compile fails like any
other (:class:`XlaCompileError`, naming the crash and XLA's last words), the
culprit search proves which op caused it, and that op runs eagerly.

Only the CPU client can be isolated this way: a TPU or a GPU belongs to one
process, and a multi-process (``torchrun``) client's collectives need every
rank's process; those compile here. The helper's client is made like ours
(runtime/platform.py): the same number of devices and intra-op threads, and
``XLA_FLAGS`` from the environment it inherits.

Cost: jaxlib's import in the helper, begun as it starts so that it overlaps
tracing, and per executable a serialize and load of a few milliseconds; a
cold first call, torch-mlir's isolation and this together, took 0.3 to 0.4 s
longer (docs/performance.md, "What isolating torch-mlir and XLA costs").
"""

from __future__ import annotations

from typing import Any, Optional

from tpu_inductor.errors import LoweringError


class XlaCompileError(LoweringError):
    """XLA could not compile an island (it raised, or the helper process died)."""


def isolatable(platform: Any) -> bool:
    """Whether ``platform``'s executables can be compiled in the helper: our own
    local CPU client (runtime/platform.py), whose size and threads we know."""
    return platform.name == "cpu" and platform.xla_threads is not None


def compile_and_load(
    platform: Any, module: Any, devices: Any, options: Any, *, isolate: bool, background: bool = False
) -> tuple[Any, Optional[bytes]]:
    """``platform.client.compile_and_load(module, devices, options)``, done in
    the helper process when ``isolate`` and the platform allows it (the
    background helper, at a lower priority, for a compile that no call waits
    for: ``background``); with the
    serialized executable the helper made (None when compiled here), which is
    what the disk cache keeps: a loaded copy of it serialized again lacks its
    functions on a mesh ("Function ... not found" when run)."""
    if not (isolate and isolatable(platform)):
        return platform.client.compile_and_load(module, devices, options), None
    from tpu_inductor.lowering.pipelines import last_words, run_in_helper

    reply = run_in_helper({
        "kind": "compile",
        "module": module.encode() if isinstance(module, str) else module,
        "text": isinstance(module, str),
        "options": options.SerializeAsString(),
        "device_ids": [device.id for device in devices],
        "num_devices": len(platform.client.devices()),
        "threads": platform.xla_threads,
    }, background=background)
    if "crashed" in reply:
        said = last_words(reply, "XLA compiled an island")
        raise XlaCompileError(
            f"XLA's compiler crashed (the helper process {reply['crashed']}): "
            + ("; ".join(said[-3:]) or "it printed nothing")
        )
    if "error" in reply:
        raise XlaCompileError(f"XLA could not compile the island: {reply['error']}")
    return platform.client.deserialize_executable(reply["executable"], devices), reply["executable"]


# The helper's side: jaxlib only, no torch.

_CLIENTS: dict[tuple[int, int], Any] = {}


def import_jaxlib() -> None:
    """Load jaxlib now (the helper does this while it waits for its first request)."""
    from tpu_inductor.runtime import jaxlib_api  # runtime/__init__.py keeps jaxlib's INFO lines off

    jaxlib_api.preload()


def _client(num_devices: int, threads: int) -> Any:
    key = (num_devices, threads)
    if key not in _CLIENTS:
        from tpu_inductor.runtime import jaxlib_api

        _CLIENTS[key] = jaxlib_api.make_cpu_client(num_devices, threads)  # as the user's (runtime/platform.py)
    return _CLIENTS[key]


def serve_compile(request: dict) -> dict:
    """``{"executable": <serialized>}`` for one compile request, or ``{"error": ...}``."""
    from tpu_inductor.runtime import jaxlib_api

    client = _client(request["num_devices"], request["threads"])
    by_id = {device.id: device for device in client.devices()}
    devices = jaxlib_api.DeviceList(tuple(by_id[i] for i in request["device_ids"]))
    module = request["module"].decode() if request["text"] else request["module"]
    try:
        loaded = client.compile_and_load(module, devices, jaxlib_api.CompileOptions.ParseFromString(request["options"]))
        return {"executable": client.serialize_executable(loaded)}
    except Exception as exc:  # noqa: BLE001 - XlaRuntimeError and kin: the parent's error to raise
        return {"error": str(exc)}
