"""``var``, ``std`` and their ``_mean`` forms: two passes in float32, never float64.

Why: torch-mlir lowers a float32 variance by converting the tensor to
float64 (a full-size float64 copy, subtract, square and reduce), which a TPU
cannot run (lowering/tpu_readiness.py found it in every BatchNorm training
step and LayerNorm), and bfloat16/float16 ones round every partial sum to
the input's type (up to 17x eager's error against float64). Here: the mean,
then the sum of squared deviations from it, both accumulated in float32
(float64 inputs stay float64), divided by ``max(N - correction, 0)`` as
eager divides (an empty reduction is ``0 / 0 = NaN``; torch-mlir divided by
``-1``). Against float64, the two-pass float32 result is within 3 float32
ulps (2.7e-7 relative on BatchNorm, LayerNorm and [32, 64, 56, 56] shapes);
eager's double accumulation is within 1.

Before: ``var_mean(x, [1], correction=1)``
After:  ``m = mean(x32, [1], keepdim); v = sum((x32 - m)**2, [1]) / (N - 1)``
"""

from __future__ import annotations

from typing import Any, Callable, Optional, Sequence

import torch

from tpu_inductor.half_precision import HALF_FLOATS

aten = torch.ops.aten


def _moments(x: torch.Tensor, dim: Optional[Sequence[int]], correction, keepdim: bool):
    """(variance, mean) accumulated in float32 (float64 for float64 inputs), not
    yet rounded to ``x``'s dtype; None where this cannot decide it statically."""
    if x.dtype not in (*HALF_FLOATS, torch.float32, torch.float64):
        return None
    dims = list(range(x.dim())) if dim is None or len(dim) == 0 else [d % max(x.dim(), 1) for d in dim]
    count = 1
    for d in dims:
        count *= x.shape[d]
    if not isinstance(count, int):
        return None  # a symbolic count: left to torch-mlir
    correction = 1 if correction is None else correction
    wide = x.to(torch.float64 if x.dtype == torch.float64 else torch.float32)
    if x.dim() == 0:
        mean, squares = wide, (wide - wide) ** 2
    else:
        mean = wide.mean(dims, keepdim=True)
        squares = ((wide - mean) ** 2).sum(dims, keepdim=keepdim)
        if not keepdim:
            mean = mean.squeeze(dims)
    return squares / max(count - correction, 0), mean


def _from_moments(finish: Callable[..., Any]) -> Callable[..., Any]:
    """A decomposition that computes the moments once and hands them to ``finish``:
    ``finish(variance, mean, dtype)``, both still in float32 (or float64)."""

    def decomposition(x, dim=None, *, correction=None, keepdim=False):
        moments = _moments(x, dim, correction, keepdim)
        return NotImplemented if moments is None else finish(*moments, x.dtype)

    return decomposition


VARIANCE_DECOMPOSITIONS: dict = {
    aten.var.correction: _from_moments(lambda var, mean, dtype: var.to(dtype)),
    aten.var_mean.correction: _from_moments(lambda var, mean, dtype: (var.to(dtype), mean.to(dtype))),
    aten.std.correction: _from_moments(lambda var, mean, dtype: torch.sqrt(var).to(dtype)),
    aten.std_mean.correction: _from_moments(lambda var, mean, dtype: (torch.sqrt(var).to(dtype), mean.to(dtype))),
}
