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
(the same tensor: its PJRT view is kept too, runtime/transfer.py).

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
from typing import Any, Callable, Optional

import torch

from tpu_inductor.runtime.resident_writes import AOT_COPY_BACK_BUMPS


class KeptPadding:
    """Per argument position written in place: (argument, its version, padded copy)."""

    def __init__(self, positions: set[int]) -> None:
        self.positions = frozenset(positions)
        self._kept: dict[int, tuple[weakref.ref, int, torch.Tensor]] = {}

    def reuse(self, index: int, argument: torch.Tensor, shape: list[int]) -> Optional[torch.Tensor]:
        """The kept padded copy of ``argument`` at ``shape``, if still equal to a fresh one."""
        entry = self._kept.get(index)
        if entry is None:
            return None
        ref, version, padded = entry
        if ref() is not argument or _version(argument) != version or list(padded.shape) != shape:
            return None
        return padded

    def keep(self, index: int, argument: torch.Tensor, padded: torch.Tensor) -> None:
        """Keep ``padded`` (made from ``argument`` for this call)."""
        version = _version(argument)
        if version is None:  # an inference tensor tracks no version: nothing proves it unchanged
            self._kept.pop(index, None)
            return
        self._kept[index] = (weakref.ref(argument), version, padded)

    def write(self, index: int, argument: torch.Tensor, op: Callable[..., Any], *args: Any, **kwargs: Any) -> None:
        """Give the kept copy of ``argument`` the write ``op`` just did to it
        (at real positions, which are the copy's too)."""
        entry = self._kept.get(index)
        if entry is None or entry[0]() is not argument:
            return
        op(entry[2], *args, **kwargs)
        # AOTAutograd then copies the argument into itself: its version moves
        # once more, with no data (as in runtime/resident_writes.py).
        self._kept[index] = (entry[0], _version(argument) + AOT_COPY_BACK_BUMPS, entry[2])


def _version(tensor: torch.Tensor) -> Optional[int]:
    return None if tensor.is_inference() else tensor._version
