"""Compile StableHLO with PJRT and run it on torch tensors.

Compiled executables are shared through a process-wide memory cache and the
on-disk cache (:mod:`tpu_inductor.runtime.disk_cache`). The key covers
everything that changes the compiled code, because a stale hit is a wrong
result: the StableHLO bytes and input avals, platform, device kind and
runtime version, the compile options and ``XLA_FLAGS``, and the versions of
the components (``tpu_inductor.versions.COMPONENTS``), plus a digest of the
lowering and runtime source, so editing that code never reuses stale output.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import logging
import time
from typing import TYPE_CHECKING, Any, Callable, Optional, Sequence, Union

import numpy as np
import torch

from tpu_inductor import report
from tpu_inductor.versions import key_versions
from tpu_inductor.process_state import STATE
from tpu_inductor.runtime import jaxlib_api, transfer, xla_schedule, ynn_reductions
from tpu_inductor.runtime.disk_cache import CacheKey, CacheDir, Lookup
from tpu_inductor.lowering.matmul_precision import torch_precisions, with_torch_precision
from tpu_inductor.runtime.isolated_compile import compile_and_load
from tpu_inductor.runtime.mesh import Mesh
from tpu_inductor.runtime.platform import Platform
from tpu_inductor.runtime.resident_writes import AOT_COPY_BACK_BUMPS

if TYPE_CHECKING:
    from tpu_inductor.runtime.schedule_choice import ScheduleChoice

log = logging.getLogger(__name__)


@dataclasses.dataclass
class CompileStats:
    """What one :func:`compile_stablehlo` call did, for the report."""

    source: str  # "memory", "disk" or "xla"
    seconds: float
    key: str
    schedule_choice: Optional["ScheduleChoice"] = None
    """Where XLA:CPU's scheduler is still to be chosen for this executable
    (runtime/xla_schedule.py): the executable returned is the default
    schedule's, and the choice is made when it is hot."""
    ynn_reductions_off: Optional[str] = None
    """The short reduction for which this compile kept YNNPACK to dots
    (runtime/ynn_reductions.py); None otherwise."""


@dataclasses.dataclass(frozen=True)
class TensorSpec:
    """Shape and dtype that an executable's output must have."""

    shape: tuple[int, ...]
    dtype: torch.dtype


def resident_buffers(platform: Platform) -> transfer.ResidentBuffers:
    """The process-wide device copies of tensors for ``platform``'s device."""
    key = (platform.name, platform.device.id)
    resident = STATE.resident_buffers
    if key not in resident:
        resident[key] = transfer.ResidentBuffers()
    return resident[key]


