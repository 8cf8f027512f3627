"""A device mesh: named axes over a platform's devices, and tensor shardings over it.

Why: a TPU host has 4 to 8 chips and a GPU node 8 GPUs; one program should
use them all. XLA's SPMD partitioner does the work: each island is compiled
once for every device of the mesh, from StableHLO whose arguments and
results carry ``mhlo.sharding`` annotations, and XLA inserts the
collectives. This module only names things: which device sits where on the
mesh (``Config.mesh``, e.g. ``{"data": 2, "model": 2}``), the HLO sharding
string of a :data:`Spec`, and which part of a tensor each device holds.

A :data:`Spec` gives, per tensor dim, the mesh axis it is split over, or
None; mesh axes a spec does not name hold copies (replicated). Annotations
never change what a program computes, only where: a spec that does not fit
a tensor costs communication, never a wrong number.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, Optional, Sequence

import numpy as np
import torch

Spec = tuple[Optional[str], ...]
"""Per tensor dim: the mesh axis it is split over, or None."""


@dataclasses.dataclass(frozen=True)
class Mesh:
    """Named axes (major first) over ``devices``, in row-major order."""

    axes: tuple[tuple[str, int], ...]
    devices: tuple[Any, ...]

    def __post_init__(self) -> None:
        assert len(self.devices) == self.size, (self.axes, len(self.devices))

    @property
    def size(self) -> int:
        return math.prod(size for _, size in self.axes)

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(name for name, _ in self.axes)

    def axis_size(self, name: str) -> int:
        return dict(self.axes)[name]

    @property
    def batch_axis(self) -> str:
        """The axis a data-parallel batch is split over: the first one."""
        return self.axes[0][0]

    def describe(self) -> str:
        """``data=2,model=2``, as the option is written."""
        return ",".join(f"{name}={size}" for name, size in self.axes)

    # -- shardings -----------------------------------------------------------------

    def fit(self, spec: Spec, shape: Sequence[int]) -> Spec:
        """``spec`` for a tensor of ``shape``: a dim that its axis does not
        divide evenly is replicated instead (an even split is what PJRT's
        shards are), and an axis named twice keeps only its first dim."""
        spec = tuple(spec) + (None,) * (len(shape) - len(spec))
        used: set[str] = set()
        fitted: list[Optional[str]] = []
        for axis, size in zip(spec[: len(shape)], shape):
            if axis is None or axis in used or axis not in self.names or size % self.axis_size(axis):
                fitted.append(None)
            else:
                used.add(axis)
                fitted.append(axis)
        return tuple(fitted)

    def hlo_sharding(self, spec: Spec) -> str:
        """The HLO sharding string XLA reads in ``mhlo.sharding``."""
        if all(axis is None for axis in spec):
            return "{replicated}"
        split = [axis for axis in spec if axis is not None]
        copies = [name for name in self.names if name not in split]
        tiles = [self.axis_size(axis) if axis is not None else 1 for axis in spec]
        order = [self.names.index(axis) for axis in split + copies]
        ids = np.arange(self.size).reshape([size for _, size in self.axes]).transpose(order).flatten()
        replicated = math.prod(self.axis_size(name) for name in copies)
        if replicated > 1:
            tiles.append(replicated)
        suffix = " last_tile_dim_replicate" if replicated > 1 else ""
        return f"{{devices=[{','.join(map(str, tiles))}]{','.join(map(str, ids))}{suffix}}}"

    def shard_shape(self, shape: Sequence[int], spec: Spec) -> tuple[int, ...]:
        """The shape of the part of a ``shape`` tensor each device holds, split as ``spec``."""
        return tuple(size // self.axis_size(axis) if axis is not None else size for size, axis in zip(shape, spec))

    def position(self, device_index: int) -> dict[str, int]:
        """Where device ``device_index`` sits: axis name -> its index along that axis."""
        coordinate = np.unravel_index(device_index, [size for _, size in self.axes])
        return dict(zip(self.names, (int(c) for c in coordinate)))

    def shard(self, tensor: torch.Tensor, spec: Spec, device_index: int) -> torch.Tensor:
        """The part of ``tensor`` (a view) that device ``device_index`` of the mesh holds."""
        position = self.position(device_index)
        part = tensor
        for dim, (axis, length) in enumerate(zip(spec, self.shard_shape(tensor.shape, spec))):
            if axis is not None:
                part = part.narrow(dim, position[axis] * length, length)
        return part


def parse_mesh(raw: Any) -> tuple[tuple[str, int], ...]:
    """``{"data": 4}``, ``"data=2,model=2"`` or pairs -> ``(("data", 2), ("model", 2))``."""
    if isinstance(raw, str):
        pairs = []
        for part in (p.strip() for p in raw.split(",") if p.strip()):
            name, sep, size = part.partition("=")
            if not sep:
                raise ValueError(f"mesh axis {part!r} is not name=size (e.g. data=4)")
            pairs.append((name.strip(), size.strip()))
    elif isinstance(raw, dict):
        pairs = list(raw.items())
    elif isinstance(raw, (list, tuple)):
        pairs = [tuple(p) for p in raw]
    else:
        raise ValueError(f"a mesh is a dict of axis name to size such as {{'data': 4}}, got {raw!r}")
    axes = []
    for name, size in pairs:
        if not isinstance(name, str) or not name.isidentifier():
            raise ValueError(f"mesh axis name {name!r} is not an identifier")
        try:
            count = int(size)
        except (TypeError, ValueError):
            raise ValueError(f"mesh axis {name!r} has size {size!r}, not a positive integer") from None
        if count < 1 or isinstance(size, bool):
            raise ValueError(f"mesh axis {name!r} has size {size!r}, not a positive integer")
        axes.append((name, count))
    if len({name for name, _ in axes}) != len(axes):
        raise ValueError(f"mesh {raw!r} names an axis twice")
    return tuple(axes)


def mesh_over(axes: tuple[tuple[str, int], ...], platform: Any) -> Mesh:
    """The mesh ``axes`` (``Config.mesh``) over ``platform``'s first devices."""
    from tpu_inductor.errors import ConfigError

    size = math.prod(n for _, n in axes)
    devices = tuple(platform.client.local_devices())
    if len(devices) < size:
        raise ConfigError(
            f"the mesh {dict(axes)} needs {size} devices; PJRT platform {platform.name!r} has "
            f"{len(devices)} here. Make the 'mesh' option (TPU_INDUCTOR_MESH) smaller."
        )
    return Mesh(axes, devices[:size])
