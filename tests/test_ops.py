"""Op suite: ``torch.compile(backend="tpu")`` against eager on OpInfo samples.

Every op named below is *claimed*: on the first samples PyTorch's OpInfo
database gives for it, nothing falls back to eager (``strict=True`` raises
:class:`UnsupportedOpError` on any fallback, and ``fullgraph=True`` forbids
graph breaks, so nothing runs in Python either), at least one device island
is compiled whenever the op computes anything (``NO_ISLAND`` lists the pure
view ops, which stay in eager by design), and the results match eager within
the tolerances documented in ``TOLERANCES``.

The claim lists were produced by sweeping the whole ``op_db``; ops that do
not lower or do not match are listed, with reasons, in ``ops_not_lowered.md``.
The default run covers ``FAST_*`` (a representative part of every family);
``pytest -m slow tests/test_ops.py`` runs the rest of the claim.
"""

from __future__ import annotations

import contextlib
import functools
from typing import Any, Callable, Iterator

import pytest
import torch

from torch_versions import TORCH
import torch._dynamo
from torch.utils._pytree import tree_flatten, tree_unflatten

from tpu_inductor import report
from tpu_inductor.errors import UnsupportedOpError
from tpu_inductor.process_state import STATE

common_methods_invocations = pytest.importorskip(
    "torch.testing._internal.common_methods_invocations",
    reason="PyTorch's OpInfo database needs the 'expecttest' package (pip install -e .[test])",
)

# eager_kernels off: these claims are about the device's lowering, so no op
# may be routed to PyTorch's kernel for speed (convolutions would be).
OPTIONS = {"strict": True, "cache": False, "eager_kernels": False}

# Tolerances (rtol, atol) by the dtype of each *output* (an int64 sample of
# tanh produces float32, compared as float32).
#  float32: XLA's CPU backend uses its own polynomial approximations for
#    transcendental functions (exp, log, tanh, erf, sin, ...) and may fuse and
#    reassociate reductions, so results differ from ATen's by a few ulp, more
#    after cancellation. torch's float32 default (rtol 1.3e-6, atol 1e-5) flags
#    those few-ulp differences; 1e-4 relative is ~800 ulp, still far below any
#    real lowering bug (wrong op, axis, broadcast or index shows up as O(1)).
#  bfloat16: one bf16 ulp is 2**-8 (~3.9e-3 relative); XLA may round
#    intermediates to bf16 at different points than ATen (which computes most
#    bf16 ops in float32 and rounds once), so allow a few ulp.
#  float16/float64 only appear as explicit casts in samples; torch's defaults.
#  Integers and bool: exact.
TOLERANCES = {
    torch.float32: (1e-4, 1e-5),
    torch.bfloat16: (3e-2, 3e-2),
    torch.float16: (1e-3, 1e-5),
    torch.float64: (1e-7, 1e-7),
}

SAMPLES_PER_OP = 2


def op_id(op) -> str:
    """``name`` or ``name.variant``: the OpInfo entry the claim lists speak in."""
    return f"{op.name}.{op.variant_test_name}" if op.variant_test_name else op.name


@functools.cache
def opinfos() -> dict[str, Any]:
    return {op_id(op): op for op in common_methods_invocations.op_db}


def _tensor_leaves(sample) -> list[torch.Tensor]:
    leaves, _ = tree_flatten((sample.input, sample.args, sample.kwargs))
    return [leaf for leaf in leaves if isinstance(leaf, torch.Tensor)]


def _usable(sample) -> bool:
    """Dense, non-complex tensors only (the device has no sparse or complex dtypes),
    and not only 0-d ones: scalar-only arithmetic runs eagerly by design (a PJRT
    call costs more than it saves), so such a sample would test nothing here."""
    tensors = _tensor_leaves(sample)
    for t in tensors:
        if t.layout != torch.strided or t.is_complex() or t.is_quantized:
            return False
    return not tensors or any(t.dim() > 0 for t in tensors)


def _clone(tree: Any) -> Any:
    leaves, spec = tree_flatten(tree)
    return tree_unflatten([l.clone() if isinstance(l, torch.Tensor) else l for l in leaves], spec)


def _eager(op, sample) -> Any:
    inp, args, kwargs = _clone((sample.input, sample.args, sample.kwargs))
    return op(inp, *args, **kwargs)


def _call(op, *args, **kwargs):
    return op(*args, **kwargs)


@contextlib.contextmanager
def plain_opinfo_calls() -> Iterator[None]:
    """OpInfo wraps some deterministic ops (scaled_dot_product_attention,
    multi_head_attention_forward, ``item``) in ``wrapper_set_seed``, which
    Dynamo cannot trace (it saves and restores the RNG state). Call them plainly;
    genuinely random ops are never claimed, so no seed is needed."""
    cmi = common_methods_invocations
    saved = cmi.wrapper_set_seed
    cmi.wrapper_set_seed = _call
    try:
        yield
    finally:
        cmi.wrapper_set_seed = saved


def samples(op, dtype: torch.dtype, count: int = SAMPLES_PER_OP) -> Iterator[Any]:
    """The first ``count`` usable OpInfo samples that eager itself accepts."""
    torch.manual_seed(0)
    found = []
    with plain_opinfo_calls():
        for sample in op.sample_inputs("cpu", dtype, requires_grad=False):
            if len(found) >= count:
                break
            if not _usable(sample):
                continue
            try:
                _eager(op, sample)
            except Exception:
                continue
            found.append(sample)
    return iter(found)


def as_function(op, sample) -> tuple[Callable[..., Any], list[torch.Tensor]]:
    """``fn(*tensors)`` computing ``op`` on ``sample``; tensors become graph inputs,
    everything else (ints, dims, dtypes, floats) is a constant of the graph."""
    leaves, spec = tree_flatten((sample.input, sample.args, sample.kwargs))
    is_tensor = [isinstance(leaf, torch.Tensor) for leaf in leaves]
    constants = [None if t else leaf for t, leaf in zip(is_tensor, leaves)]
    tensors = [leaf for t, leaf in zip(is_tensor, leaves) if t]

    def fn(*ts):
        it = iter(ts)
        full = [next(it) if t else c for t, c in zip(is_tensor, constants)]
        inp, args, kwargs = tree_unflatten(full, spec)
        return op(inp, *args, **kwargs)

    return fn, tensors


