"""Write an updated graph input in place with the rows it gets, instead of returning all of it.

Why: AOTAutograd functionalises an in-place update of a graph input into a
functional op whose whole result the graph returns, and then copies that
result back into the input. transformers' static KV cache does
``keys.index_copy_(2, cache_position, new_keys)`` in every layer at every
decode step, so each step XLA wrote a whole new cache, the result crossed to
torch, and ``copy_`` wrote the whole cache again; on a client that does not
share host memory with torch (a TPU, ``zero_copy=False``) the whole cache was
downloaded every step. Inductor avoids this by keeping the mutation in its
graph; here the write-back becomes the in-place op itself, run eagerly after
the islands, so only what it writes (the new rows and their positions) comes
from the device. The graph then returns the input itself, and AOTAutograd's
copy-back is ``x.copy_(x)``, which PyTorch skips. Where the client keeps a
device copy of the input, the write also gets the new value the device
computed and keeps it as that copy (runtime/resident_writes.py), so the
input is not uploaded again at the next call either.

A padded (symbolic) graph runs on padded copies of its inputs, so a write
inside it would land in the copy: there (:func:`defer_input_writes`) the
graph returns the write's operands (the positions and the new rows, cut back
to their real sizes like every output) and the input itself, and the
dynamic-shape runtime does the write on the call's own argument after the
graph (:class:`DeferredWrites`). A static cache whose length changes between
``generate()`` calls (transformers sizes it to each prompt) decodes through
such a graph. Where the client keeps device copies, the graph also hands on
the input's new padded value unfetched, which becomes the device copy of the
padded copy the runtime keeps (dynamic/kept_padding.py).

Before: ``%new = index_copy(%cache, 2, %pos, %rows)``, returned as the cache's
new value (and read by attention on the device);
after: ``%w = index_copy_(%cache, 2, %pos, %rows)`` before the output, eager,
returned in its place; attention still reads ``%new`` on the device.

Only where AOTAutograd says the input is written in its data alone and does
not require grad (``torch_api.inputs_written_in_place``), and its new value is
one functional ``index_copy`` or ``index_put`` of the input as it came in.
The write is the graph's last node, so every read of the old value (on the
device or in eager) has run before it; a padded (symbolic) graph's write
comes after its call (above).
"""

from __future__ import annotations

import dataclasses
from typing import Any, Optional, Sequence

import torch
import torch.fx
from torch.fx.experimental.symbolic_shapes import statically_known_true

from tpu_inductor.passes.wrap_negative_indices import wrapped_index

aten = torch.ops.aten

IN_PLACE_FORMS = {
    aten.index_copy.default: aten.index_copy_.default,
    aten.index_put.default: aten.index_put_.default,
}
"""A functional write and the in-place op that does it to its first argument."""

WRITES_INPUT = "tpu_inductor_writes_input"
"""Node meta key of an in-place write of a graph input (placed eager: placement.py)."""

SHARED_MEMORY_MIN_BYTES = 128 * 1024
"""Where torch and the device share memory, the copy-back of a smaller input
costs less than an eager write: a 2-layer Llama's 6 KiB cache tensors decoded
5% slower written in place, its 256 KiB ones 7% faster (median of paired
rounds on 2 cores). Where the client keeps device copies, every size gains
(the whole input crossed twice a call)."""

DEVICE_COPY = "device_copy"
"""The keyword through which a write gets the input's new value as the device
computed it, on a client that keeps device copies of inputs: the graph calls
runtime/resident_writes.py's write there (compiled_graph.py), and the island
hands that value on without fetching it."""


DEVICE_ONLY_RESULT = "tpu_inductor_device_only_result"
"""Node meta key of a padded graph's result that is only an input's new value
for its device copy (:func:`defer_input_writes`): the island hands it on
unfetched."""


@dataclasses.dataclass(frozen=True)
class InputWrites:
    """Which graph outputs are new values of inputs, as AOTAutograd traced the graph."""

    num_inputs: int
    """How many inputs AOTAutograd traced (a graph with others is left alone)."""
    writes: tuple[tuple[int, int], ...]
    """``(output position, input position)`` of each input written in its data alone."""

    @classmethod
    def of_current_trace(cls) -> Optional["InputWrites"]:
        from tpu_inductor import torch_api

        found = torch_api.inputs_written_in_place()
        return cls(*found) if found is not None else None


