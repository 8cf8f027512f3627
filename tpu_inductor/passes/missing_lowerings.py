"""Ops torch-mlir has no StableHLO lowering for, as ATen ops it lowers.

Why: each ran in eager PyTorch between islands (found by torch-mlir's own
e2e suite, ``benchmarks/torch_mlir_e2e.py``):

* ``cumprod``: PyTorch's decomposition is ``prims.prod`` over growing
  prefixes, which does not lower either; here it is a scan by doubling;
* ``adaptive_max_pool2d``: torch-mlir's conversion fails ("condition must
  be true"); PyTorch's own decomposition (a max over gathered windows)
  lowers, indices included.
"""

from __future__ import annotations

import torch

aten = torch.ops.aten


def _cumprod_by_doubling(x: torch.Tensor, dim: int, dtype=None) -> torch.Tensor:
    """``cumprod`` as ``log2(n)`` multiplications by the running product shifted
    by 1, 2, 4, ... positions (Hillis-Steele).

    Integer products are exact in any order (int64 multiplication wraps the
    same way); floating ones associate differently from eager's running
    product, within a few ulps. Integer and bool inputs promote to int64, as
    eager's kernel does.
    """
    if dtype is None and not (x.is_floating_point() or x.is_complex()):
        dtype = torch.int64
    out = x.to(dtype) if dtype is not None else x.clone()
    if out.dim() == 0:
        return out
    dim = dim % out.dim()
    length = out.shape[dim]
    if not isinstance(length, int):
        return NotImplemented  # symbolic length: the op itself
    shift = 1
    while shift < length:
        ones_shape = list(out.shape)
        ones_shape[dim] = shift
        shifted = torch.cat([out.new_ones(ones_shape), out.narrow(dim, 0, length - shift)], dim)
        out = out * shifted
        shift *= 2
    return out


MISSING_LOWERING_DECOMPOSITIONS: dict = {
    aten.cumprod.default: _cumprod_by_doubling,
    aten.adaptive_max_pool2d.default: torch._decomp.decomposition_table[aten.adaptive_max_pool2d.default],
}