def compile_and_compare(op, sample, dtype: torch.dtype) -> report.Report:
    """Assert the compiled ``op`` matches eager on ``sample``; return the report."""
    fn, tensors = as_function(op, sample)
    compiled = torch.compile(fn, backend="tpu", options=OPTIONS, dynamic=False, fullgraph=True)
    with plain_opinfo_calls():
        expected = fn(*[t.clone() for t in tensors])
        record = report.reset()
        actual = compiled(*[t.clone() for t in tensors])
    assert_matches(actual, expected)
    return record


def assert_matches(actual: Any, expected: Any) -> None:
    """Same structure, dtypes and shapes; values within the output dtype's tolerance."""
    got, got_spec = tree_flatten(actual)
    want, want_spec = tree_flatten(expected)
    assert got_spec == want_spec, f"output structure {got_spec} != eager's {want_spec}"
    for index, (a, e) in enumerate(zip(got, want)):
        dtype = e.dtype if isinstance(e, torch.Tensor) else torch.float32
        exact = not (dtype.is_floating_point and isinstance(e, (torch.Tensor, float)))
        # Float dtypes without a tolerance of ours (float16, float8) get torch's defaults.
        rtol, atol = (0.0, 0.0) if exact else TOLERANCES.get(dtype, (None, None))
        torch.testing.assert_close(
            a, e, rtol=rtol, atol=atol, equal_nan=True, msg=lambda m: f"output {index}: {m}"
        )


def has_compute(record: report.Report) -> bool:
    return any(island.num_nodes > 0 for island in record.islands())


# The claim ------------------------------------------------------------------
# Every OpInfo entry (``name`` or ``name.variant``) below passed a sweep of the
# whole op_db on its first SAMPLES_PER_OP usable samples; see
# ops_not_lowered.md for the rest. Random ops (dropout, bernoulli, ...) and ops
# whose output is uninitialized memory are never claimed.

