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

from tpu_inductor.torch_api import pytorch_decomposition

from tpu_inductor.decompositions.adaptive_pools import ADAPTIVE_POOL_DECOMPOSITIONS
from tpu_inductor.decompositions.avg_pool_counts import AVG_POOL_DECOMPOSITIONS
from tpu_inductor.decompositions.convolution_backward import CONVOLUTION_BACKWARD_DECOMPOSITIONS, window_positions
from tpu_inductor.decompositions.distances import DISTANCE_DECOMPOSITIONS
from tpu_inductor.decompositions.embedding_bags import ABOVE_AUTOGRAD_DECOMPOSITIONS, EMBEDDING_BAG_DECOMPOSITIONS
from tpu_inductor.decompositions.exact_values import ABOVE_AUTOGRAD_EXACT_VALUES, EXACT_VALUE_DECOMPOSITIONS
from tpu_inductor.decompositions.foreach_ops import FOREACH_DECOMPOSITIONS
from tpu_inductor.decompositions.grouped_matmul import grouped_matmul_decompositions
from tpu_inductor.decompositions.lookups import LOOKUP_DECOMPOSITIONS
from tpu_inductor.decompositions.missing_lowerings import MISSING_LOWERING_DECOMPOSITIONS
from tpu_inductor.decompositions.module_fast_paths import FAST_PATH_DECOMPOSITIONS
from tpu_inductor.decompositions.nan_extremes import NAN_EXTREME_DECOMPOSITIONS
from tpu_inductor.decompositions.pooling_backward import POOLING_BACKWARD_DECOMPOSITIONS
from tpu_inductor.decompositions.quantize_decompositions import quantize_decompositions
from tpu_inductor.decompositions.stable_sort import STABLE_SORT_DECOMPOSITIONS
from tpu_inductor.analysis.tie_sensitive_ops import keep_unsorted_topk
from tpu_inductor.decompositions.variance import VARIANCE_DECOMPOSITIONS

aten = torch.ops.aten


def _python_remainder(a, b):
    """``remainder`` with the divisor's sign, as eager computes it.

    torch-mlir lowers ``aten.remainder`` to ``stablehlo.remainder``, which
    takes the dividend's sign (C's fmod): ``-7 % 5`` came back ``-2``, not
    ``3``. Eager computes fmod and then shifts results whose sign differs from
    the divisor's; we emit exactly that.
    """
    dtype = torch.result_type(a, b)
    if isinstance(b, torch.Tensor):
        # Promote explicitly: torch-mlir's fmod of an int tensor by a float
        # divisor truncated the divisor to int (5 % -2.5 computed as 5 % -2).
        a, b = a.to(dtype), b.to(dtype)
        r = torch.fmod(a, b)
        # "r and b have nonzero, different signs", in arithmetic: XLA's
        # verifier rejects comparing booleans with each other.
        differs = (torch.sign(r) * torch.sign(b)) < 0
    else:
        # fmod's Scalar overload does not lower; a 0-d divisor is the same
        # computation, and the divisor's sign is known here, in Python.
        r = torch.fmod(a.to(dtype), torch.full((), b, dtype=dtype))
        differs = r > 0 if b < 0 else r < 0
    return torch.where(differs, r + b, r)


def _scalar_as_tensor(tensor_op, scalar_first: bool = False):
    """``x ^ 3`` as ``bitwise_xor(x, tensor(3))``: a Scalar overload as its
    Tensor overload with the number as a 0-d tensor.

    torch-mlir's StableHLO lowering rejects the Scalar overloads of the shift
    and bitwise operators, ``fmod`` and ``copysign`` (it cannot legalize the
    ``torch.constant.int``/``float`` operand; the op then ran in eager after a
    failed lowering and a warning) but lowers their Tensor overloads. The 0-d
    tensor has the dtype eager's promotion gives the pair, so the result's
    dtype is eager's (``int_tensor % 2.5`` is float32).
    """

    def with_tensor(*operands):
        tensor, number = operands[::-1] if scalar_first else operands
        scalar = torch.scalar_tensor(number, dtype=torch.result_type(tensor, number))
        return tensor_op(scalar, tensor) if scalar_first else tensor_op(tensor, scalar)

    return with_tensor