class DeviceExecutable:
    """A loaded PJRT executable called with and returning torch tensors."""

    def __init__(
        self,
        loaded: Any,
        platform: Platform,
        output_specs: Sequence[TensorSpec],
        name: str,
        input_specs: Sequence[TensorSpec] = (),
        device_only: frozenset[int] = frozenset(),
        schedule_choice: Optional["ScheduleChoice"] = None,
    ) -> None:
        self._loaded = loaded
        self._platform = platform
        self._output_specs = tuple(output_specs)
        self._device_only = device_only
        """Outputs handed on as device buffers, never fetched: the new value of an
        input whose device copy is kept (runtime/resident_writes.py)."""
        self.input_specs = tuple(input_specs)
        """Shapes and dtypes the executable was compiled for."""
        # Looked up once: the per-call path only passes it along.
        self._resident = resident_buffers(platform)
        self._outputs_checked = False
        self.name = name
        self._results_into_arguments: dict[int, int] = {}
        """Result position -> the argument it is written into (:meth:`write_results_into_arguments`)."""
        self.run: Callable[..., list[torch.Tensor]] = self._call_through_transfers
        """The call, chosen once for the platform (``__call__`` adds a frame)."""
        if platform.shares_host_memory:
            self._host_views = transfer.HostViews(platform)
            self._result_handlers = [transfer.result_handler(s.shape, s.dtype, platform) for s in output_specs]
            self.run = self._call_sharing_host_memory
        if schedule_choice is not None:
            self._schedule_choice = schedule_choice
            self._calls_before_choice = xla_schedule.HOT_CALLS
            self._steady_run = self.run
            self.run = self._call_counting_to_the_choice
            schedule_choice.serve(self)

    def __call__(self, *tensors: torch.Tensor) -> list[torch.Tensor]:
        return self.run(*tensors)

    def _call_counting_to_the_choice(self, *tensors: torch.Tensor) -> list[torch.Tensor]:
        """The first :data:`xla_schedule.HOT_CALLS` calls; the last of them
        starts the schedule choice, which compiles in the background and
        hands this executable the one kept (:meth:`take`)."""
        self._calls_before_choice -= 1
        if self._calls_before_choice <= 0:
            self._schedule_choice.begin(self._loaded)
            self.run = self._steady_run
        return self._steady_run(*tensors)

    def take(self, kept: Any) -> None:
        """Run ``kept`` (this module's executable with the schedule chosen)
        from the next call on; called from the choice's thread."""
        self._loaded = kept
        self.run = self._steady_run

    def _call_through_transfers(self, *tensors: torch.Tensor) -> list[torch.Tensor]:
        platform, resident = self._platform, self._resident
        buffers = [transfer.to_device(t, platform, resident) for t in tensors]
        # execute_sharded directly: LoadedExecutable.execute is a Python shim over it.
        results = self._loaded.execute_sharded(buffers).disassemble_into_single_device_arrays()
        device_only = self._device_only
        outputs = [r[0] if i in device_only else transfer.to_torch(r[0], platform) for i, r in enumerate(results)]
        if not self._outputs_checked:
            self._check_outputs(outputs)  # before a result is written into an argument
        if platform.keeps_device_copies:
            # Each result's buffer is its device copy: an island that reads it
            # (a backward reading what its forward saved) takes it, not an upload.
            into_arguments = self._results_into_arguments
            for i, (output, result) in enumerate(zip(outputs, results)):
                if i in into_arguments:
                    outputs[i] = self._write_into_argument(tensors[into_arguments[i]], output, result[0])
                elif i not in device_only:
                    resident.remember(output, (), result[0])
        return outputs

    def _call_sharing_host_memory(self, *tensors: torch.Tensor) -> list[torch.Tensor]:
        """The CPU client's call: kept argument views, C++ result handlers."""
        views = self._host_views
        # The staging buffers hold this call's small arguments until XLA has read them.
        staging = views.lock.acquire(blocking=False)
        try:
            results = self._loaded.execute_sharded(views.buffers(tensors, staging))
            outputs = [transfer.host_tensor(a) for a in results.consume_with_handlers(self._result_handlers)]
        finally:
            if staging:
                views.lock.release()
        if not self._outputs_checked:
            self._check_outputs(outputs)
        return outputs

    def write_results_into_arguments(self, pairs: tuple[tuple[int, int], ...]) -> None:
        """Each ``(result, argument)``: the result is the argument's new value
        (placement/results_into_inputs.py says when it may be written early;
        compiled_graph.py asks only where the client keeps device copies). The
        call writes it into the argument, keeps the result's buffer as the
        argument's device copy, and returns the argument in the result's place."""
        self._results_into_arguments = dict(pairs)

    def _write_into_argument(self, argument: torch.Tensor, value: torch.Tensor, buffer: Any) -> torch.Tensor:
        version_before = transfer.version_of(argument)
        argument.copy_(value)
        if version_before is not None:
            self._resident.written(argument, version_before, buffer, bumps_after=AOT_COPY_BACK_BUMPS)
        return argument

    def _check_outputs(self, outputs: list[torch.Tensor]) -> None:
        """A wrong dtype or shape is a wrong number: refuse it, once per executable."""
        from tpu_inductor.errors import OutputMismatchError

        got = [
            self._output_specs[i] if i in self._device_only else TensorSpec(tuple(o.shape), o.dtype)
            for i, o in enumerate(outputs)
        ]
        if got != list(self._output_specs):
            raise OutputMismatchError(
                f"{self.name}: the device returned {got} but the graph promises "
                f"{list(self._output_specs)}; refusing a silently different result"
            )
        self._outputs_checked = True


def spmd_compile_options(mesh: Mesh) -> Any:
    """Compile options for one program partitioned over ``mesh``'s devices (one replica)."""
    devices = mesh.devices
    options = jaxlib_api.CompileOptions()
    options.num_replicas = 1
    options.num_partitions = len(devices)
    build = options.executable_build_options
    build.use_spmd_partitioning = True
    build.use_shardy_partitioner = True  # the annotations are Shardy's (lowering/sharding_annotations.py)
    # A result left unannotated takes the sharding XLA propagates to it
    # (runtime/sharded.py assembles it), rather than being all-gathered.
    build.allow_spmd_sharding_propagation_to_output = [True]
    options.device_assignment = jaxlib_api.DeviceAssignment.create(
        np.array([[device.id for device in devices]], dtype=np.int32)
    )
    return options


def replica_compile_options(device_ids: Sequence[int]) -> Any:
    """Compile options for one rank's program run as one replica per device
    of ``device_ids`` (a process group's: runtime/collectives.py), replica
    ``i`` on ``device_ids[i]``."""
    options = jaxlib_api.CompileOptions()
    options.num_replicas = len(device_ids)
    options.num_partitions = 1
    options.device_assignment = jaxlib_api.DeviceAssignment.create(
        np.array([[device_id] for device_id in device_ids], dtype=np.int32)
    )
    return options


