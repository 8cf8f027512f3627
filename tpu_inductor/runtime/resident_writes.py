"""Keep the device's new value of an input the graph wrote as its device copy.

Why: on a client that does not share host memory with torch (a TPU, or
``zero_copy=False``), :class:`~tpu_inductor.runtime.transfer.ResidentBuffers`
keeps each input's device copy while the tensor is unchanged. A static KV
cache changes at every decode step, by a few rows that
passes/input_writes_in_place.py writes in place on the host; its whole
device copy was then stale, and every step uploaded the whole cache. The
island computes the cache's new value on the device anyway (attention reads
it); it hands that buffer on unfetched, and the write keeps it as the cache's
device copy, so the cache crosses to the device once per ``generate()``, not
once per token.

The buffer is kept only where the device copy was current just before the
host write (the device computed from what the host had), and where the host
and the device cannot have written different values: indices without
repeats.
"""

from __future__ import annotations

from typing import Any, Callable, Optional, Sequence

import torch

from tpu_inductor.passes.input_writes_in_place import DEVICE_COPY
from tpu_inductor.runtime.transfer import ResidentBuffers

aten = torch.ops.aten

AOT_COPY_BACK_BUMPS = 1
"""After the graph, AOTAutograd copies each returned input into itself
(``x.copy_(x)``: no data moves, the version counter moves once)."""


def keeping_device_copy(op: Any, resident: ResidentBuffers) -> Callable[..., torch.Tensor]:
    """``op`` (``index_copy_`` or ``index_put_`` of a graph input) that keeps
    the device's new value (keyword :data:`DEVICE_COPY`) as the input's device
    copy; the graph calls it in the op's place."""

    def write(target: torch.Tensor, *args: Any, **kwargs: Any) -> torch.Tensor:
        device_value = kwargs.pop(DEVICE_COPY)
        version_before = target._version
        result = op(target, *args, **kwargs)
        keep_written(resident, target, version_before, device_value, op, args, bumps_after=AOT_COPY_BACK_BUMPS)
        return result

    return write


def keep_written(
    resident: ResidentBuffers,
    target: torch.Tensor,
    version_before: int,
    device_value: Any,
    op: Any,
    args: Sequence[Any],
    bumps_after: int = 0,
) -> None:
    """After ``op(target, *args)`` wrote ``target`` on the host: keep
    ``device_value`` (the device's new value of it, a buffer; a tensor where the
    island ran eagerly, or None, keeps nothing) as its device copy, where the
    write's positions are distinct (:meth:`ResidentBuffers.written` says the rest)."""
    if device_value is None or isinstance(device_value, torch.Tensor):
        return
    if _no_repeated_positions(op, args):
        resident.written(target, version_before, device_value, bumps_after=bumps_after)


def _no_repeated_positions(op: Any, args: Sequence[Any]) -> bool:
    """The write's positions are distinct. Repeated ones would let the host and
    the device differ: a plain write keeps one of the rows, an accumulating
    one adds them in an order of its own (float sums round differently)."""
    if op is aten.index_copy_.default:
        index: Optional[torch.Tensor] = args[1]
    else:
        indices = args[0]
        given = [i for i in indices if i is not None]
        # One integer index tensor; several broadcast together, or a mask, are not checked here.
        index = given[0] if len(given) == 1 and given[0].dtype != torch.bool else None
    return index is not None and index.unique().numel() == index.numel()