FLOAT32_OPS = (
    # aten.diagonal lowers as an as_strided view made a gather (passes/as_strided_as_gather.py).
    'diag', 'diagonal', 'diagonal_copy', 'linalg.diagonal', 'trace',
    # aten.unfold lowers through our index_select decomposition.
    'unfold', 'unfold_copy',
    # cumulative extremes are masked prefix reductions (decompositions/table.py).
    'cummax', 'cummin',
    # triangular solves unroll into substitution steps (decompositions/table.py).
    'linalg.solve_triangular',
    'H', 'T', '__getitem__', '__radd__', '__rdiv__', '__rmatmul__', '__rmul__', '__rpow__',
    '__rsub__', '_chunk_cat', '_native_batch_norm_legit', '_softmax_backward_data',
    '_unsafe_masked_index', '_unsafe_masked_index_put_accumulate', 'abs', 'acos', 'acosh',
    'add', 'addbmm', 'addcdiv', 'addcmul', 'addmm', 'addmm.decomposed', 'addr', 'alias_copy',
    'all', 'amax', 'amin', 'aminmax', 'any', 'arange', 'argmax', 'argmin', 'argsort', 'asin',
    'asinh', 'atan', 'atan2', 'atanh', 'atleast_1d', 'atleast_2d', 'atleast_3d', 'baddbmm',
    'bfloat16', 'bmm', 'bmm.triton_optimized', 'bool', 'broadcast_shapes', 'broadcast_tensors',
    'broadcast_to', 'bucketize', 'byte', 'cartesian_prod', 'cat', 'ceil', 'char', 'chunk',
    'clamp', 'clone', 'column_stack', 'conj', 'conj_physical', 'constant_pad_nd', 'contiguous',
    'copysign', 'cos', 'cosh', 'count_nonzero', 'cumsum', 'cumulative_trapezoid', 'deg2rad',
    'diag_embed', 'diagflat', 'diff', 'div.floor_rounding', 'div.no_rounding_mode',
    'div.trunc_rounding', 'dot', 'double', 'dsplit', 'dstack', 'einsum', 'eq', 'erf', 'exp',
    'exp2', 'expand', 'expand_as', 'expand_copy', 'expm1', 'eye', 'fft.fftshift',
    'fft.ifftshift', 'fill', 'flatten', 'flip', 'fliplr', 'flipud', 'float', 'float_power',
    'floor', 'floor_divide', 'fmod', 'frac', 'full', 'full_like', 'gather', 'ge', 'gradient',
    'grid_sampler_2d', 'gt', 'half', 'heaviside', 'hsplit', 'hstack', 'index_add', 'index_copy',
    'index_fill', 'index_select', 'inner', 'int', 'isclose', 'isfinite', 'isinf', 'isnan',
    'isneginf', 'isposinf', 'isreal', 'kron', 'ldexp', 'le', 'lerp', 'linalg.matrix_norm',
    'linalg.matrix_power', 'linalg.multi_dot', 'linalg.norm',
    'linalg.norm.subgradients_at_zero', 'linalg.vecdot', 'linalg.vector_norm', 'linspace',
    'linspace.tensor_overload', 'log', 'log10', 'log1p', 'log2', 'log_softmax',
    'log_softmax.with_dtype', 'logaddexp', 'logaddexp2', 'logical_and', 'logical_not',
    'logical_or', 'logical_xor', 'logit', 'logspace', 'logspace.tensor_overload', 'logsumexp',
    'long', 'lt', 'mH', 'mT', 'masked.amax', 'masked.amin', 'masked.argmax', 'masked.argmin',
    'masked.cumsum', 'masked.log_softmax', 'masked.logaddexp', 'masked.logsumexp',
    'masked.mean', 'masked.norm', 'masked.normalize', 'masked.prod', 'masked.softmax',
    'masked.softmin', 'masked.std', 'masked.sum', 'masked.var', 'masked_fill', 'masked_scatter',
    'matmul', 'max.binary', 'max.reduction_no_dim', 'max.reduction_with_dim', 'maximum', 'mean',
    'meshgrid.list_of_tensors', 'meshgrid.variadic_tensors', 'min.binary',
    'min.reduction_no_dim', 'min.reduction_with_dim', 'minimum', 'mm', 'movedim', 'msort',
    'mul', 'mv', 'nan_to_num', 'nanmean', 'nanquantile', 'nansum', 'narrow',
    'native_batch_norm', 'native_dropout_backward', 'native_layer_norm', 'ne', 'neg',
    'nn.functional.adaptive_avg_pool2d', 'nn.functional.adaptive_max_pool1d',
    'nn.functional.adaptive_max_pool2d', 'nn.functional.avg_pool1d', 'nn.functional.batch_norm',
    'nn.functional.binary_cross_entropy', 'nn.functional.binary_cross_entropy_with_logits',
    'nn.functional.celu', 'nn.functional.channel_shuffle', 'nn.functional.conv1d',
    'nn.functional.conv2d', 'nn.functional.conv3d', 'nn.functional.conv_transpose1d',
    'nn.functional.conv_transpose2d', 'nn.functional.conv_transpose3d',
    'nn.functional.cosine_embedding_loss', 'nn.functional.cosine_similarity',
    'nn.functional.cross_entropy', 'nn.functional.elu', 'nn.functional.embedding',
    'nn.functional.gelu', 'nn.functional.glu', 'nn.functional.grid_sample',
    'nn.functional.hardshrink', 'nn.functional.hardsigmoid', 'nn.functional.hardswish',
    'nn.functional.hardtanh', 'nn.functional.hinge_embedding_loss', 'nn.functional.huber_loss',
    'nn.functional.instance_norm', 'nn.functional.interpolate.area',
    'nn.functional.interpolate.bicubic', 'nn.functional.interpolate.bilinear',
    'nn.functional.interpolate.linear', 'nn.functional.interpolate.nearest',
    'nn.functional.interpolate.nearest-exact', 'nn.functional.interpolate.trilinear',
    'nn.functional.kl_div', 'nn.functional.l1_loss', 'nn.functional.layer_norm',
    'nn.functional.leaky_relu', 'nn.functional.linear', 'nn.functional.linear_cross_entropy',
    'nn.functional.local_response_norm', 'nn.functional.logsigmoid',
    'nn.functional.margin_ranking_loss', 'nn.functional.max_pool1d',
    'nn.functional.max_unpool1d', 'nn.functional.max_unpool1d.grad',
    'nn.functional.max_unpool2d', 'nn.functional.max_unpool2d.grad',
    'nn.functional.max_unpool3d', 'nn.functional.max_unpool3d.grad', 'nn.functional.mish',
    'nn.functional.mse_loss', 'nn.functional.multi_margin_loss',
    'nn.functional.multilabel_margin_loss', 'nn.functional.multilabel_soft_margin_loss',
    'nn.functional.nll_loss', 'nn.functional.normalize', 'nn.functional.pad.circular',
    'nn.functional.pad.constant', 'nn.functional.pad.reflect', 'nn.functional.pad.replicate',
    'nn.functional.pad.replicate_negative', 'nn.functional.pairwise_distance',
    'nn.functional.pixel_shuffle', 'nn.functional.pixel_unshuffle',
    'nn.functional.poisson_nll_loss', 'nn.functional.prelu', 'nn.functional.relu',
    'nn.functional.relu6', 'nn.functional.rms_norm',
    'nn.functional.scaled_dot_product_attention', 'nn.functional.selu', 'nn.functional.silu',
    'nn.functional.smooth_l1_loss', 'nn.functional.soft_margin_loss', 'nn.functional.softmin',
    'nn.functional.softmin.with_dtype', 'nn.functional.softplus', 'nn.functional.softshrink',
    'nn.functional.softsign', 'nn.functional.tanhshrink', 'nn.functional.threshold',
    'nn.functional.triplet_margin_loss', 'nn.functional.triplet_margin_with_distance_loss',
    'nn.functional.upsample_bilinear', 'nn.functional.upsample_nearest', 'norm', 'norm.fro',
    'norm.inf', 'ones', 'ones_like', 'outer', 'permute', 'positive', 'pow', 'prod', 'quantile',
    'rad2deg', 'ravel', 'real', 'reciprocal', 'renorm', 'repeat', 'repeat_interleave',
    'reshape', 'reshape_as', 'resolve_conj', 'resolve_neg', 'rot90', 'round',
    'round.decimals_0', 'round.decimals_3', 'round.decimals_neg_3', 'rsqrt', 'rsub',
    'scalar_tensor', 'scatter_add', 'select', 'select_scatter', 'sgn', 'short', 'sigmoid',
    'sign', 'signbit', 'sin', 'sinc', 'sinh', 'slice', 'slice_scatter', 'softmax',
    'softmax.with_dtype', 'sort', 'special.entr', 'special.ndtr', 'special.xlog1py', 'split',
    'split.list_args', 'split_with_sizes', 'split_with_sizes_copy', 'sqrt', 'square', 'squeeze',
    'squeeze.multiple', 'squeeze_copy', 'stack', 'std', 'std.unbiased', 'std_mean',
    'std_mean.unbiased', 'sub', 'sum', 'sum_to_size', 't', 't_copy', 'tan', 'tanh', 'tensordot',
    'tile', 'to', 'torch.ops.aten._safe_softmax.default', 'transpose', 'transpose_copy',
    'trapezoid', 'trapz', 'tril', 'triu', 'true_divide', 'trunc', 'unbind', 'unflatten',
    'unsafe_chunk', 'unsafe_split', 'unsqueeze', 'unsqueeze_copy', 'var', 'var.unbiased',
    'var_mean', 'var_mean.unbiased', 'vdot', 'view', 'view_as', 'vsplit', 'vstack', 'where',
    'xlogy', 'zero_', 'zeros', 'zeros_like',
)

