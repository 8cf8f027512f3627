"""The half-precision float dtypes, in one place.

PyTorch computes a ``bfloat16`` or ``float16`` op in float32 (its
``opmath_type``) and rounds the result once; the decompositions, passes and
the lowering that keep that one rounding (``lowering/half_floats_in_float32.py``
first) ask this module which dtypes it applies to.
"""

from __future__ import annotations

from typing import Any

import torch

HALF_FLOATS = frozenset({torch.bfloat16, torch.float16})


def is_half(value: Any) -> bool:
    """Whether ``value`` is a tensor (real or fake) of a half-precision float dtype."""
    return isinstance(value, torch.Tensor) and value.dtype in HALF_FLOATS