def _copysign_by_tensor(a, sign):
    """``copysign(x, 2)`` through its Tensor overload (as :func:`_scalar_as_tensor`),
    in the float dtype eager computes it in: an int or bool ``x`` gives a float
    result, and torch-mlir cannot take the ``abs`` of a bool."""
    dtype = torch.result_type(a, sign)
    dtype = dtype if dtype.is_floating_point else torch.get_default_dtype()
    return aten.copysign.Tensor(a.to(dtype), torch.scalar_tensor(sign, dtype=dtype))


def _broadcast_shift(tensor_op):
    """Shift operands broadcast to one shape before the shift.

    torch-mlir emits ``stablehlo.shift_left`` on operands of different shapes
    when both need broadcasting (``[5, 1] << [5]``), and MLIR aborts the whole
    process on it (``LLVM ERROR: Failed to infer result type``). Equal shapes
    (or a 0-d amount) lower fine, so only the broadcasting case is rewritten;
    the inner call has equal shapes and is left alone. A 0-d amount is
    expanded too when ``a`` has a symbolic size: torch-mlir broadcasts it
    with a static ``broadcast_in_dim``, which StableHLO's verifier rejects.
    """

    def shift(a, amount):
        symbolic = any(isinstance(size, torch.SymInt) for size in a.shape)
        if a.shape == amount.shape or (amount.dim() == 0 and not symbolic):
            return NotImplemented
        return _on_broadcast_operands(tensor_op, a, amount)

    return shift


def _on_broadcast_operands(op, *operands):
    """``op`` on its tensor operands expanded to their broadcast shape (other operands as they are)."""
    shape = torch.broadcast_shapes(*(t.shape for t in operands if isinstance(t, torch.Tensor)))
    return op(*(t.expand(shape) if isinstance(t, torch.Tensor) else t for t in operands))


def _broadcast_clamp(x, min=None, max=None):
    """``clamp`` with tensor bounds, every operand broadcast to one shape first.

    torch-mlir gives ``stablehlo.clamp`` the input's shape as its result's,
    so where a bound is the larger one (OpInfo's ``clamp_min`` of a
    ``[0, 1, 3]`` tensor by a ``[0, 10, 3]`` one) MLIR aborts ("Failed to
    infer result type"). Equal shapes, or bounds that broadcast to the
    input, lower as they are.
    """
    tensors = [t for t in (x, min, max) if isinstance(t, torch.Tensor)]
    shape = torch.broadcast_shapes(*(t.shape for t in tensors))
    if all(t.shape == shape for t in tensors) or (x.shape == shape and all(t.dim() == 0 for t in tensors[1:])):
        return NotImplemented
    return _on_broadcast_operands(aten.clamp.Tensor, x, min, max)


def _diagonal_indices(x, offset: int, dim1: int, dim2: int):
    """``x`` with ``dim1, dim2`` moved last, and the paired row and column
    indices of its diagonal at ``offset``."""
    dim1, dim2 = dim1 % x.dim(), dim2 % x.dim()
    rows, cols = x.shape[dim1], x.shape[dim2]
    row_start, col_start = max(-offset, 0), max(offset, 0)
    length = max(0, min(rows - row_start, cols - col_start))
    steps = torch.arange(length, device=x.device)
    return x.movedim((dim1, dim2), (-2, -1)), steps + row_start, steps + col_start, (dim1, dim2)


