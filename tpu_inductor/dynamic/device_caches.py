"""A padded graph's grown caches: rebuilt on the host, kept padded on the device.

Why: see passes/grown_caches.py. After each call the host builds every
grown cache from the argument it already holds and the new rows that came
down (one ``cat``, the copy the cut back to the real length made before), and
the device's padded new value becomes that new tensor's device copy, keyed by
its padded shape. The next call pads the new tensor to its bucket: where the
kept copy has that shape, it is handed to the island as it is (no padding on
the host, no upload); where the cache outgrew its bucket, it is padded and
uploaded as before (once per bucket).

A kept copy is used only for the same tensor object, unchanged (its version
counter and data pointer: runtime/transfer.py's ``ResidentBuffers``), and
only where every reader of that argument in the graph is a device island
(:meth:`DeviceCaches.only_for`), since nothing else could read a device
buffer in a tensor's place.
"""

from __future__ import annotations

from typing import Any, Collection, Optional, Sequence

import torch

from tpu_inductor.passes.grown_caches import GrownCaches
from tpu_inductor.runtime.transfer import ResidentBuffers

_PADDED = "padded"
"""Layout key of a kept padded copy: ``(_PADDED, padded shape)``."""


class DeviceCaches:
    """The grown caches of one padded graph on a client that keeps device copies."""

    def __init__(self, grown: GrownCaches, resident: ResidentBuffers) -> None:
        self._grown = grown
        self._resident = resident
        self.inputs = grown.inputs
        """Argument positions whose kept padded copy a call may take."""

    def only_for(self, inputs: Collection[int]) -> None:
        """Take kept copies for these argument positions only (the others have readers off the device)."""
        self.inputs = self.inputs & frozenset(inputs)

    def padded_copy(self, argument: torch.Tensor, shape: Sequence[int]) -> Optional[Any]:
        """The device buffer holding ``argument`` (an argument at one of
        :attr:`inputs`) padded to ``shape``, if one is kept."""
        return self._resident.current(argument, (_PADDED, tuple(shape)))

    def finish(self, outputs: Sequence[Any], args: Sequence[Any]) -> list[Any]:
        """Each grown cache built on the host from ``args`` and its new rows
        (cut back to real sizes, like every output), its device value kept as
        its padded copy; the outputs up to the graph's own."""
        outputs = list(outputs)
        for cache in self._grown.caches:
            grown = torch.cat([args[cache.input_index], outputs[cache.new_rows]], cache.dim)
            device_value = outputs[cache.position]
            # A bucket that ran its ATen graph eagerly returns a tensor, and a
            # cache that filled its bucket has outgrown the device's cut.
            if not isinstance(device_value, torch.Tensor) and grown.shape[cache.dim] <= device_value.shape[cache.dim]:
                self._resident.remember(grown, (_PADDED, tuple(device_value.shape)), device_value)
            outputs[cache.position] = grown
        return outputs[: self._grown.num_outputs]