def _compile_options(mesh: Optional[Mesh] = None, replicas: tuple[int, ...] = ()) -> Any:
    """The options an executable is compiled with: XLA's defaults, SPMD
    partitioning over ``mesh``'s devices, or one replica per device of
    ``replicas`` (device ids)."""
    if replicas:
        return replica_compile_options(replicas)
    return spmd_compile_options(mesh) if mesh is not None else jaxlib_api.CompileOptions()


@functools.cache
def _compile_options_digest(mesh: Optional[Mesh] = None, replicas: tuple[int, ...] = ()) -> str:
    return hashlib.sha256(_compile_options(mesh, replicas).SerializeAsString()).hexdigest()[:16]


def aval(spec: TensorSpec) -> str:
    """``float32[4,64]``: an input aval as a manifest shows it."""
    return f"{str(spec.dtype).removeprefix('torch.')}[{','.join(map(str, spec.shape))}]"


def executable_key(
    module: Union[bytes, str],
    input_specs: Sequence[TensorSpec],
    platform: Platform,
    xla_flags: str = "",
    mesh: Optional[Mesh] = None,
    replicas: tuple[int, ...] = (),
    precisions: Optional[dict[str, str]] = None,
    chosen_schedule: bool = False,
    tunes_reductions: bool = False,
) -> CacheKey:
    """Everything that shapes the executable, grouped so a miss can say what
    changed. ``precisions``: what XLA's float32 dots and convolutions are
    compiled at on a PJRT plugin (lowering/matmul_precision.py), None on the
    CPU client; ``chosen_schedule``: XLA:CPU's scheduler is chosen per
    executable (runtime/xla_schedule.py); ``tunes_reductions``: YNNPACK's
    reductions are turned off for a module with a short one
    (runtime/ynn_reductions.py)."""
    data = module.encode() if isinstance(module, str) else module
    return CacheKey(
        identity={
            "stablehlo_sha256": hashlib.sha256(data).hexdigest(),
            "input_avals": [aval(s) for s in input_specs],
        },
        environment={
            "platform": {
                "platform": platform.name,
                "device_kind": platform.device_kind,
                "platform_version": platform.version,
                # XLA:CPU splits loops for the pool it compiles for
                # (outer_dimension_partitions): an executable made for 1
                # thread runs 1-way in a process with 8.
                "xla_threads": platform.xla_threads,
            },
            "options": {
                "compile_options_sha256": _compile_options_digest(mesh, replicas),
                "xla_flags": xla_flags,
                **({"mesh": mesh.describe()} if mesh is not None else {}),
                **({"replicas": list(replicas)} if replicas else {}),
                **({"float32_precision": precisions} if precisions is not None else {}),
                **({"xla_cpu_schedule": "chosen"} if chosen_schedule else {}),
                **({"ynn_reductions": "off for short rows"} if tunes_reductions else {}),
            },
            "versions": key_versions(),
        },
    )