def _diagonal_scatter_by_index_put(x, src, offset: int = 0, dim1: int = 0, dim2: int = 1):
    """``diagonal_scatter`` (the backward of ``diagonal``) as an ``index_put`` at
    the diagonal's paired indices.

    torch-mlir has no StableHLO lowering for it. ``diagonal`` itself is
    PyTorch's decomposition, an ``as_strided`` view of its input, which
    passes/as_strided_as_gather.py turns into a gather; it stays a view until
    then, so an ``as_strided`` of a diagonal (torch-mlir's e2e
    ``AtenAsStridedAfterDiagonalModule``) still reads the input's storage.
    """
    moved, rows, cols, dims = _diagonal_indices(x, offset, dim1, dim2)
    leading = [None] * (moved.dim() - 2)
    return aten.index_put.default(moved, [*leading, rows, cols], src).movedim((-2, -1), dims)


def _integer_reciprocal(x):
    """``reciprocal`` of an integer or bool tensor, computed in the float it returns.

    torch-mlir legalizes only floating-point reciprocals. Eager promotes the
    integer input to the default float dtype first (``1 / 0`` is ``inf``),
    so the float reciprocal of the converted input is eager's value.
    """
    if x.is_floating_point() or x.is_complex():
        return NotImplemented
    return aten.reciprocal.default(x.to(torch.get_default_dtype()))


# Substitution unrolls one step per row: beyond this the graph grows too large.
_MAX_TRIANGULAR_ROWS = 256


def _solve_triangular_by_substitution(a, b, *, upper: bool, left: bool = True, unitriangular: bool = False):
    """``linalg.solve_triangular`` as forward (or back) substitution, one row at a time.

    torch-mlir has no lowering for it, and the chunked gated-delta-rule
    attention (Qwen3-Next, Qwen3.5, OLMo-Hybrid, MiniCPM-V...) solves a
    unit-lower-triangular 64 x 64 system per chunk. Row ``i`` of ``X`` is
    ``(B[i] - A[i, known] @ X[known]) / A[i, i]``: the order LAPACK's
    unblocked ``trsm`` uses, unrolled at trace time into matmuls and
    concatenations that lower. ``X A = B`` is solved as ``A^T X^T = B^T``.
    """
    if not left:
        return _solve_triangular_by_substitution(
            a.mT, b.mT, upper=not upper, left=True, unitriangular=unitriangular
        ).mT
    rows = a.shape[-1]
    if not isinstance(rows, int) or rows > _MAX_TRIANGULAR_ROWS:
        return NotImplemented
    batch = torch.broadcast_shapes(a.shape[:-2], b.shape[:-2])
    a = a.expand(*batch, rows, rows)
    b = b.expand(*batch, rows, b.shape[-1])
    solved = b[..., :0, :]  # the rows found so far, in row order
    for step in range(rows):
        i = rows - 1 - step if upper else step
        known = a[..., i : i + 1, i + 1 :] if upper else a[..., i : i + 1, :i]
        row = b[..., i : i + 1, :] - known @ solved if step else b[..., i : i + 1, :]
        if not unitriangular:
            row = row / a[..., i : i + 1, i : i + 1]
        solved = torch.cat([row, solved] if upper else [solved, row], dim=-2)
    return solved


# A cumulative extreme compares every pair of positions: n^2 elements per row.
_MAX_CUMULATIVE_EXTREME_LENGTH = 2048


