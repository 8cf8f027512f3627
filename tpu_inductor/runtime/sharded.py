"""One executable over every device of a mesh, called with whole torch tensors.

Why: with a device mesh (``Config.mesh``) XLA's SPMD partitioner compiles
each island once for all devices (lowering/sharding_annotations.py annotates it,
``executable.spmd_compile_options`` asks for the partitioning). The graph around
the island still passes whole tensors: :class:`ShardedExecutable` cuts each
argument into the parts its sharding gives each device (on the CPU client,
views of torch's memory through DLPack), runs the program once on all
devices, and hands back whole results: a replicated one from the first
device, a split one (XLA chose its sharding: placement/shardings.py) put
together on the host from one copy of each part (:func:`result_parts`), so
the program holds no all-gather for it; ``tpu_inductor.shards(result)``
gives the parts back (runtime/result_shards.py). :func:`collectives` counts
what XLA inserted, for the report.
"""

from __future__ import annotations

import collections
import functools
import itertools
import re
from typing import Any, Optional, Sequence

import numpy as np
import torch
from torch.utils.dlpack import to_dlpack

from tpu_inductor.runtime.executable import DeviceExecutable
from tpu_inductor.runtime.mesh import Mesh, Spec
from tpu_inductor.runtime.platform import Platform
from tpu_inductor.runtime import jaxlib_api, result_shards, transfer

_COLLECTIVE = re.compile(r"\b(all-reduce|all-gather|reduce-scatter|all-to-all|collective-permute)(?:-start)?\(")


class UnreadableSharding(ValueError):
    """XLA gave a result a sharding :func:`device_slices` cannot read."""


Parts = Optional[tuple[tuple[int, tuple[slice, ...]], ...]]
"""Of one result: (device index on the mesh, the slices of the whole it holds),
one device per distinct part; None for a replicated result."""