def compile_stablehlo(
    module: Union[bytes, str],
    platform: Platform,
    disk_cache: Optional[CacheDir],
    *,
    input_specs: Sequence[TensorSpec] = (),
    xla_flags: str = "",
    mesh: Optional[Mesh] = None,
    replicas: Sequence[Any] = (),
    isolate: bool = False,
    choose_schedule: bool = False,
) -> tuple[Any, CompileStats]:
    """A loaded executable for ``module`` (StableHLO bytecode or text): from memory,
    disk, or XLA. ``input_specs``, ``xla_flags`` (``Config.xla_flags``) and the
    ``mesh`` it is partitioned over (its shardings are in ``module``), or the
    devices it runs one replica on each of (``replicas``: a rank's program
    whose collectives span them), go into the cache key. ``isolate``
    (``Config.isolate_lowering``): XLA compiles in the helper process where it
    can (runtime/isolated_compile.py). ``choose_schedule``
    (``Config.choose_xla_schedule``): on the CPU client, the executable kept
    by an earlier choice of XLA:CPU's scheduler, or else the default
    schedule's with a :class:`ScheduleChoice` in the stats, made when the
    executable is hot (runtime/xla_schedule.py)."""
    started = time.perf_counter()
    # Part of the key, written on the module only when XLA compiles it (a
    # cache hit parses nothing); XLA:CPU's float32 is exact at every precision.
    precisions = torch_precisions() if platform.name != "cpu" else None
    replica_ids = tuple(device.id for device in replicas)
    runs_on = tuple(replicas) or (tuple(mesh.devices) if mesh is not None else (platform.device,))
    chooses = choose_schedule and xla_schedule.applies(platform, xla_flags, len(runs_on) == 1)
    # Decided from the module itself (in the key already), so it is read only when XLA compiles.
    tunes_reductions = ynn_reductions.applies(platform, xla_flags)

    def key_for(chosen_schedule: bool) -> CacheKey:
        return executable_key(
            module, input_specs, platform, xla_flags, mesh, replica_ids, precisions, chosen_schedule, tunes_reductions
        )

    devices = jaxlib_api.DeviceList(runs_on)
    found, choice, short_reduction = None, None, None
    if chooses:
        chosen_key = key_for(True)
        # A miss here is no news for the report: the default's key is looked up next.
        found = _cached(chosen_key, platform, devices, disk_cache, report_miss=False)
    if found is None:
        key = key_for(False)
        found = _cached(key, platform, devices, disk_cache)
        if found is None:
            compile_started = time.perf_counter()
            if precisions is not None:
                module = with_torch_precision(module, precisions)
            with report.stage("xla"):
                options, short_reduction = xla_compile_options(module, mesh, replica_ids, tunes_reductions)
                loaded, serialized = compile_and_load(platform, module, devices, options, isolate=isolate)
            if disk_cache is not None:
                store_executable(
                    disk_cache, key, module, loaded, serialized, platform, time.perf_counter() - compile_started
                )
            STATE.executables[key.digest] = loaded
            found = (loaded, "xla", key.digest)
        if chooses:
            choice = STATE.schedule_choices.get(chosen_key.digest)
            if choice is None:
                from tpu_inductor.runtime.schedule_choice import ScheduleChoice  # it imports this module

                choice = ScheduleChoice(module, platform, devices, tunes_reductions, isolate, disk_cache, chosen_key, key)
                STATE.schedule_choices[chosen_key.digest] = choice
    loaded, source, digest = found
    stats = CompileStats(
        source=source,
        seconds=time.perf_counter() - started,
        key=digest,
        schedule_choice=choice,
        ynn_reductions_off=short_reduction,
    )
    log.debug("tpu_inductor: executable %s from %s in %.3fs", digest, source, stats.seconds)
    return loaded, stats


def _cached(
    key: CacheKey, platform: Platform, devices: Any, disk_cache: Optional[CacheDir], report_miss: bool = True
) -> Optional[tuple[Any, str, str]]:
    """``(executable, "memory" or "disk", digest)`` for ``key``, or None."""
    loaded = STATE.executables.get(key.digest)
    # One loaded on another client of this process (a mesh's devices are a
    # client of their own) does not run on this client's buffers.
    if loaded is not None and loaded.client is platform.client:
        return loaded, "memory", key.digest
    if disk_cache is None:
        return None
    lookup = disk_cache.load(
        "executables", key, lambda files: platform.client.deserialize_executable(files["executable.bin"], devices)
    )
    if lookup.hit or report_miss:
        record_cache_event("executable", key.digest, lookup)
    if lookup.value is None:
        return None
    STATE.executables[key.digest] = lookup.value
    return lookup.value, "disk", key.digest


def xla_compile_options(
    module: Union[bytes, str], mesh: Optional[Mesh], replica_ids: tuple[int, ...], tunes_reductions: bool
) -> tuple[Any, Optional[str]]:
    """The compile options for ``module`` and the short reduction for which
    they keep YNNPACK to dots (runtime/ynn_reductions.py), if any."""
    options = _compile_options(mesh, replica_ids)
    short_reduction = ynn_reductions.short_reduction(module) if tunes_reductions else None
    if short_reduction is not None:
        options = ynn_reductions.dots_only(options)
    return options, short_reduction


def store_executable(
    disk_cache: CacheDir,
    key: CacheKey,
    module: Union[bytes, str],
    loaded: Any,
    serialized: Optional[bytes],
    platform: Platform,
    compile_seconds: float,
) -> None:
    """Keep ``loaded`` on disk; ``serialized``: its bytes, when the helper made them."""
    try:
        blob = serialized or platform.client.serialize_executable(loaded)
    except Exception as exc:  # a plugin without serialization: run, just do not cache
        log.info("tpu_inductor: %s cannot serialize executables (%s); not caching", platform.name, exc)
        return
    if isinstance(module, str):
        files = {"module.mlir": module.encode()}
    else:
        files = {"module.mlirbc": module}
    disk_cache.store("executables", key, {**files, "executable.bin": blob}, compile_seconds)


def record_cache_event(level: str, key: str, lookup: Lookup) -> None:
    """Put one disk-cache lookup in the report and the log."""
    report.record_cache_event(
        report.CacheEvent(
            level=level,
            key=key,
            hit=lookup.hit,
            reason=lookup.reason,
            saves_seconds=lookup.saves_seconds,
        )
    )
    if lookup.hit:
        log.debug("tpu_inductor: %s cache hit %s (saves %.3fs)", level, key, lookup.saves_seconds)
    else:
        log.info("tpu_inductor: %s cache miss %s: %s", level, key, lookup.reason)