def _cumulative_extreme(largest: bool):
    """``cummax`` / ``cummin`` as a masked reduction over every prefix.

    torch-mlir has no lowering for either (Grounding DINO uses both). Value
    ``i`` is the extreme of positions ``j <= i`` (NaN once one is seen, as
    eager); its index is the last such ``j`` holding that value, eager's
    choice among ties. Costs ``n^2`` per row, so long dims stay eager.
    """

    def decomposition(x, dim: int):
        if x.dim() == 0:
            return NotImplemented
        dim = dim % x.dim()
        length = x.shape[dim]
        if not isinstance(length, int) or length > _MAX_CUMULATIVE_EXTREME_LENGTH or x.dtype == torch.bool:
            return NotImplemented
        moved = x.movedim(dim, -1)
        positions = torch.arange(length, device=x.device)
        in_prefix = positions.unsqueeze(0) <= positions.unsqueeze(1)  # [i, j]: j <= i
        if x.is_floating_point():
            neutral = float("-inf") if largest else float("inf")
        else:
            info = torch.iinfo(x.dtype)
            neutral = info.min if largest else info.max
        candidates = torch.where(in_prefix, moved.unsqueeze(-2), neutral)  # [..., i, j]
        values = candidates.amax(-1) if largest else candidates.amin(-1)
        same = moved.unsqueeze(-2) == values.unsqueeze(-1)
        if x.is_floating_point():
            same = same | (moved.unsqueeze(-2).isnan() & values.unsqueeze(-1).isnan())
        indices = torch.where(in_prefix & same, positions, -1).amax(-1)
        return values.movedim(-1, dim), indices.movedim(-1, dim)

    return decomposition


def _unfold_by_gather(x, dimension: int, size: int, step: int):
    """``unfold`` (sliding windows) as an ``index_select`` of window positions.

    torch-mlir cannot convert ``aten.unfold`` to StableHLO, and PyTorch's
    decomposition is an ``as_strided``. Window ``w`` holds elements
    ``w * step + [0, size)`` of ``dimension``; gathering them in window order
    and moving the window elements last gives eager's layout
    ``(..., windows, ..., size)``. A 0-d ``x`` unfolds as one element
    (eager: ``size`` 1 gives ``[x]``, ``size`` 0 an empty ``[0]``).
    """
    if x.dim() == 0:
        return x.reshape(1)[:size] if size in (0, 1) else NotImplemented
    dim = dimension % x.dim()
    windows = (x.shape[dim] - size) // step + 1
    positions = window_positions(windows, step, size, 1, x.device)
    return x.index_select(dim, positions).unflatten(dim, (windows, size)).movedim(dim + 1, -1)


def _batch_norm_eval_as_scale_shift(x, weight, bias, running_mean, running_var, momentum, eps):
    """Eval-mode BatchNorm as one per-channel scale and shift, as eager computes it.

    PyTorch's decomposition normalises the activations in four full-size
    steps, ``(x - mean) * invstd * weight + bias``; eager's CPU kernel folds
    the statistics per channel first (``scale = weight * invstd``, ``shift =
    bias - mean * scale``) and then does ``x * scale + shift``. Two full-size
    ops instead of four: the ResNet-style CNN of benchmarks/perf.py runs
    about 4% faster, and the rounding now follows eager's.
    """
    dtype = torch.promote_types(x.dtype, torch.float32)
    invstd = torch.rsqrt(running_var.to(dtype) + eps)
    scale = invstd if weight is None else invstd * weight.to(dtype)
    shift = -running_mean.to(dtype) * scale
    if bias is not None:
        shift = shift + bias.to(dtype)
    per_channel = (-1,) + (1,) * (x.dim() - 2)
    out = (x.to(dtype) * scale.reshape(per_channel) + shift.reshape(per_channel)).to(x.dtype)
    if x.device.type != "cpu":  # the shapes eager returns differ by device
        return out, running_mean.to(dtype), invstd
    empty = x.new_zeros((0,))
    return out, empty, empty


def _histc_by_scatter_add(x, bins: int = 100, min=0, max=0):
    """``histc`` as a ``scatter_add`` of ones at each element's bin.

    torch-mlir has no lowering for ``histc``, which Mixture-of-Experts layers
    use to count tokens per expert. The bin arithmetic is eager's CPU
    kernel's, in its order: ``(x - lo) * bins / (hi - lo)`` truncated, the
    right edge in the last bin, elements outside ``[lo, hi]`` (and NaN)
    dropped; ``min == max == 0`` means the data's range, and an empty range
    is widened by one on each side.
    """
    x = x.flatten()
    if min == max == 0:
        lo, hi = x.min(), x.max()
    else:
        lo, hi = torch.full((), min, dtype=x.dtype), torch.full((), max, dtype=x.dtype)
    empty_range = lo == hi
    lo, hi = torch.where(empty_range, lo - 1, lo), torch.where(empty_range, hi + 1, hi)
    position = ((x - lo) * bins / (hi - lo)).to(torch.int64)
    position = torch.where(position == bins, bins - 1, position)
    inside = (x >= lo) & (x <= hi)
    position = torch.where(inside, position, 0)
    return torch.zeros(bins, dtype=x.dtype, device=x.device).scatter_add(0, position, inside.to(x.dtype))


