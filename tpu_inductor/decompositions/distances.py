"""``torch.cdist`` for every ``p``, forward and backward, as ops torch-mlir lowers.

Why: ``cdist`` is a composite op whose kernel computes ``p = 2`` with a
matmul (for more than 25 rows, or when asked) and everything else with
``_cdist_forward``, which torch-mlir cannot lower, nor its backward
``_cdist_backward``: ``cdist(x, y, p=1)`` ran in eager, and in a training
step its backward too. It is decomposed before autograd records it
(``torch_api.above_autograd``), so the backward is that of the ops below.

The sum runs over the difference of every pair of rows, as eager's
``_cdist_forward`` does (``p = 0``: the count of differing coordinates,
only where no gradient is wanted; ``inf``: the largest difference). ``p = 2`` keeps eager's own choice between
that and the matmul form (``compute_mode``), so the numbers stay eager's.
"""

from __future__ import annotations

import math
from typing import Optional

import torch

aten = torch.ops.aten

_MATMUL_FROM_ROWS = 25
"""Eager's ``cdist`` uses the matmul form for ``p = 2`` above this many rows on either side."""


def _cdist(x1: torch.Tensor, x2: torch.Tensor, p: float = 2.0, compute_mode: Optional[int] = None):
    # compute_mode: None or 0 = the matmul form above 25 rows, 1 = always, 2 = never.
    rows = max(x1.shape[-2], x2.shape[-2])
    if p == 2.0 and (compute_mode == 1 or (compute_mode in (None, 0) and rows > _MATMUL_FROM_ROWS)):
        return NotImplemented  # eager's matmul form: composite ops that lower already
    difference = (x1.unsqueeze(-2) - x2.unsqueeze(-3)).abs()
    if p == 0:
        if x1.requires_grad or x2.requires_grad:
            return NotImplemented  # eager's result takes part in autograd (a zero gradient); a count does not
        return (difference != 0).to(x1.dtype).sum(-1)
    if math.isinf(p):
        return difference.amax(-1)
    if p == 1:
        return difference.sum(-1)
    return _root_away_from_zero(_power_away_from_zero(difference, p).sum(-1), 1.0 / p)


def _power_away_from_zero(value: torch.Tensor, exponent: float) -> torch.Tensor:
    """``value ** exponent`` for ``value >= 0``, whose gradient at 0 is 0 (as
    eager's ``_cdist_backward`` gives for a coordinate or a pair at distance
    0), not the NaN of ``pow``'s infinite slope times 0."""
    positive = value > 0
    return torch.where(positive, torch.where(positive, value, 1.0).pow(exponent), 0.0)


_root_away_from_zero = _power_away_from_zero


DISTANCE_DECOMPOSITIONS: dict = {aten.cdist.default: _cdist}
"""Decomposed above autograd (``torch_api.above_autograd``)."""