def input_writes_in_place(
    gm: torch.fx.GraphModule, input_writes: Optional[InputWrites], device_copies: bool = False
) -> torch.fx.GraphModule:
    """``device_copies``: the client keeps device copies of inputs; each write
    also gets the new value as the device computed it (:data:`DEVICE_COPY`).
    Otherwise inputs under :data:`SHARED_MEMORY_MIN_BYTES` keep the copy-back."""
    min_bytes = 0 if device_copies else SHARED_MEMORY_MIN_BYTES
    found = _functional_writes(gm, input_writes)
    if not found:  # read before the outputs: a graph may return one node, not a tuple
        return gm
    graph = gm.graph
    output = graph.output_node()
    results = list(output.args[0])
    changed = False
    for position, _, value in found:
        if _bytes(value.args[0]) < min_bytes:
            continue
        with graph.inserting_before(output):
            op, operands, kwargs = _in_place_form(graph, value)
            if device_copies:
                kwargs = {**kwargs, DEVICE_COPY: value}
            write = graph.call_function(op, (value.args[0], *operands), kwargs)
        write.meta = {**value.meta, WRITES_INPUT: True}
        results[position] = write
        changed = True
    if changed:
        set_outputs(gm, results)
    return gm


def copied_back(
    gm: torch.fx.GraphModule, input_writes: Optional[InputWrites]
) -> list[tuple[int, int, Any, torch.fx.Node]]:
    """``(output position, input position, new value, input placeholder)`` of
    each input AOTAutograd copies back; none where the graph's inputs are not
    the ones AOTAutograd traced (its synthetic bases) or its outputs are not a
    sequence."""
    if input_writes is None or not input_writes.writes:
        return []
    placeholders = list(gm.graph.find_nodes(op="placeholder"))
    if len(placeholders) != input_writes.num_inputs:
        return []
    results = gm.graph.output_node().args[0]
    if not isinstance(results, (tuple, list)):
        return []
    return [
        (position, index, results[position] if position < len(results) else None, placeholders[index])
        for position, index in input_writes.writes
    ]


def _functional_writes(
    gm: torch.fx.GraphModule, input_writes: Optional[InputWrites]
) -> list[tuple[int, int, torch.fx.Node]]:
    """``(output position, input position, write)`` of each input AOTAutograd
    copies back whose new value is one functional write into it (both forms
    of the rewrite start from these)."""
    return [
        (position, index, value)
        for position, index, value, target in copied_back(gm, input_writes)
        if _writes_into(value, target)
    ]


def set_outputs(gm: torch.fx.GraphModule, results: list) -> None:
    """Make ``results`` the graph's outputs and drop what no longer feeds them."""
    output = gm.graph.output_node()
    output.args = (type(output.args[0])(results),)
    gm.graph.eliminate_dead_code()
    gm.recompile()


def _writes_into(value: object, target: torch.fx.Node) -> bool:
    """``value`` is one functional write into ``target`` itself, of its shape and dtype."""
    if not isinstance(value, torch.fx.Node) or value.target not in IN_PLACE_FORMS or value.args[0] is not target:
        return False
    return same_shape_and_dtype(value, target)


def same_shape_and_dtype(value: torch.fx.Node, target: torch.fx.Node) -> bool:
    """``value`` (an input's new value) has the shape and dtype of the input ``target``."""
    new, old = value.meta.get("val"), target.meta.get("val")
    return (
        isinstance(new, torch.Tensor)
        and isinstance(old, torch.Tensor)
        and new.shape == old.shape
        and new.dtype == old.dtype
    )


def _bytes(node: torch.fx.Node) -> int:
    value = node.meta["val"]
    return value.numel() * value.element_size()


@dataclasses.dataclass(frozen=True)
class _Output:
    """Where a deferred write's operand is among the graph's outputs."""

    position: int


@dataclasses.dataclass(frozen=True)
class DeferredWrite:
    """One input's in-place write, done on the call's own argument after the graph."""

    input_index: int
    op: torch._ops.OpOverload
    """The in-place form (``index_copy_``, ``index_put_``)."""
    args: tuple
    """The write's arguments after the input, its tensors as :class:`_Output` markers."""
    kwargs: dict
    device_value: Optional[_Output] = None
    """On a client that keeps device copies: the input's new padded value as the
    device computed it (handed on unfetched), kept as the device copy of the
    input's kept padded copy (dynamic/kept_padding.py)."""


@dataclasses.dataclass(frozen=True)
class DeferredWrites:
    """The writes a padded graph leaves to its caller, and how many outputs are its own."""

    num_outputs: int
    writes: tuple[DeferredWrite, ...]

    def finish(self, outputs: Sequence[Any], args: Sequence[Any], kept: Optional[Any] = None) -> list[Any]:
        """Do every write into ``args`` with its operands from ``outputs`` (cut
        back to the real sizes), and into their kept padded copies (``kept``:
        dynamic/kept_padding.py's ``KeptPadding``); return the graph's own
        outputs, in which each written input is the argument itself
        (AOTAutograd's copy-back of an input into itself is skipped)."""

        def operand(value: Any) -> Any:
            return outputs[value.position] if isinstance(value, _Output) else value

        for write in self.writes:
            argument = args[write.input_index]
            operands = torch.fx.node.map_aggregate(write.args, operand)
            write.op(argument, *operands, **write.kwargs)
            if kept is not None:
                device_value = operand(write.device_value) if write.device_value is not None else None
                kept.write(write.input_index, argument, write.op, operands, write.kwargs, device_value)
        return list(outputs[: self.num_outputs])