# Decompositions of our own: each fixes a wrong lowering or fills a gap.
_OURS: dict = {
    aten.remainder.Tensor: _python_remainder,
    aten.remainder.Scalar: _python_remainder,
    aten.remainder.Scalar_Tensor: _scalar_as_tensor(aten.remainder.Tensor, scalar_first=True),
    aten.__lshift__.Scalar: _scalar_as_tensor(aten.bitwise_left_shift.Tensor),
    aten.__rshift__.Scalar: _scalar_as_tensor(aten.bitwise_right_shift.Tensor),
    aten.bitwise_left_shift.Tensor_Scalar: _scalar_as_tensor(aten.bitwise_left_shift.Tensor),
    aten.bitwise_right_shift.Tensor_Scalar: _scalar_as_tensor(aten.bitwise_right_shift.Tensor),
    aten.bitwise_left_shift.Scalar_Tensor: _scalar_as_tensor(aten.bitwise_left_shift.Tensor, scalar_first=True),
    aten.bitwise_right_shift.Scalar_Tensor: _scalar_as_tensor(aten.bitwise_right_shift.Tensor, scalar_first=True),
    **{
        getattr(aten, op).Scalar: _scalar_as_tensor(getattr(aten, op).Tensor)
        for op in ("bitwise_and", "bitwise_or", "bitwise_xor", "fmod")
    },
    aten.copysign.Scalar: _copysign_by_tensor,
    **{
        getattr(aten, op).Scalar_Tensor: _scalar_as_tensor(getattr(aten, op).Tensor, scalar_first=True)
        for op in ("bitwise_and", "bitwise_or", "bitwise_xor")
    },
    aten.clamp.Tensor: _broadcast_clamp,
    aten.bitwise_left_shift.Tensor: _broadcast_shift(aten.bitwise_left_shift.Tensor),
    aten.bitwise_right_shift.Tensor: _broadcast_shift(aten.bitwise_right_shift.Tensor),
    aten.diagonal.default: pytorch_decomposition(aten.diagonal.default),
    aten.diagonal_scatter.default: _diagonal_scatter_by_index_put,
    aten.unfold.default: _unfold_by_gather,
    aten.reciprocal.default: _integer_reciprocal,
    aten.linalg_solve_triangular.default: _solve_triangular_by_substitution,
    aten.cummax.default: _cumulative_extreme(largest=True),
    aten.cummin.default: _cumulative_extreme(largest=False),
    aten.topk.default: keep_unsorted_topk,
    aten.histc.default: _histc_by_scatter_add,
    aten._native_batch_norm_legit_no_training.default: _batch_norm_eval_as_scale_shift,
}


# Attention ops inference graphs keep whole through tracing, so the padding
# analysis of dynamic shapes sees ``is_causal`` (analysis/padding_safety.py) and
# passes/attention.py builds them from ATen ops, faster than tracing them.
CPU_FLASH_ATTENTION = aten._scaled_dot_product_flash_attention_for_cpu.default
"""``(q, k, v, dropout_p=0.0, is_causal=False, *, attn_mask=None, scale=None)``;
it takes fewer key/value heads than query heads as they are."""

ATTENTION_OPS = frozenset({aten.scaled_dot_product_attention.default, CPU_FLASH_ATTENTION})