INT64_OPS = (
    # aten.diagonal lowers as an as_strided view made a gather (passes/as_strided_as_gather.py).
    'diag', 'diagonal', 'diagonal_copy', 'linalg.diagonal', 'trace',
    # aten.unfold lowers through our index_select decomposition.
    'unfold', 'unfold_copy',
    # cumulative extremes are masked prefix reductions (decompositions/table.py).
    'cummax', 'cummin',
    # integer reciprocal is computed in the default float (decompositions/table.py).
    'reciprocal', '__rdiv__',
    'H', 'T', '__getitem__', '__radd__', '__rand__', '__rmatmul__', '__rmul__', '__ror__',
    '__rpow__', '__rsub__', '__rxor__', '_chunk_cat', '_unsafe_masked_index',
    '_unsafe_masked_index_put_accumulate', 'abs', 'acos', 'acosh', 'add', 'addcmul', 'addmm',
    'addmm.decomposed', 'addr', 'alias_copy', 'all', 'amax', 'amin', 'aminmax', 'any', 'arange',
    'argmax', 'argmin', 'argsort', 'asin', 'asinh', 'atan', 'atan2', 'atanh', 'atleast_1d',
    'atleast_2d', 'atleast_3d', 'baddbmm', 'bfloat16', 'bitwise_and', 'bitwise_not',
    'bitwise_or', 'bitwise_xor', 'bmm', 'bool', 'broadcast_tensors', 'broadcast_to',
    'bucketize', 'byte', 'cartesian_prod', 'cat', 'ceil', 'char', 'chunk', 'clamp', 'clone',
    'column_stack', 'conj', 'conj_physical', 'constant_pad_nd', 'contiguous', 'copysign', 'cos',
    'cosh', 'count_nonzero', 'cumsum', 'cumulative_trapezoid', 'deg2rad', 'diag_embed',
    'diagflat', 'diff', 'div.floor_rounding', 'div.no_rounding_mode', 'div.trunc_rounding',
    'dot', 'double', 'dsplit', 'dstack', 'einsum', 'eq', 'exp', 'exp2', 'expand', 'expand_as',
    'expand_copy', 'expm1', 'eye', 'fft.fftshift', 'fft.ifftshift', 'fill', 'flatten', 'flip',
    'fliplr', 'flipud', 'float', 'float_power', 'floor', 'floor_divide', 'fmod', 'full',
    'full_like', 'gather', 'ge', 'gradient', 'gt', 'half', 'heaviside', 'hsplit', 'hstack',
    'index_add', 'index_copy', 'index_fill', 'index_select', 'inner', 'int', 'isclose',
    'isfinite', 'isinf', 'isnan', 'isneginf', 'isposinf', 'isreal', 'item', 'kron', 'ldexp',
    'le', 'linalg.multi_dot', 'linspace', 'linspace.tensor_overload', 'log', 'log10', 'log1p',
    'log2', 'log_softmax.with_dtype', 'logical_and', 'logical_not', 'logical_or', 'logical_xor',
    'logit', 'logspace', 'logspace.tensor_overload', 'logsumexp', 'long', 'lt', 'mH', 'mT',
    'masked.amax', 'masked.amin', 'masked.argmax', 'masked.argmin', 'masked.cumsum',
    'masked.logsumexp', 'masked.prod', 'masked.std', 'masked.sum', 'masked.var', 'masked_fill',
    'masked_scatter', 'matmul', 'max.binary', 'max.reduction_no_dim', 'max.reduction_with_dim',
    'maximum', 'meshgrid.list_of_tensors', 'meshgrid.variadic_tensors', 'min.binary',
    'min.reduction_no_dim', 'min.reduction_with_dim', 'minimum', 'mm', 'movedim', 'msort',
    'mul', 'mv', 'nan_to_num', 'nansum', 'narrow', 'native_dropout_backward', 'ne', 'neg',
    'nn.functional.avg_pool1d', 'nn.functional.channel_shuffle', 'nn.functional.conv1d',
    'nn.functional.conv2d', 'nn.functional.conv3d', 'nn.functional.conv_transpose1d',
    'nn.functional.conv_transpose2d', 'nn.functional.conv_transpose3d',
    'nn.functional.cosine_embedding_loss', 'nn.functional.hardtanh', 'nn.functional.linear',
    'nn.functional.local_response_norm', 'nn.functional.margin_ranking_loss',
    'nn.functional.pad.circular', 'nn.functional.pad.constant', 'nn.functional.pad.reflect',
    'nn.functional.pad.replicate', 'nn.functional.pad.replicate_negative',
    'nn.functional.pairwise_distance', 'nn.functional.pixel_shuffle',
    'nn.functional.pixel_unshuffle', 'nn.functional.poisson_nll_loss', 'nn.functional.relu',
    'nn.functional.relu6', 'nn.functional.softmin.with_dtype', 'nn.functional.softsign',
    'nn.functional.tanhshrink', 'nn.functional.threshold', 'nn.functional.triplet_margin_loss',
    'nn.functional.triplet_margin_with_distance_loss', 'ones', 'ones_like', 'outer', 'permute',
    'positive', 'pow', 'prod', 'rad2deg', 'ravel', 'real', 'repeat', 'repeat_interleave',
    'reshape', 'reshape_as', 'resolve_conj', 'resolve_neg', 'rot90', 'round', 'rsqrt', 'rsub',
    'scalar_tensor', 'scatter_add', 'select', 'select_scatter', 'sgn', 'short', 'sigmoid',
    'sign', 'signbit', 'sin', 'sinc', 'sinh', 'slice', 'slice_scatter', 'softmax.with_dtype',
    'sort', 'special.entr', 'special.ndtr', 'special.xlog1py', 'split', 'split.list_args',
    'split_with_sizes', 'split_with_sizes_copy', 'sqrt', 'square', 'squeeze',
    'squeeze.multiple', 'squeeze_copy', 'stack', 'sub', 'sum', 'sum_to_size', 't', 't_copy',
    'tan', 'tanh', 'tensordot', 'tile', 'to', 'torch.ops.aten._safe_softmax.default',
    'transpose', 'transpose_copy', 'trapezoid', 'trapz', 'tril', 'tril_indices', 'triu',
    'triu_indices', 'true_divide', 'trunc', 'unbind', 'unflatten', 'unsafe_chunk',
    'unsafe_split', 'unsqueeze', 'unsqueeze_copy', 'vdot', 'view', 'view_as', 'vsplit',
    'vstack', 'where', 'xlogy', 'zero_', 'zeros', 'zeros_like',
)