def defer_input_writes(
    gm: torch.fx.GraphModule, input_writes: Optional[InputWrites], device_copies: bool = False
) -> tuple[torch.fx.GraphModule, Optional[DeferredWrites]]:
    """The padded graph's form of :func:`input_writes_in_place`: the input is
    returned as it came in, and its write's tensor operands become extra
    outputs, for :meth:`DeferredWrites.finish` after the call. ``device_copies``:
    the client keeps device copies of inputs; the input's new (padded) value
    is an extra output too, marked :data:`DEVICE_ONLY_RESULT`."""
    found = _functional_writes(gm, input_writes)
    if not found:  # read before the outputs: a graph may return one node, not a tuple
        return gm, None
    results = list(gm.graph.output_node().args[0])
    num_outputs = len(results)
    writes = []

    def as_output(node: torch.fx.Node) -> _Output:
        results.append(node)
        return _Output(len(results) - 1)

    output = gm.graph.output_node()
    for position, index, value in found:
        if not _operands_are_tensors(value):
            continue
        with gm.graph.inserting_before(output):
            op, operands, kwargs = _in_place_form(gm.graph, value)
        args = torch.fx.node.map_arg(operands, as_output)
        device_value = None
        if device_copies:
            value.meta[DEVICE_ONLY_RESULT] = True
            device_value = as_output(value)
        writes.append(DeferredWrite(index, op, args, kwargs, device_value))
        results[position] = value.args[0]
    if not writes:
        return gm, None
    set_outputs(gm, results)
    return gm, DeferredWrites(num_outputs, tuple(writes))


def _in_place_form(graph: torch.fx.Graph, value: torch.fx.Node) -> tuple[Any, tuple, dict]:
    """The in-place op that does ``value``'s write, its arguments after the
    input, and its keywords.

    A write of whole rows along one dim (``cache[:, :, positions] = rows``,
    gpt-fast's and transformers' sliding-window caches) is done by
    ``index_copy_`` rather than ``index_put_``: the same rows, at half the
    cost in eager (3.9 -> 1.9 us back to back, 10.9 -> 5.0 us after the
    model's other work evicted the caches; Gemma 3 makes two such writes a
    decode step). ``index_copy_`` refuses the negative positions that
    ``index_put_`` counts from the end, so they are wrapped first, in the
    graph, where the dim's size is a constant (a padded dim's is not the
    caller's).
    """
    rows = _rows_along_one_dim(value)
    if rows is None:
        return IN_PLACE_FORMS[value.target], tuple(value.args[1:]), dict(value.kwargs)
    dim, index, source = rows
    target = value.args[0]
    wrapped = wrapped_index(graph, target, dim, target.meta["val"].shape[dim], index, index.meta["val"])
    return aten.index_copy_.default, (dim, wrapped, source), {}


def _rows_along_one_dim(value: torch.fx.Node) -> Optional[tuple[int, torch.fx.Node, torch.fx.Node]]:
    """``(dim, index, rows)`` where ``value`` is ``index_put(x, [None, ..., index], rows)``
    that ``index_copy(x, dim, index, rows)`` computes too: one integer index
    on a dim of constant size, rows of exactly the shape it selects (no
    broadcasting), the same dtype, no accumulation."""
    if value.target is not aten.index_put.default or len(value.args) < 3:
        return None
    accumulate = value.args[3] if len(value.args) > 3 else value.kwargs.get("accumulate", False)
    target, indices, source = value.args[:3]
    if accumulate or not indices or any(i is not None for i in indices[:-1]):
        return None
    index, dim = indices[-1], len(indices) - 1
    if not isinstance(index, torch.fx.Node) or not isinstance(source, torch.fx.Node):
        return None
    x, i, rows = target.meta.get("val"), index.meta.get("val"), source.meta.get("val")
    if not all(isinstance(t, torch.Tensor) for t in (x, i, rows)):
        return None
    if i.dtype != torch.int64 or i.dim() != 1 or rows.dtype != x.dtype or rows.dim() != x.dim():
        return None
    if not isinstance(x.shape[dim], int):
        return None
    expected = [*x.shape[:dim], i.shape[0], *x.shape[dim + 1 :]]
    if not all(statically_known_true(have == want) for have, want in zip(rows.shape, expected)):
        return None
    return dim, index, source


def _operands_are_tensors(value: torch.fx.Node) -> bool:
    """Every node among the write's operands is a tensor (a graph output can carry it)."""
    nodes: list[torch.fx.Node] = []
    torch.fx.node.map_arg((value.args[1:], value.kwargs), nodes.append)
    return all(isinstance(n.meta.get("val"), torch.Tensor) for n in nodes)