def flash_attention_flags(node: "torch.fx.Node") -> tuple[float, bool]:
    """``(dropout_p, is_causal)`` of a :data:`CPU_FLASH_ATTENTION` node, passed
    by position or by keyword."""
    dropout = node.args[3] if len(node.args) > 3 else node.kwargs.get("dropout_p", 0.0)
    is_causal = node.args[4] if len(node.args) > 4 else node.kwargs.get("is_causal", False)
    return dropout, is_causal


def _inductor_prims() -> dict:
    """Inductor's prims that Dynamo itself emits, as plain ATen arithmetic.

    Dynamo's polyfill for ``lerp_`` (every Adam/AdamW step) calls
    ``prims.fma``, which torch-mlir cannot lower: the optimizer step ran in
    eager pieces. ``a * b + c`` rounds the product once more than a fused
    multiply-add (at most 1 ulp); Inductor's own CPU lowering of it does the same.
    """
    from tpu_inductor import torch_api

    torch_api.register_inductor_prims()

    return {torch.ops.prims.fma.default: lambda a, b, c: a * b + c}


LEFT_TO_TORCH_MLIR = (aten.addmm.default, aten.native_layer_norm.default)
"""Float ops torch-mlir's own pipeline decomposes (in C++) on the way to StableHLO.

Decomposing them in Python instead makes AOTAutograd trace every piece
through fake tensors: on perf.py's decoder (14 addmm, 5 layer norms) the
ATen graph went from 245 to 192 nodes and AOTAutograd's capture from 0.247
to 0.211 s. The StableHLO XLA compiles is the same arithmetic. Integer
inputs keep the Python decomposition (torch-mlir's int64 addmm does not
lower), half-precision layer norms too (see :data:`_KEPT_WHOLE_DTYPES`),
and so do the backward ops (torch-mlir does not lower them)."""


_KEPT_WHOLE_DTYPES = {
    aten.addmm.default: frozenset({torch.float32, torch.float64, torch.bfloat16, torch.float16}),
    # torch-mlir's C++ decomposition computes in the input's dtype: a bfloat16
    # layer norm's statistics in bfloat16 came out 2.3x less exact than eager's
    # against float64 (mean error 0.0033 against 0.0015 on [8, 1024]). PyTorch's
    # decomposition computes them in float32 and rounds once, as eager does.
    aten.native_layer_norm.default: frozenset({torch.float32, torch.float64}),
}


def _unless_kept_whole(op: torch._ops.OpOverload, decomposition: Callable) -> Callable:
    """``decomposition``, except for inputs of the dtypes ``op`` stays one op for (NotImplemented)."""
    kept = _KEPT_WHOLE_DTYPES[op]

    def decompose(*args, **kwargs):
        if all(a.dtype in kept for a in args if isinstance(a, torch.Tensor)):
            return NotImplemented
        return decomposition(*args, **kwargs)

    return decompose


def above_autograd_decompositions(keep_embedding_bags: bool = False) -> dict[torch._ops.OperatorBase, Callable]:
    """Ops decomposed before autograd records them, so that their backward is
    that of the ops they become (``torch_api.above_autograd``): a table entry
    for such an op is never consulted, since its C++ composite kernel
    (embedding bags, ``cdist``) or PyTorch's own Python kernel at autograd
    (``multilabel_margin_loss_forward``) runs first.
    ``keep_embedding_bags``: see :func:`decomposition_table`."""
    always = {**DISTANCE_DECOMPOSITIONS, **ABOVE_AUTOGRAD_EXACT_VALUES}
    return always if keep_embedding_bags else {**ABOVE_AUTOGRAD_DECOMPOSITIONS, **always}


def decomposition_table(
    keep_attention: bool = False, keep_embedding_bags: bool = False
) -> dict[torch._ops.OperatorBase, Callable]:
    """The table for this compile: ours over torch-mlir's.

    ``keep_embedding_bags``: leave embedding bags whole, for PyTorch's own
    kernels to run (placement/kernel_choice.py says where and why).
    Grouped matmuls come from libraries imported at any time, so the ops
    registered now are part of the cache key.
    """
    return _table(keep_attention, keep_embedding_bags, tuple(grouped_matmul_decompositions().items()))