def device_slices(sharding: Any, shape: Sequence[int]) -> Optional[dict[int, tuple[slice, ...]]]:
    """Device index on the mesh -> the slices of a result of ``shape`` it holds,
    from its ``sharding`` (an ``HloSharding`` of the compiled program over the
    mesh's devices, in order); None for a replicated result.

    A tiled sharding names, per tile of ``tile_assignment_dimensions``, the
    device holding it (row major; with ``replicate_on_last_tile_dim`` the
    last dim lists the devices holding copies of one tile). XLA pads an
    uneven tile: a part's slice is cut to the whole's shape."""
    if sharding.is_replicated() or not sharding.is_tiled():
        return None
    if sharding.subgroup_types():
        raise UnreadableSharding(f"a result sharded as {sharding} (subgroups other than copies)")
    tiles = list(sharding.tile_assignment_dimensions())
    devices = np.asarray(sharding.tile_assignment_devices()).reshape(tiles)
    if not sharding.replicate_on_last_tile_dim():
        devices = devices[..., np.newaxis]
    slices = {}
    for tile in np.ndindex(*devices.shape[:-1]):
        cut = []
        for size, count, index in zip(shape, devices.shape, tile):
            step = -(-size // count)
            cut.append(slice(min(index * step, size), min((index + 1) * step, size)))
        for device in devices[tile]:
            slices[int(device)] = tuple(cut)
    return slices


def result_parts(sharding: Any, shape: Sequence[int]) -> Parts:
    """One device per distinct part of a result (:func:`device_slices`)."""
    return distinct_parts(device_slices(sharding, shape))


def distinct_parts(slices: Optional[dict[int, tuple[slice, ...]]]) -> Parts:
    """One device per distinct part, from :func:`device_slices`' answer."""
    if slices is None:
        return None
    first: dict[tuple, int] = {}
    for device, cut in sorted(slices.items()):
        first.setdefault(tuple((s.start, s.stop) for s in cut), device)
    return tuple((device, slices[device]) for device in sorted(first.values()))


def spec_of(mesh: Mesh, sharding: Any, shape: Sequence[int]) -> Optional[Spec]:
    """``sharding`` written as a :data:`Spec` over ``mesh``, when one says the
    same (every device holds the same slices); None when none does."""
    wanted = device_slices(sharding, shape)
    if wanted is None:
        return (None,) * len(shape)
    tiles = list(sharding.tile_assignment_dimensions())[: len(shape)]
    choices = [
        [None] if count == 1 else [axis for axis in mesh.names if mesh.axis_size(axis) == count] for count in tiles
    ]
    for spec in itertools.product(*choices):
        if len(set(a for a in spec if a)) == sum(1 for a in spec if a):
            candidate = jaxlib_api.hlo_sharding_from_string(mesh.hlo_sharding(spec))
            if device_slices(candidate, shape) == wanted:
                return tuple(spec)
    return None


def collectives(loaded: Any) -> dict[str, int]:
    """How many of each collective XLA put in the compiled program."""
    text = "\n".join(module.to_string() for module in loaded.hlo_modules())
    return dict(collections.Counter(match.group(1) for match in _COLLECTIVE.finditer(text)))


class ShardedExecutable(DeviceExecutable):
    """A loaded SPMD executable: whole tensors in, whole (replicated) tensors out."""

    def __init__(
        self,
        loaded: Any,
        platform: Platform,
        mesh: Mesh,
        input_specs: Sequence[Any],
        input_shardings: Sequence[Spec],
        output_specs: Sequence[Any],
        name: str,
    ) -> None:
        super().__init__(loaded, platform, output_specs, name, input_specs)
        self.run = self._run_on_mesh
        self._mesh = mesh
        self._input_shardings = tuple(input_shardings)
        self._output_shardings = [jaxlib_api.sharding_from_proto(p) for p in loaded.get_output_shardings()]
        slices = [device_slices(sharding, spec.shape) for sharding, spec in zip(self._output_shardings, output_specs)]
        self._output_parts = [distinct_parts(each) for each in slices]
        self._result_layouts = [result_shards.layout_of(mesh, each) for each in slices]
        """Per result, where each device's part lies, noted on every result for
        ``tpu_inductor.shards``."""
        self.output_layouts = [
            spec_of(mesh, sharding, spec.shape) for sharding, spec in zip(self._output_shardings, output_specs)
        ]
        """Per result, the :data:`Spec` XLA gave it (None: none says it), so an
        island that reads it (a backward reading what its forward saved) can
        take it split the same way."""
        devices = jaxlib_api.DeviceList(tuple(mesh.devices))
        self._devices_key = (id(platform.client), tuple(device.id for device in mesh.devices))
        """Which devices of which client a kept argument lies on."""

        def global_array_type(spec: Any, sharding: Spec) -> tuple[Any, Any]:
            """The aval and sharding of a whole tensor of ``spec`` laid out as ``sharding`` over the mesh."""
            aval = jaxlib_api.shaped_array(spec.shape, transfer.numpy_dtype(spec.dtype))
            return aval, jaxlib_api.hlo_sharding(devices, mesh.hlo_sharding(sharding))

        self._global = [global_array_type(s, sharding) for s, sharding in zip(self.input_specs, self._input_shardings)]
        self._kept_results = [
            # An uneven tile (one Mesh.fit would not split) is padded by XLA:
            # its parts are not what Mesh.shard cuts.
            None if layout is None or mesh.fit(layout, spec.shape) != tuple(layout) else global_array_type(spec, layout)
            for spec, layout in zip(output_specs, self.output_layouts)
        ]
        """Per result, the aval and sharding its parts are kept under on a client
        that copies (:meth:`_keep_on_devices`); None where they cannot be."""

    def record_into(self, island_record: Any) -> None:
        """Put the mesh's view of this executable in its island's record."""
        island_record.shardings = {
            "inputs": [self._mesh.hlo_sharding(s) for s in self._input_shardings],
            "outputs": [str(sharding) for sharding in self._output_shardings],
        }
        island_record.collectives = collectives(self._loaded)

    def _run_on_mesh(self, *tensors: torch.Tensor) -> list[torch.Tensor]:
        arguments = []
        for tensor, spec, sharding, (aval, global_sharding) in zip(
            tensors, self.input_specs, self._input_shardings, self._global
        ):
            # A shard of another shape than compiled for crashes the process
            # inside PJRT, so the shapes are checked on every call.
            if tuple(tensor.shape) != spec.shape or tensor.dtype != spec.dtype:
                raise ValueError(f"{self.name}: input {tuple(tensor.shape)} {tensor.dtype}, compiled for {spec}")
            if self._platform.shares_host_memory:
                arguments.append(self._on_devices(tensor, sharding, aval, global_sharding))
            else:  # parameters cross to each device once, not at every call
                layout = (self._devices_key, sharding)
                make = functools.partial(self._on_devices, tensor, sharding, aval, global_sharding)
                arguments.append(self._resident.kept(tensor, layout, make))
        results = self._loaded.execute_sharded(arguments).disassemble_into_single_device_arrays()
        outputs = [
            self._to_torch(per_device[0]) if parts is None else self._assemble(per_device, parts, spec)
            for per_device, parts, spec in zip(results, self._output_parts, self._output_specs)
        ]
        if not self._platform.shares_host_memory:
            for output, per_device, layout, kept in zip(outputs, results, self.output_layouts, self._kept_results):
                if kept is not None:
                    self._keep_on_devices(output, per_device, layout, kept)
        result_shards.note(outputs, self._result_layouts)
        if not self._outputs_checked:
            self._check_outputs(outputs)
        return outputs

    def _on_devices(self, tensor: torch.Tensor, sharding: Spec, aval: Any, global_sharding: Any) -> Any:
        """``tensor`` as one array over the mesh: each device's part, as ``sharding`` cuts it."""
        parts = [self._to_device(self._mesh.shard(tensor, sharding, i), d) for i, d in enumerate(self._mesh.devices)]
        return jaxlib_api.ArrayImpl(aval, global_sharding, parts, True)

    def _keep_on_devices(
        self, output: torch.Tensor, per_device: Sequence[Any], layout: Spec, array_type: tuple[Any, Any]
    ) -> None:
        """On a client that copies, a result's parts stay on the devices as its
        device copy: an island that reads it split the same way (a backward
        reading what its forward saved) takes them instead of an upload."""
        aval, global_sharding = array_type
        part_shape = self._mesh.shard_shape(aval.shape, layout)
        if any(tuple(part.shape) != part_shape for part in per_device):
            return
        value = jaxlib_api.ArrayImpl(aval, global_sharding, list(per_device), True)
        self._resident.remember(output, (self._devices_key, layout), value)

    def _assemble(self, per_device: Sequence[Any], parts: Parts, spec: Any) -> torch.Tensor:
        """One whole tensor from the parts of a split result."""
        whole = None
        for device_index, slices in parts:
            part = self._to_torch(per_device[device_index])
            if whole is None:
                whole = torch.empty(spec.shape, dtype=spec.dtype, device=part.device)
            whole[slices] = part[tuple(slice(0, s.stop - s.start) for s in slices)]
        return whole

    def _to_device(self, part: torch.Tensor, device: Any) -> Any:
        part = part.detach().contiguous()
        if self._platform.shares_host_memory:
            return jaxlib_api.buffer_from_dlpack(to_dlpack(part), device, None)
        return transfer.upload(part, device)

    def _to_torch(self, array: Any) -> torch.Tensor:
        if self._platform.shares_host_memory:
            return transfer.host_tensor(array)  # each device holds its own copy
        return transfer.to_torch(array, self._platform)
