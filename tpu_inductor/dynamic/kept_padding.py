"""Padded copies of inputs written in place, kept from one call to the next.

Why: a padded graph runs on zero-extended copies of its inputs
(dynamic/padding.py). A static KV cache whose length changes per
``generate()`` call makes the decode graph padded, so at every token every
cache tensor was copied into a new padded tensor, and that new tensor was
imported into PJRT again (a DLPack import per cache tensor per token; on a
client that keeps device copies, an upload of the whole cache). The cache
changes between tokens only by the graph's own write
(passes/input_writes_in_place.py: ``DeferredWrites``), which lands at real
positions. So the padded copy is kept and given the same write: it stays
equal to a fresh padding of the argument, and the next token reuses it
(the same tensor: its PJRT view is kept too, runtime/transfer.py). Where
the client keeps device copies, the graph also hands on the copy's new
value as the device computed it, which becomes the copy's device copy
(runtime/transfer.py's ``ResidentBuffers.written``): the cache is uploaded
once per ``generate()``, not at every token.

A kept copy is used only for the same argument object, at the version the
last write left it (anything else that changed it, a ``cache.reset()``,
makes a fresh copy) and at the same bucket shape. The version expected is
the one after AOTAutograd's copy-back of the argument into itself
(``AOT_COPY_BACK_BUMPS``); were a later PyTorch to skip that bump, every
call would pad afresh, as before: slower, never stale, unless the caller
also wrote the cache itself between two calls.
"""

from __future__ import annotations

import weakref
from typing import Any, Callable, Optional, Sequence

import torch

from tpu_inductor.runtime.resident_writes import AOT_COPY_BACK_BUMPS, keep_written
from tpu_inductor.runtime.transfer import ResidentBuffers, version_of


class KeptPadding:
    """Per argument position written in place: (argument, its version, padded copy)."""

    def __init__(self, positions: set[int], resident: Optional[ResidentBuffers] = None) -> None:
        """``resident``: the device copies a client keeps (a TPU, ``zero_copy=False``)."""
        self.positions = frozenset(positions)
        self._resident = resident
        self._kept: dict[int, tuple[weakref.ref, int, torch.Tensor]] = {}

    def reuse(self, index: int, argument: torch.Tensor, shape: list[int]) -> Optional[torch.Tensor]:
        """The kept padded copy of ``argument`` at ``shape``, if still equal to a fresh one."""
        entry = self._kept.get(index)
        if entry is None:
            return None
        ref, version, padded = entry
        if ref() is not argument or version_of(argument) != version or list(padded.shape) != shape:
            return None
        return padded

    def keep(self, index: int, argument: torch.Tensor, padded: torch.Tensor) -> None:
        """Keep ``padded`` (made from ``argument`` for this call) while ``argument`` lives."""
        version = version_of(argument)
        if version is None or padded.is_inference():
            # An inference tensor tracks no version (nothing proves it unchanged),
            # and one made under inference_mode cannot be written outside it.
            self._kept.pop(index, None)
            return
        self._kept[index] = (weakref.ref(argument, _forget(self._kept, index)), version, padded)

    def write(
        self,
        index: int,
        argument: torch.Tensor,
        op: Callable[..., Any],
        args: Sequence[Any],
        kwargs: dict,
        device_value: Any = None,
    ) -> None:
        """Give the kept copy of ``argument`` the write ``op(argument, *args,
        **kwargs)`` just did to it (at real positions, which are the copy's
        too). ``device_value``: the copy's new value as the device computed
        it (a buffer), kept as its device copy where the client keeps them,
        so the next call does not upload the whole copy again."""
        entry = self._kept.get(index)
        if entry is None or entry[0]() is not argument:
            return
        padded = entry[2]
        version_before = padded._version
        # The operands are cut back to the real sizes: along a padded dim the
        # write lands in the copy's real part (a view; the version is shared).
        real_part = padded
        for dim, (real, have) in enumerate(zip(argument.shape, padded.shape)):
            if real != have:
                real_part = real_part.narrow(dim, 0, real)
        op(real_part, *args, **kwargs)
        if self._resident is not None:
            keep_written(self._resident, padded, version_before, device_value, op, args)
        # AOTAutograd then copies the argument into itself: its version moves
        # once more, with no data (as in runtime/resident_writes.py).
        self._kept[index] = (entry[0], version_of(argument) + AOT_COPY_BACK_BUMPS, entry[2])


def _forget(kept: dict, index: int) -> Callable[[weakref.ref], None]:
    """Drop the padded copy at ``index`` when its argument dies (a cache freed
    after ``generate()`` does not stay alive in its padded form)."""

    def callback(dead: weakref.ref) -> None:
        entry = kept.get(index)
        if entry is not None and entry[0] is dead:
            del kept[index]

    return callback