@functools.cache
def _table(
    keep_attention: bool, keep_embedding_bags: bool, grouped_matmuls: tuple
) -> dict[torch._ops.OperatorBase, Callable]:
    from torch_mlir.extras.fx_decomp_util import get_decomposition_table

    # Imported here, not at the top: the passes package imports this module
    # (its attention passes read CPU_FLASH_ATTENTION), so importing this
    # module before the package failed on the cycle.
    from tpu_inductor.passes.mask_index_put_as_where import MASK_INDEX_PUT_DECOMPOSITIONS

    table = dict(get_decomposition_table())
    table.update(_OURS)
    table.update(EXACT_VALUE_DECOMPOSITIONS)
    table.update(STABLE_SORT_DECOMPOSITIONS)
    table.update(VARIANCE_DECOMPOSITIONS)
    table.update(NAN_EXTREME_DECOMPOSITIONS)
    table.update(CONVOLUTION_BACKWARD_DECOMPOSITIONS)
    table.update(POOLING_BACKWARD_DECOMPOSITIONS)
    table.update(AVG_POOL_DECOMPOSITIONS)
    table.update(MISSING_LOWERING_DECOMPOSITIONS)
    table.update(LOOKUP_DECOMPOSITIONS)
    table.update(FOREACH_DECOMPOSITIONS)
    table.update(EMBEDDING_BAG_DECOMPOSITIONS)
    table.update(ADAPTIVE_POOL_DECOMPOSITIONS)
    table.update(MASK_INDEX_PUT_DECOMPOSITIONS)
    table.update(FAST_PATH_DECOMPOSITIONS)
    table.update(quantize_decompositions())
    table.update(_inductor_prims())
    table.update(grouped_matmuls)
    for op in LEFT_TO_TORCH_MLIR:
        table[op] = _unless_kept_whole(op, table[op])
    if keep_attention:
        for op in ATTENTION_OPS:
            table.pop(op, None)
    if keep_embedding_bags:
        for op in EMBEDDING_BAG_DECOMPOSITIONS:
            table.pop(op, None)
    # None: a PyTorch decomposition this torch does not have (torch_api.pytorch_decomposition).
    return {op: _kept_whole_where_complex_is_refused(op, d) for op, d in table.items() if d is not None}


REFUSES_COMPLEX = frozenset({aten.nan_to_num.default, aten.bernoulli.default})
"""Ops whose PyTorch decomposition refuses a complex input, kept whole for
one before it is tried: ``nan_to_num`` calls ``isneginf``, which raises (and
FakeTensor logs the refusal as an error on its way out); ``bernoulli``
compares with ``lt``, which traces but has no complex kernel to run."""


def _kept_whole_where_complex_is_refused(op: torch._ops.OperatorBase, decomposition: Callable) -> Callable:
    """``decomposition``, except that where it refuses a complex input the op
    is kept whole, as with no entry: it then runs eagerly (or is rewritten by
    passes/complex_as_real_pairs.py) instead of failing the user's compile.
    Other errors still raise."""

    def has_complex(args: tuple, kwargs: dict) -> bool:
        values = [*args, *kwargs.values()]
        values += [item for value in values if isinstance(value, (list, tuple)) for item in value]
        return any(isinstance(value, torch.Tensor) and value.is_complex() for value in values)

    if op in REFUSES_COMPLEX:

        def decompose(*args, **kwargs):
            return NotImplemented if has_complex(args, kwargs) else decomposition(*args, **kwargs)

    else:

        def decompose(*args, **kwargs):
            try:
                return decomposition(*args, **kwargs)
            except RuntimeError:
                if has_complex(args, kwargs):
                    return NotImplemented
                raise

    return functools.wraps(decomposition)(decompose)
