"""The arguments of sliding-window ops, read the way eager reads them.

Why its own module: the pooling and convolution decompositions
(avg_pool_counts.py, exact_values.py, pooling_backward.py) each need a
pooling argument as one int per spatial dim and eager's output size; each
had its own copy of both.
"""

from __future__ import annotations

from typing import Optional, Sequence, Union


def per_dim(value: Union[int, Sequence[int]], dims: int, default: Optional[Sequence[int]] = None) -> list[int]:
    """One int per spatial dim: ``k`` or ``[k]`` means ``[k] * dims``; ``[]`` means ``default``."""
    if isinstance(value, int):
        return [value] * dims
    values = list(value)
    if not values and default is not None:
        return list(default)
    return values * dims if len(values) == 1 else values


def pooled_size(size: int, kernel: int, stride: int, padding: int, dilation: int = 1, ceil_mode: bool = False) -> int:
    """Eager's number of windows along one dim. With ``ceil_mode`` the last
    window may run past the padded input, but must start inside the input or
    its left padding."""
    span = size + 2 * padding - dilation * (kernel - 1) - 1
    windows = (-(-span // stride) if ceil_mode else span // stride) + 1
    if ceil_mode and (windows - 1) * stride >= size + padding:
        windows -= 1
    return windows
