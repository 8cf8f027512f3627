"""Show torch-mlir a size that became a constant as a plain int while it imports a graph.

Why: a dynamic dim can be specialised in the middle of a trace (a guard
adds the replacement ``s27 -> 7``, as in Mistral's batch-2 prefill at prompt
7, issue #20). Values traced before that keep a ``SymInt`` whose expression
is now ``7``; values traced after it carry the int ``7``. torch-mlir's
importer types every ``SymInt`` dim as ``?``, so one dim is ``?`` on an op's
operand and ``7`` on its result::

    %250 = torch.aten.unsqueeze %42, %int1
        : !torch.vtensor<[?,?,16],f32>, !torch.int -> !torch.vtensor<[?,1,7,16],f32>

The StableHLO conversion builds the result from the operand's shape
(``tensor<?x1x?x16xf32>``) and has no cast to the static type its users
expect: "failed to legalize unresolved target materialization from
tensor<?x1x?x16xf32> to tensor<?x1x7x16xf32>". With the constant sizes read
as ints, every value's type says ``7`` and the island lowers. Both import
paths use it: the symbolic one (lowering/symbolic.py) and the static one
(lowering/stablehlo.py), which gets a graph whose every symbol was
specialised, such as Mistral's full-window decode step, whose cache ``cat``
was traced before its length was pinned.

Only the metadata the importer reads (``val`` and ``tensor_meta``) changes,
and only while it reads it: the graph, and what the rest of the backend
reads from it, stay as they were.
"""

from __future__ import annotations

import contextlib
from typing import Any, Iterator, Optional, Sequence

import torch
import torch.fx
from torch.fx.passes.shape_prop import TensorMetadata

_META_KEYS = ("val", "tensor_meta")


@contextlib.contextmanager
def constant_sizes_as_ints(gm: torch.fx.GraphModule) -> Iterator[int]:
    """Within the block, every tensor's constant ``SymInt`` sizes and strides
    in ``gm``'s metadata are ints; yields how many metadata entries changed."""
    saved: list[tuple[torch.fx.Node, str, Any]] = []
    for node in gm.graph.nodes:
        for key in _META_KEYS:
            value = node.meta.get(key)
            concrete = _concrete(value)
            if concrete is not None:
                saved.append((node, key, value))
                node.meta[key] = concrete
    try:
        yield len(saved)
    finally:
        for node, key, value in saved:
            node.meta[key] = value


def _concrete(value: Any) -> Any:
    """``value`` with constant sizes as ints, or None when it has none."""
    if isinstance(value, TensorMetadata):
        shape, stride = _ints(value.shape), _ints(value.stride)
        if shape is None and stride is None:
            return None
        return value._replace(
            shape=torch.Size(shape if shape is not None else value.shape),
            stride=tuple(stride if stride is not None else value.stride),
        )
    if isinstance(value, torch.Tensor):
        return _concrete_fake(value)
    if isinstance(value, (list, tuple)) and not isinstance(value, torch.Size):
        parts = [_concrete(v) for v in value]
        if all(p is None for p in parts):
            return None
        return type(value)(v if p is None else p for v, p in zip(value, parts))
    return None


def _concrete_fake(value: torch.Tensor) -> Optional[torch.Tensor]:
    """A fake tensor like ``value`` (same fake mode, dtype, device) with its
    constant sizes and strides as ints."""
    fake_mode = getattr(value, "fake_mode", None)
    shape, stride = _ints(value.shape), _ints(value.stride())
    if fake_mode is None or (shape is None and stride is None):
        return None
    with fake_mode:
        return torch.empty_strided(
            shape if shape is not None else value.shape,
            stride if stride is not None else value.stride(),
            dtype=value.dtype,
            device=value.device,
        )


def _ints(sizes: Sequence[Any]) -> Optional[list[Any]]:
    """``sizes`` with each constant ``SymInt`` as its int; None when none is."""
    changed = False
    result = []
    for size in sizes:
        if isinstance(size, torch.SymInt):
            constant = size.node.maybe_as_int()
            if constant is not None:
                size, changed = constant, True
        result.append(size)
    return result if changed else None
