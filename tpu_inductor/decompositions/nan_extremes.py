"""``argmax``/``argmin`` and ``max``/``min`` along a dim that see NaN as eager does.

Why: torch-mlir's lowering of these index reductions ignores NaN: for
``[[nan, -1.7, -4.3], [3.6, nan, -0.5]]`` ``argmax(dim=1)`` came back
``[1, 2]`` where eager (for which NaN is larger, and smaller, than every
number) gives ``[0, 1]``, and ``max(dim=1)`` returned ``-1.7`` for a row
holding NaN; ``masked.argmax`` failed 15 of its 49 OpInfo samples (found by
the every-sample OpInfo sweep). Here each float is mapped to an integer key
that orders as eager orders (its bits, with negative numbers' magnitude bits
flipped; ``-0.0`` as ``+0.0``; every NaN above, or for ``min`` below, every
number), the index reduction runs on the keys (integers, which lower
exactly, first index on ties), and the values are read at those indices.

Before: ``argmax(x, 1)``  After: ``argmax(where(isnan(x), MAX, key(x)), 1)``
"""

from __future__ import annotations

import torch

aten = torch.ops.aten

_KEY_TYPES = {
    torch.float32: torch.int32,
    torch.float64: torch.int64,
    torch.float16: torch.int16,
    torch.bfloat16: torch.int16,
}


def order_keys(x: torch.Tensor, largest: bool) -> torch.Tensor:
    """Integers that order as eager orders ``x``'s values, NaN at the ``largest`` end."""
    key_type = _KEY_TYPES[x.dtype]
    info = torch.iinfo(key_type)
    bits = torch.where(x == 0, torch.zeros_like(x), x).view(key_type)  # -0.0 ties with +0.0
    # Negative floats grow in magnitude as their bits grow: flip those bits.
    # (A 0-d tensor: torch-mlir cannot legalize bitwise_xor's Scalar form.)
    keys = torch.where(bits < 0, torch.bitwise_xor(bits, torch.full((), info.max, dtype=key_type)), bits)
    return torch.where(x.isnan(), info.max if largest else info.min, keys)


def _index_reduction(op, largest: bool):
    def decomposition(x, dim=None, keepdim=False):
        if x.dtype not in _KEY_TYPES:
            return NotImplemented
        return op(order_keys(x, largest), dim, keepdim)

    return decomposition


def _value_and_index(largest: bool):
    index_op = aten.argmax.default if largest else aten.argmin.default

    def decomposition(x, dim, keepdim=False):
        if x.dtype not in _KEY_TYPES or x.dim() == 0:
            return NotImplemented
        indices = index_op(order_keys(x, largest), dim, True)
        values = torch.gather(x, dim, indices)
        if not keepdim:
            indices, values = indices.squeeze(dim), values.squeeze(dim)
        return values, indices

    return decomposition


NAN_EXTREME_DECOMPOSITIONS: dict = {
    aten.argmax.default: _index_reduction(aten.argmax.default, largest=True),
    aten.argmin.default: _index_reduction(aten.argmin.default, largest=False),
    aten.max.dim: _value_and_index(largest=True),
    aten.min.dim: _value_and_index(largest=False),
}