BFLOAT16_OPS = (
    # aten.diagonal lowers as an as_strided view made a gather (passes/as_strided_as_gather.py).
    'diag', 'diagonal', 'diagonal_copy', 'linalg.diagonal', 'trace',
    # aten.unfold lowers through our index_select decomposition.
    'unfold', 'unfold_copy',
    # cumulative extremes are masked prefix reductions (decompositions/table.py).
    'cummax', 'cummin',
    'H', 'T', '__getitem__', '__radd__', '__rdiv__', '__rmatmul__', '__rmul__', '__rpow__',
    '__rsub__', '_chunk_cat', '_native_batch_norm_legit', '_softmax_backward_data',
    '_unsafe_masked_index', '_unsafe_masked_index_put_accumulate', 'abs', 'acos', 'acosh',
    'add', 'addcdiv', 'addcmul', 'addmm', 'addmm.decomposed', 'addr', 'alias_copy', 'all',
    'amax', 'amin', 'aminmax', 'any', 'arange', 'argmax', 'argmin', 'argsort', 'asin', 'asinh',
    'atan', 'atan2', 'atanh', 'atleast_1d', 'atleast_2d', 'atleast_3d', 'baddbmm', 'bfloat16',
    'bmm', 'bmm.triton_optimized', 'bool', 'broadcast_tensors', 'broadcast_to', 'bucketize',
    'byte', 'cartesian_prod', 'cat', 'ceil', 'char', 'chunk', 'clamp', 'clone', 'column_stack',
    'conj', 'conj_physical', 'constant_pad_nd', 'contiguous', 'copysign', 'cos', 'cosh',
    'count_nonzero', 'cumsum', 'cumulative_trapezoid', 'deg2rad', 'diag_embed', 'diagflat',
    'diff', 'div.floor_rounding', 'div.no_rounding_mode', 'div.trunc_rounding', 'dot', 'double',
    'dsplit', 'dstack', 'einsum', 'eq', 'erf', 'exp', 'exp2', 'expand', 'expand_as',
    'expand_copy', 'expm1', 'eye', 'fft.fftshift', 'fft.ifftshift', 'fill', 'flatten', 'flip',
    'fliplr', 'flipud', 'float', 'float_power', 'floor', 'floor_divide', 'fmod', 'frac', 'full',
    'full_like', 'gather', 'ge', 'gradient', 'gt', 'half', 'heaviside', 'hsplit', 'hstack',
    'index_add', 'index_copy', 'index_fill', 'index_select', 'inner', 'int', 'isclose',
    'isfinite', 'isinf', 'isnan', 'isneginf', 'isposinf', 'isreal', 'kron', 'ldexp', 'le',
    'lerp', 'linalg.matrix_norm', 'linalg.multi_dot', 'linalg.norm',
    'linalg.norm.subgradients_at_zero', 'linalg.vecdot', 'linalg.vector_norm', 'linspace',
    'linspace.tensor_overload', 'log', 'log10', 'log1p', 'log2', 'log_softmax',
    'log_softmax.with_dtype', 'logaddexp', 'logaddexp2', 'logical_and', 'logical_not',
    'logical_or', 'logical_xor', 'logit', 'logspace', 'logspace.tensor_overload', 'logsumexp',
    'long', 'lt', 'mH', 'mT', 'masked.amax', 'masked.amin', 'masked.argmax', 'masked.argmin',
    'masked.cumsum', 'masked.log_softmax', 'masked.logaddexp', 'masked.logsumexp',
    'masked.mean', 'masked.norm', 'masked.normalize', 'masked.prod', 'masked.softmax',
    'masked.softmin', 'masked.std', 'masked.sum', 'masked.var', 'masked_fill', 'masked_scatter',
    'matmul', 'max.binary', 'max.reduction_no_dim', 'max.reduction_with_dim', 'maximum', 'mean',
    'meshgrid.list_of_tensors', 'meshgrid.variadic_tensors', 'min.binary',
    'min.reduction_no_dim', 'min.reduction_with_dim', 'minimum', 'mm', 'movedim', 'msort',
    'mul', 'mv', 'nan_to_num', 'nanmean', 'nansum', 'narrow', 'native_batch_norm',
    'native_dropout_backward', 'native_layer_norm', 'ne', 'neg',
    'nn.functional.adaptive_avg_pool2d', 'nn.functional.adaptive_max_pool1d',
    'nn.functional.adaptive_max_pool2d', 'nn.functional.avg_pool1d', 'nn.functional.batch_norm',
    'nn.functional.binary_cross_entropy', 'nn.functional.binary_cross_entropy_with_logits',
    'nn.functional.celu', 'nn.functional.channel_shuffle', 'nn.functional.conv1d',
    'nn.functional.conv2d', 'nn.functional.conv3d', 'nn.functional.conv_transpose1d',
    'nn.functional.conv_transpose2d', 'nn.functional.conv_transpose3d',
    'nn.functional.cosine_embedding_loss', 'nn.functional.cosine_similarity',
    'nn.functional.cross_entropy', 'nn.functional.elu', 'nn.functional.embedding',
    'nn.functional.gelu', 'nn.functional.glu', 'nn.functional.grid_sample',
    'nn.functional.hardshrink', 'nn.functional.hardsigmoid', 'nn.functional.hardswish',
    'nn.functional.hardtanh', 'nn.functional.hinge_embedding_loss', 'nn.functional.huber_loss',
    'nn.functional.instance_norm', 'nn.functional.interpolate.area',
    'nn.functional.interpolate.bicubic', 'nn.functional.interpolate.bilinear',
    'nn.functional.interpolate.linear', 'nn.functional.interpolate.nearest',
    'nn.functional.interpolate.nearest-exact', 'nn.functional.interpolate.trilinear',
    'nn.functional.kl_div', 'nn.functional.l1_loss', 'nn.functional.layer_norm',
    'nn.functional.leaky_relu', 'nn.functional.linear', 'nn.functional.linear_cross_entropy',
    'nn.functional.local_response_norm', 'nn.functional.logsigmoid',
    'nn.functional.margin_ranking_loss', 'nn.functional.max_pool1d',
    'nn.functional.max_unpool1d', 'nn.functional.max_unpool1d.grad',
    'nn.functional.max_unpool2d', 'nn.functional.max_unpool2d.grad',
    'nn.functional.max_unpool3d', 'nn.functional.max_unpool3d.grad', 'nn.functional.mish',
    'nn.functional.mse_loss', 'nn.functional.multilabel_soft_margin_loss',
    'nn.functional.nll_loss', 'nn.functional.normalize', 'nn.functional.pad.circular',
    'nn.functional.pad.constant', 'nn.functional.pad.reflect', 'nn.functional.pad.replicate',
    'nn.functional.pad.replicate_negative', 'nn.functional.pairwise_distance',
    'nn.functional.pixel_shuffle', 'nn.functional.pixel_unshuffle',
    'nn.functional.poisson_nll_loss', 'nn.functional.prelu', 'nn.functional.relu',
    'nn.functional.relu6', 'nn.functional.rms_norm',
    'nn.functional.scaled_dot_product_attention', 'nn.functional.selu', 'nn.functional.silu',
    'nn.functional.smooth_l1_loss', 'nn.functional.soft_margin_loss', 'nn.functional.softmin',
    'nn.functional.softmin.with_dtype', 'nn.functional.softplus', 'nn.functional.softshrink',
    'nn.functional.softsign', 'nn.functional.tanhshrink', 'nn.functional.threshold',
    'nn.functional.triplet_margin_loss', 'nn.functional.triplet_margin_with_distance_loss',
    'nn.functional.upsample_bilinear', 'nn.functional.upsample_nearest', 'norm', 'norm.fro',
    'norm.inf', 'ones', 'ones_like', 'outer', 'permute', 'positive', 'pow', 'prod', 'rad2deg',
    'ravel', 'real', 'reciprocal', 'renorm', 'repeat', 'repeat_interleave', 'reshape',
    'reshape_as', 'resolve_conj', 'resolve_neg', 'rot90', 'round', 'round.decimals_0',
    'round.decimals_3', 'round.decimals_neg_3', 'rsqrt', 'rsub', 'scalar_tensor', 'scatter_add',
    'select', 'select_scatter', 'sgn', 'short', 'sigmoid', 'sign', 'signbit', 'sin', 'sinc',
    'sinh', 'slice', 'slice_scatter', 'softmax', 'softmax.with_dtype', 'sort', 'special.entr',
    'special.ndtr', 'special.xlog1py', 'split', 'split.list_args', 'split_with_sizes',
    'split_with_sizes_copy', 'sqrt', 'square', 'squeeze', 'squeeze.multiple', 'squeeze_copy',
    'stack', 'std', 'std.unbiased', 'std_mean', 'std_mean.unbiased', 'sub', 'sum',
    'sum_to_size', 't', 't_copy', 'tan', 'tanh', 'tensordot', 'tile', 'to',
    'torch.ops.aten._safe_softmax.default', 'transpose', 'transpose_copy', 'trapezoid', 'trapz',
    'tril', 'triu', 'true_divide', 'trunc', 'unbind', 'unflatten', 'unsafe_chunk',
    'unsafe_split', 'unsqueeze', 'unsqueeze_copy', 'var', 'var.unbiased', 'var_mean',
    'var_mean.unbiased', 'vdot', 'view', 'view_as', 'vsplit', 'vstack', 'where', 'xlogy',
    'zero_', 'zeros', 'zeros_like',
)

