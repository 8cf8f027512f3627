"""The decomposition table AOTAutograd applies while tracing ATen graphs.

Why: torch-mlir lowers core ATen, not the long tail of composite ops. We take
torch-mlir's own table (PyTorch's core ATen decompositions minus those whose
output torch-mlir cannot lower, plus the overloads it needs) so what reaches
the importer is what it was built for. Before: ``aten.native_layer_norm(x, ..)``;
after: ``mean``/``var``/``rsqrt``/``mul``/``add`` that lower one-to-one.
"""

from __future__ import annotations

import functools
from typing import Callable

import torch

aten = torch.ops.aten


def _python_remainder(a, b):
    """``remainder`` with the divisor's sign, as eager computes it.

    torch-mlir lowers ``aten.remainder`` to ``stablehlo.remainder``, which
    takes the dividend's sign (C's fmod): ``-7 % 5`` came back ``-2``, not
    ``3``. Eager computes fmod and then shifts results whose sign differs from
    the divisor's; we emit exactly that.
    """
    r = torch.fmod(a, b)
    shift = (r != 0) & ((r < 0) != (torch.as_tensor(b) < 0))
    return torch.where(shift, r + b, r)


def _shift_by_tensor(tensor_op):
    """``x << 2`` as ``bitwise_left_shift(x, tensor(2))``.

    torch-mlir's StableHLO lowering rejects the Scalar overloads of the shift
    operators (it cannot legalize the ``torch.constant.int`` operand) but
    lowers the Tensor overloads; a 0-d shift amount is the same computation.
    """

    def shift(a, amount):
        return tensor_op(a, torch.scalar_tensor(amount, dtype=a.dtype))

    return shift


# Decompositions of our own: each fixes a wrong lowering or fills a gap.
_OURS: dict = {
    aten.remainder.Tensor: _python_remainder,
    aten.remainder.Scalar: _python_remainder,
    aten.__lshift__.Scalar: _shift_by_tensor(aten.bitwise_left_shift.Tensor),
    aten.__rshift__.Scalar: _shift_by_tensor(aten.bitwise_right_shift.Tensor),
    aten.bitwise_left_shift.Tensor_Scalar: _shift_by_tensor(aten.bitwise_left_shift.Tensor),
    aten.bitwise_right_shift.Tensor_Scalar: _shift_by_tensor(aten.bitwise_right_shift.Tensor),
}


@functools.cache
def decomposition_table() -> dict[torch._ops.OperatorBase, Callable]:
    from torch_mlir.extras.fx_decomp_util import get_decomposition_table

    table = dict(get_decomposition_table())
    table.update(_OURS)
    return table
