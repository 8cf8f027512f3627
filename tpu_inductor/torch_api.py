"""Where tpu_inductor meets PyTorch APIs that differ between the torch
versions it supports (2.11 to 2.13, ``pyproject.toml``).

Why one module: a private API that moved or a decomposition that a release
added is then handled once, with the versions named, instead of as a
``KeyError`` at import in whichever module used it first.
"""

from __future__ import annotations

from typing import Callable, Optional

import torch


def pytorch_decomposition(op: torch._ops.OpOverload) -> Optional[Callable]:
    """PyTorch's own decomposition of ``op``, or None where this torch has none
    (``max_pool3d_with_indices`` and ``adaptive_max_pool2d`` have one from
    2.12 on)."""
    return torch._decomp.decomposition_table.get(op)