# Ops whose ATen graph holds only views, copies of views (``clone``,
# ``contiguous``, ``*_copy``, pixel_shuffle) or 0-d scalars: the partitioner
# keeps those in eager by design (no PJRT call is worth it), so no island is
# expected; the strict run still proves nothing else fell back.
NO_ISLAND = frozenset(
    {
        'H', 'T', 'alias_copy', 'atleast_1d', 'atleast_2d', 'atleast_3d', 'broadcast_shapes',
        'broadcast_tensors', 'broadcast_to', 'clone', 'conj', 'conj_physical', 'contiguous',
        'dsplit', 'expand', 'expand_as', 'expand_copy', 'flatten', 'hsplit', 'item', 'mH', 'mT',
        'meshgrid.list_of_tensors', 'meshgrid.variadic_tensors', 'movedim', 'narrow',
        'nn.functional.channel_shuffle', 'nn.functional.pixel_shuffle',
        'nn.functional.pixel_unshuffle', 'permute', 'positive', 'ravel', 'real',
        'repeat_interleave', 'reshape', 'reshape_as', 'resolve_conj', 'resolve_neg',
        'scalar_tensor', 'select', 'slice', 't', 't_copy', 'transpose', 'transpose_copy',
        'unflatten', 'unsqueeze', 'unsqueeze_copy', 'view', 'view_as', 'vsplit',
    }
)
# The same, for one dtype (a cast to the dtype the input already has, integer
# nan_to_num) or one sample index (basic slicing, a one-tensor cartesian_prod).
NO_ISLAND_FOR = {
    ("float", torch.float32): "all",
    ("long", torch.int64): "all",
    ("bfloat16", torch.bfloat16): "all",
    ("nan_to_num", torch.int64): "all",
    ("__getitem__"): {1},
    ("cartesian_prod"): {0},
}

