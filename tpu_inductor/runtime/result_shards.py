"""The parts of a mesh island's result that each device holds, when a caller asks.

Why: a graph compiled for a mesh hands back whole torch tensors (a Dynamo
graph returns tensors of the metadata it traced), put together on the host
from the part each device computed (runtime/sharded.py). A caller that wants
the parts themselves (to see how XLA split a result, or to hand each device's
part on) asks with ``tpu_inductor.shards(result)``, as PyTorch/XLA's
``XLAShardedTensor.local_shards`` does: one :class:`Shard` per device of the
mesh, its position on the mesh, the slices of the whole it holds and that
part. The layout is the compiled program's output sharding, noted on each
result tensor as it leaves the executable (an attribute, gone with the
tensor); the parts are views of the whole, which holds exactly what each
device computed.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Optional, Sequence

import torch

from tpu_inductor.runtime.mesh import Mesh

_LAYOUT = "_tpu_inductor_result_layout"


@dataclasses.dataclass(frozen=True)
class Shard:
    """One device's part of a result."""

    device: Any
    """The PJRT device that holds the part."""
    position: dict[str, int]
    """Its coordinates on the mesh: axis name -> index along that axis."""
    index: tuple[slice, ...]
    """The slices of the whole result the part is."""
    data: torch.Tensor
    """The part: a view of the whole result."""


@dataclasses.dataclass(frozen=True)
class ResultLayout:
    """Where each device's part of one result lies, per device of the mesh in order."""

    mesh: Mesh
    slices: tuple[Optional[tuple[slice, ...]], ...]
    """Per device, the slices of the whole it holds; None: the whole (a copy)."""


def layout_of(mesh: Mesh, device_slices: Optional[dict[int, tuple[slice, ...]]]) -> ResultLayout:
    """The :class:`ResultLayout` of a result over ``mesh`` whose compiled
    sharding gives ``device_slices`` (device index on the mesh -> slices;
    None when every device holds a copy)."""
    slices = tuple(None if device_slices is None else device_slices[i] for i in range(len(mesh.devices)))
    return ResultLayout(mesh, slices)


def note(results: Sequence[torch.Tensor], layouts: Sequence[ResultLayout]) -> None:
    """Put each result's layout on it, for :func:`shards`."""
    for tensor, layout in zip(results, layouts):
        setattr(tensor, _LAYOUT, layout)


def note_cut(padded: torch.Tensor, real: torch.Tensor) -> None:
    """``real`` is ``padded`` (a result of a bucket's executable) cut back to
    the real sizes (dynamic/padding.py): it takes ``padded``'s layout, each
    device's slices cut to ``real``'s shape (a device that held only padding
    holds an empty part)."""
    layout = getattr(padded, _LAYOUT, None)
    if layout is None:
        return

    def cut(index: tuple[slice, ...]) -> tuple[slice, ...]:
        return tuple(slice(min(s.start, size), min(s.stop, size)) for s, size in zip(index, real.shape))

    slices = tuple(None if index is None else cut(index) for index in layout.slices)
    setattr(real, _LAYOUT, dataclasses.replace(layout, slices=slices))


def shards(tensor: torch.Tensor) -> list[Shard]:
    """The part of ``tensor`` that each device of the mesh holds, as the
    compiled program left it: one :class:`Shard` per device, in mesh order
    (devices that hold copies of one part each get it).

    ``tensor`` must be a result of an island compiled for a mesh (the ``mesh``
    option) as the compiled function returned it; a tensor computed from it
    afterwards, by the user or by an op that ran in eager PyTorch, has no
    device parts and is a ``ValueError``."""
    layout = getattr(tensor, _LAYOUT, None)
    if layout is None:
        raise ValueError(
            f"a tensor of shape {tuple(tensor.shape)} was not returned by a graph compiled for a device mesh, "
            "so it has no per-device parts; call tpu_inductor.shards on a result of torch.compile(..., "
            "backend='tpu', options={'mesh': ...}) as it was returned (not on a view or a value computed from it)"
        )
    parts = []
    for device_index, (device, cut) in enumerate(zip(layout.mesh.devices, layout.slices)):
        index = cut if cut is not None else tuple(slice(0, size) for size in tensor.shape)
        parts.append(Shard(device, layout.mesh.position(device_index), index, tensor[index]))
    return parts
