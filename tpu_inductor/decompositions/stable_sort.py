"""``sort(stable=True)`` as a sort of keys that never tie.

Why: torch-mlir lowers ``aten.sort.default`` only, to a ``stablehlo.sort``
with ``is_stable = false``, and imports ``aten.sort.stable`` (what
``torch.sort(..., stable=True)`` and ``torch.argsort(..., stable=True)``
trace to) as an op nothing converts: it ran in eager PyTorch, splitting the
island around it. FlexAttention's block masks sort that way, in every
transformers model run with ``attn_implementation="flex_attention"``. Marking
the lowered sort stable would not do: the unstable ``sort`` must keep
matching eager's unstable order (on XLA:CPU both are libstdc++'s
``std::sort`` over the same comparisons), and a stable flag is a promise the
platform may keep differently.

A stable sort is the sort of the pairs ``(value, position)``; packed into one
int64, ``value_key * 2**32 + position``, no two keys are equal, so any sort
(stable or not, on any platform) orders them one way, the stable order. The
value's key keeps its order in 32 bits: integers (and bool) as they are; a
float as the integer key ``argmax`` already reduces
(``nan_extremes.order_keys``: its bits, negative ones with their magnitude
bits flipped, ``-0.0`` as ``+0.0``, equal in PyTorch, and every NaN above
every number: PyTorch sorts NaN last, ascending). Descending order takes the
key's complement, so ties still come in input order. The values are gathered
with the order found.

int64 and float64 values need all 64 bits for themselves: those keep the
op, which runs eagerly (placement/support.py knows it does not lower).

Before: ``sort.stable(x, stable=True, dim=-1, descending=True)``
After:  ``order = sort(~key(x) * 2**32 + arange(n), dim=-1)[1]``; ``(gather(x, -1, order), order)``
"""

from __future__ import annotations

import torch

from tpu_inductor.decompositions.nan_extremes import order_keys

aten = torch.ops.aten

_KEYED = frozenset({
    torch.float32, torch.float16, torch.bfloat16,
    torch.int32, torch.int16, torch.int8, torch.uint8, torch.bool,
})
"""Dtypes whose order fits in 32 bits, beside a 32-bit position."""

_POSITION_BITS = 32


def _ordered_key(x: torch.Tensor) -> torch.Tensor:
    """int64 whose order is ``x``'s order as ``sort`` sees it, in [-2**31, 2**31)."""
    if x.is_floating_point():
        return order_keys(x, largest=True).to(torch.int64)  # NaN last, -0.0 == +0.0
    return x.to(torch.int64)


def sort_stable(x, *, stable=None, dim: int = -1, descending: bool = False):
    if not stable:
        return aten.sort.default(x, dim, descending)
    if x.dtype not in _KEYED or x.dim() == 0:
        return NotImplemented
    dim = dim % x.dim()
    key = _ordered_key(x)
    if descending:
        key = torch.bitwise_not(key)
    shape = [1] * x.dim()
    shape[dim] = x.shape[dim]
    positions = torch.arange(x.shape[dim], dtype=torch.int64, device=x.device).view(shape)
    _, order = aten.sort.default(key * (1 << _POSITION_BITS) + positions, dim, False)
    return torch.gather(x, dim, order), order


STABLE_SORT_DECOMPOSITIONS = {aten.sort.stable: sort_stable}