# The default run: a representative part of every family (elementwise, binary,
# reductions, matmul, convolution, pooling, normalization, losses, indexing,
# scatter/gather, shape and creation ops, attention). The rest is marked slow.
FAST_FLOAT32 = frozenset(
    {
        "__getitem__", "_softmax_backward_data", "abs", "acos", "acosh", "add", "addbmm",
        "addcdiv", "addcmul", "addmm", "all", "amax", "amin", "aminmax", "any", "arange",
        "argmax", "argmin", "argsort", "asin", "atan", "atan2", "baddbmm", "bmm", "bool",
        "bucketize", "cartesian_prod", "cat", "ceil", "chunk", "clamp", "clone",
        "constant_pad_nd", "cos", "cosh", "count_nonzero", "cumsum", "diff",
        "div.floor_rounding", "div.no_rounding_mode", "dot", "einsum", "eq", "erf", "exp",
        "exp2", "expand", "expm1", "eye", "fill", "flatten", "flip", "floor",
        "floor_divide", "fmod", "frac", "full", "full_like", "gather", "ge", "gt", "hstack",
        "index_add", "index_copy", "index_fill", "index_select", "isclose", "isinf",
        "isnan", "kron", "le", "lerp", "linalg.norm", "linalg.vector_norm", "linspace",
        "log", "log1p", "log2", "log_softmax", "logaddexp", "logical_and", "logical_not",
        "logit", "logsumexp", "lt", "masked.softmax", "masked.sum", "masked_fill",
        "masked_scatter", "matmul", "max.binary", "max.reduction_with_dim", "maximum",
        "mean", "min.reduction_with_dim", "minimum", "mm", "mul", "mv", "nan_to_num",
        "nansum", "native_batch_norm", "native_layer_norm", "ne", "neg",
        "nn.functional.adaptive_avg_pool2d", "nn.functional.avg_pool1d",
        "nn.functional.batch_norm", "nn.functional.binary_cross_entropy",
        "nn.functional.binary_cross_entropy_with_logits", "nn.functional.conv1d",
        "nn.functional.conv2d", "nn.functional.conv_transpose2d",
        "nn.functional.cosine_similarity", "nn.functional.cross_entropy",
        "nn.functional.elu", "nn.functional.embedding", "nn.functional.gelu",
        "nn.functional.glu", "nn.functional.hardsigmoid", "nn.functional.hardswish",
        "nn.functional.hardtanh", "nn.functional.instance_norm",
        "nn.functional.interpolate.bilinear", "nn.functional.interpolate.nearest",
        "nn.functional.kl_div", "nn.functional.l1_loss", "nn.functional.layer_norm",
        "nn.functional.leaky_relu", "nn.functional.linear", "nn.functional.logsigmoid",
        "nn.functional.max_pool1d", "nn.functional.mish", "nn.functional.mse_loss",
        "nn.functional.nll_loss", "nn.functional.normalize", "nn.functional.pad.constant",
        "nn.functional.pad.reflect", "nn.functional.pad.replicate", "nn.functional.prelu",
        "nn.functional.relu", "nn.functional.relu6", "nn.functional.rms_norm",
        "nn.functional.scaled_dot_product_attention", "nn.functional.selu",
        "nn.functional.silu", "nn.functional.smooth_l1_loss", "nn.functional.softplus",
        "nn.functional.softsign", "nn.functional.threshold", "ones_like", "outer",
        "permute", "pow", "prod", "reciprocal", "repeat", "reshape", "round", "rsqrt",
        "rsub", "scatter_add", "select_scatter", "sgn", "sigmoid", "sign", "sin", "sinh",
        "slice_scatter", "softmax", "sort", "split", "sqrt", "square", "squeeze", "stack",
        "std", "sub", "sum", "tan", "tanh", "tensordot", "tile", "to", "transpose",
        "tril", "triu", "trunc", "unbind", "unsqueeze", "var", "var_mean", "view", "where",
        "xlogy", "zeros", "zeros_like",
    }
)
FAST_INT64 = frozenset(
    {
        "abs", "add", "amax", "arange", "argmax", "argmin", "bitwise_and", "bitwise_not",
        "bitwise_or", "bitwise_xor", "bool", "cat", "clamp", "cumsum", "div.trunc_rounding",
        "eq", "flip", "float", "floor_divide", "fmod", "gather", "ge", "index_add",
        "index_select", "lt", "masked_fill", "matmul", "maximum", "min.reduction_with_dim",
        "mm", "mul", "ne", "neg", "nn.functional.pad.constant", "pow", "prod", "repeat",
        "scatter_add", "sign", "sort", "stack", "sub", "sum", "tril", "where",
    }
)
FAST_BFLOAT16 = frozenset(
    {
        "add", "addcmul", "addmm", "amax", "atan2", "baddbmm", "bmm", "cat", "clamp", "cos",
        "cumsum", "div.no_rounding_mode", "exp", "float", "gather", "index_select", "log",
        "log_softmax", "matmul", "mean", "mm", "mul", "nn.functional.batch_norm",
        "nn.functional.conv2d", "nn.functional.cross_entropy", "nn.functional.embedding",
        "nn.functional.gelu", "nn.functional.interpolate.bilinear",
        "nn.functional.layer_norm", "nn.functional.linear", "nn.functional.relu",
        "nn.functional.rms_norm", "nn.functional.scaled_dot_product_attention",
        "nn.functional.silu", "pow", "rsqrt", "sigmoid", "sin", "softmax", "sqrt", "sub",
        "sum", "tanh", "to", "var_mean", "where",
    }
)


def _params(claimed: tuple[str, ...], fast: frozenset[str]) -> list:
    return [
        pytest.param(name, id=name, marks=() if name in fast else pytest.mark.slow)
        for name in claimed
    ]


def _island_expected(name: str, dtype: torch.dtype, index: int) -> bool:
    if name in NO_ISLAND or NO_ISLAND_FOR.get((name, dtype)) == "all":
        return False
    return index not in NO_ISLAND_FOR.get((name), ())


@pytest.fixture(autouse=True)
def fresh_backend_state(monkeypatch):
    """Each op compiles from scratch and cannot inherit another op's learned
    failures (the in-memory support table is per process when cache=False)."""
    torch._dynamo.reset()
    monkeypatch.setattr(STATE, "support_tables", {})
    yield
    torch._dynamo.reset()


def check_op(name: str, dtype: torch.dtype) -> None:
    op = opinfos()[name]
    found = list(samples(op, dtype))
    assert found, f"{name}: OpInfo gives no usable {dtype} sample any more; drop the claim"
    for index, sample in enumerate(found):
        torch._dynamo.reset()
        # strict=True: any eager fallback raises UnsupportedOpError in here.
        record = compile_and_compare(op, sample, dtype)
        assert not record.fallbacks(), record.fallbacks()
        assert record.graphs, f"{name}: the backend was never called"
        if _island_expected(name, dtype, index):
            assert has_compute(record), (
                f"{name} sample {index}: no device island was compiled, so the op did not run "
                f"on the device: {record.graphs}"
            )


