"""Island results that are an input's whole new value, written into the input by the island's call.

Why: AOTAutograd functionalises an in-place update of a graph input into a
new value that the graph returns and that AOTAutograd copies back into the
input after the call. passes/input_writes_in_place.py turns the updates
that write a few rows (``index_copy_``, ``index_put_``) into those writes;
an update that rewrites the whole input is left as a copy-back. transformers'
sliding-window cache, once the window is full, is one: every decode step
rolls it by a position (``keys.copy_(keys.roll(-1))`` with the new row
last). On a client that keeps device copies of inputs (a TPU,
``zero_copy=False``) the copy-back changed the input on the host, its
device copy went stale, and the next step uploaded the whole window again:
Mistral's decode moved 4.0 KB up a token of a 23 KB cache. Where the new
value is an island's result, the island's call copies it into the input
and keeps the buffer the device computed as the input's device copy
(runtime/executable.py), and returns the input itself, whose copy-back
into itself PyTorch skips: the next step reads the device's buffer.

Safe because: the copy happens after the executable has run, so after every
read of the input's old value inside the island; every other reader of the
input is inside the island too, so no later node sees the new value early;
outside the island the result feeds nothing but the graph's output at that
one position, so no other output becomes an alias of the input.
"""

from __future__ import annotations

from typing import Optional, Sequence

import torch
import torch.fx

from tpu_inductor.passes.input_writes_in_place import InputWrites, copied_back, same_shape_and_dtype
from tpu_inductor.placement.partition import Island


def results_into_inputs(
    gm: torch.fx.GraphModule, islands: Sequence[Island], input_writes: Optional[InputWrites]
) -> dict[str, tuple[tuple[int, int], ...]]:
    """Per island name, ``(result index, argument index)`` of each result that
    its call writes into its argument (``gm``: the graph the islands were cut
    from, before they are fused into it)."""
    output = gm.graph.output_node()
    found: dict[str, list[tuple[int, int]]] = {}
    for _, _, value, target in copied_back(gm, input_writes):
        if not isinstance(value, torch.fx.Node) or list(output.args[0]).count(value) != 1:
            continue
        for island in islands:
            if island.frozen or island.collective or value not in island.outputs or target not in island.inputs:
                continue
            inside = set(island.nodes)
            read_inside = set(target.users) <= inside and set(value.users) <= inside | {output}
            if read_inside and same_shape_and_dtype(value, target):
                found.setdefault(island.name, []).append((island.outputs.index(value), island.inputs.index(target)))
    return {name: tuple(pairs) for name, pairs in found.items()}
