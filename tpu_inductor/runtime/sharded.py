"""One executable over every device of a mesh, called with whole torch tensors.

Why: with a device mesh (``Config.mesh``) XLA's SPMD partitioner compiles
each island once for all devices (lowering/sharding_annotations.py annotates it,
``executable.spmd_compile_options`` asks for the partitioning). The graph around
the island still passes whole tensors: :class:`ShardedExecutable` cuts each
argument into the parts its sharding gives each device (on the CPU client,
views of torch's memory through DLPack), runs the program once on all
devices, and hands back the results, which are replicated, from the first
device. :func:`collectives` counts what XLA inserted, for the report.
"""

from __future__ import annotations

import collections
import re
from typing import Any, Sequence

import torch
from torch.utils.dlpack import to_dlpack

from tpu_inductor.runtime.executable import DeviceExecutable
from tpu_inductor.runtime.mesh import Mesh, Spec
from tpu_inductor.runtime.platform import Platform
from tpu_inductor.runtime import jaxlib_api, transfer

_COLLECTIVE = re.compile(r"\b(all-reduce|all-gather|reduce-scatter|all-to-all|collective-permute)(?:-start)?\(")


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
        devices = jaxlib_api.DeviceList(tuple(mesh.devices))
        self._global = [
            (
                jaxlib_api.shaped_array(spec.shape, transfer.numpy_dtype(spec.dtype)),
                jaxlib_api.hlo_sharding(devices, mesh.hlo_sharding(sharding)),
            )
            for spec, sharding in zip(self.input_specs, self._input_shardings)
        ]

    def record_into(self, island_record: Any) -> None:
        """Put the mesh's view of this executable in its island's record."""
        island_record.shardings = {
            "inputs": [self._mesh.hlo_sharding(s) for s in self._input_shardings],
            "outputs": [self._mesh.hlo_sharding(()) for _ in self._output_specs],
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
            parts = [self._to_device(self._mesh.shard(tensor, sharding, i), d) for i, d in enumerate(self._mesh.devices)]
            arguments.append(jaxlib_api.ArrayImpl(aval, global_sharding, parts, True))
        results = self._loaded.execute_sharded(arguments).disassemble_into_single_device_arrays()
        outputs = [self._to_torch(per_device[0]) for per_device in results]
        if not self._outputs_checked:
            self._check_outputs(outputs)
        return outputs

    def _to_device(self, part: torch.Tensor, device: Any) -> Any:
        part = part.detach().contiguous()
        if self._platform.shares_host_memory:
            return jaxlib_api.buffer_from_dlpack(to_dlpack(part), device, None)
        return transfer.upload(part, device)

    def _to_torch(self, array: Any) -> torch.Tensor:
        if self._platform.shares_host_memory:
            return transfer.host_tensor(array)  # each device holds its own copy
        return transfer.to_torch(array, self._platform)