@pytest.mark.parametrize("name", _params(FLOAT32_OPS, FAST_FLOAT32))
def test_op_float32(name):
    check_op(name, torch.float32)


@pytest.mark.parametrize("name", _params(INT64_OPS, FAST_INT64))
def test_op_int64(name):
    check_op(name, torch.int64)


@pytest.mark.parametrize("name", _params(BFLOAT16_OPS, FAST_BFLOAT16))
def test_op_bfloat16(name):
    check_op(name, torch.bfloat16)


# The harness itself ----------------------------------------------------------


@pytest.mark.skipif(TORCH < (2, 13), reason="the claims are pinned to torch 2.13's OpInfo database")
def test_claims_name_real_opinfos():
    known = opinfos()
    for claimed, fast in (
        (FLOAT32_OPS, FAST_FLOAT32),
        (INT64_OPS, FAST_INT64),
        (BFLOAT16_OPS, FAST_BFLOAT16),
    ):
        assert len(set(claimed)) == len(claimed)
        assert set(claimed) <= set(known), set(claimed) - set(known)
        assert fast <= set(claimed), fast - set(claimed)
    assert not {n for n in FLOAT32_OPS + INT64_OPS + BFLOAT16_OPS if "dropout" in n} - {
        "native_dropout_backward"
    }


def _causes(error: BaseException) -> Iterator[BaseException]:
    while error is not None:
        yield error
        error = getattr(error, "inner_exception", None) or error.__cause__


def test_strict_run_rejects_an_op_that_falls_back():
    """The suite's device check can fail: i0 has no lowering, so strict raises."""
    op = opinfos()["i0"]
    sample = next(samples(op, torch.float32))
    with pytest.raises(Exception) as info:  # Dynamo wraps it in BackendCompilerFailed
        compile_and_compare(op, sample, torch.float32)
    assert any(isinstance(e, UnsupportedOpError) for e in _causes(info.value)), info.value


def _compiled(fn):
    return torch.compile(fn, backend="tpu", options=OPTIONS, dynamic=False, fullgraph=True)


# Silent wrong numbers the sweep found in torch-mlir's lowerings, each pinned
# by a regression test. Some are fixed by a rewrite before lowering, so the op
# stays on the device (checked under strict); the others are routed to eager,
# so the default run matches and strict refuses them by name.
FIXED_ON_DEVICE = {
    "negative_index": (lambda x, i: x[i], (torch.arange(5.0), torch.tensor([-1, -2, 0]))),
    "negative_index_2d": (
        lambda x, i, j: x[i, j],
        (torch.arange(12.0).reshape(3, 4), torch.tensor([-1, 0]), torch.tensor([-4, 3])),
    ),
    "take_negative": (torch.take, (torch.arange(9.0).reshape(3, 3), torch.tensor([-7, -4, -1]))),
    "index_put_negative": (
        lambda x, i: x.index_put((i,), torch.tensor([7.0, 1.0]), accumulate=True),
        (torch.zeros(5), torch.tensor([-1, -1])),
    ),
    "remainder_negative": (lambda x: x % 3.0, (torch.tensor([-7.0, 7.0, -36.0, 5.0]),)),
    "remainder_int_by_float": (lambda x: x % -2.5, (torch.tensor([-7, 7, -36, 5]),)),
    "sign_of_constant": (lambda x: x * torch.scalar_tensor(3.0).sign(), (torch.tensor([-7.0, 7.0]),)),
    # torch-mlir ignored avg_pool3d's override (divided by the window); decompositions/avg_pool_counts.py
    "avg_pool3d_divisor_override": (
        lambda x: torch.nn.functional.avg_pool3d(x, 2, stride=1, padding=1, divisor_override=2),
        (torch.linspace(-3, 3, 64).reshape(1, 1, 4, 4, 4),),
    ),
    "compare_constant": (
        lambda x: torch.where(torch.scalar_tensor(0.5) > 0, x, -x),
        (torch.tensor([-7.0, 7.0]),),
    ),
    # torch-mlir's log(cumsum(exp(x))) overflowed to inf; decompositions/missing_lowerings.py scans stably.
    "logcumsumexp_large": (lambda x: torch.logcumsumexp(x, 0), (torch.tensor([100.0, 50.0]),)),
}

ROUTED_TO_EAGER = {
    # Tied values' indices come in the order of eager's std::nth_element (tests/test_tie_order.py).
    "topk_indices": (
        lambda x: torch.topk(x, 4, dim=-1),
        (torch.zeros(3, 8),),
        "aten.topk",
    ),
}


@pytest.mark.parametrize("case", sorted(FIXED_ON_DEVICE))
def test_wrong_lowering_fixed_on_device(case):
    fn, args = FIXED_ON_DEVICE[case]
    assert_matches(_compiled(fn)(*args), fn(*args))


@pytest.mark.parametrize("case", sorted(ROUTED_TO_EAGER))
def test_wrong_lowering_routed_to_eager(case):
    fn, args, op = ROUTED_TO_EAGER[case]
    default = torch.compile(fn, backend="tpu", options={"cache": False}, dynamic=False)
    assert_matches(default(*args), fn(*args))
    torch._dynamo.reset()
    with pytest.raises(Exception, match=op):
        _compiled(fn)(*args)


def test_comparison_rejects_a_wrong_number():
    expected = (torch.tensor([1.0, 2.0]), torch.tensor([3, 4]))
    assert_matches((expected[0] * (1 + 1e-5), expected[1]), expected)  # within 1e-4
    with pytest.raises(AssertionError):
        assert_matches((expected[0] * 1.001, expected[1]), expected)
    with pytest.raises(AssertionError):
        assert_matches((expected[0], expected[1] + 1), expected)  # ints are exact
    with pytest.raises(AssertionError):
        assert_matches((expected[0].double(), expected[1]), expected)  # dtype too
