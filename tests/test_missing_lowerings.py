"""Ops torch-mlir cannot lower, decomposed into ops it can: on the device, eager's values."""

from __future__ import annotations

import pytest
import torch

from torch_versions import needs_torch_2_12

import tpu_inductor.report as report

F = torch.nn.functional


def on_device(fn, *args):
    # Kernel choice off: these claims are about the lowering, and a convolution
    # (conv_tbc's) that oneDNN timed faster would run there and leave no island.
    got = torch.compile(fn, backend="tpu", options={"cache": False, "eager_kernels": False})(*args)
    assert report.current().fallbacks() == [] and report.current().islands()
    return got


@pytest.mark.parametrize(
    "x, dim",
    [
        (torch.randn(3, 7), 1),
        (torch.rand(2, 100) + 0.5, -1),
        (torch.randint(-3, 4, (6, 2), dtype=torch.int32), 0),  # promotes to int64, exact
        (torch.rand(5) > 0.3, 0),
    ],
    ids=["float", "long_row", "int32", "bool"],
)
def test_cumprod_runs_on_the_device(x, dim):
    got, expected = on_device(lambda a: torch.cumprod(a, dim), x), torch.cumprod(x, dim)
    assert got.dtype == expected.dtype
    # A scan by doubling multiplies in another order: a few float32 ulps over 100 factors.
    torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("shape, size", [((2, 3, 7, 9), (3, 2)), ((1, 1, 5, 5), (2, 2))])
def test_adaptive_max_pool2d_runs_on_the_device(shape, size):
    x = torch.randn(shape) if shape[-1] == 9 else torch.zeros(shape)  # zeros: every window ties
    fn = lambda a: F.adaptive_max_pool2d(a, size, return_indices=True)  # noqa: E731
    for got, expected in zip(on_device(fn, x), fn(x)):
        torch.testing.assert_close(got, expected, rtol=0, atol=0)


@pytest.mark.parametrize("size, stride, offset", [((2, 2), (1, 2), 1), ((2, 3), (3, 1), 2)])
def test_as_strided_scatter_runs_on_the_device(size, stride, offset):
    fn = lambda x, src: torch.as_strided_scatter(x, src, size, stride, offset) * 2  # noqa: E731
    x, src = torch.randn(10), torch.randn(size)
    torch.testing.assert_close(on_device(fn, x, src), fn(x, src))


def test_as_strided_backward_runs_on_the_device():
    """The backward of as_strided is an as_strided_scatter into zeros."""
    x = torch.randn(4, 6, requires_grad=True)
    fn = lambda a: torch.as_strided(a.sin(), (3, 3), (6, 2), 1).square().sum()  # noqa: E731
    torch.compile(fn, backend="tpu", options={"cache": False})(x).backward()
    got, x.grad = x.grad, None
    fn(x).backward()
    torch.testing.assert_close(got, x.grad)
    assert report.current().fallbacks() == []


def test_overlapping_as_strided_scatter_keeps_eagers_order():
    """Positions written twice: eager's copy has an order, a scatter has none; it stays eager."""
    fn = lambda x, src: torch.as_strided_scatter(x, src, (2, 2), (1, 1), 0) * 2  # noqa: E731
    x, src = torch.randn(10), torch.randn(2, 2)
    torch.testing.assert_close(torch.compile(fn, backend="tpu", options={"cache": False})(x, src), fn(x, src))
    assert [f.op for f in report.current().fallbacks()] == ["aten.as_strided_scatter.default"]


@pytest.mark.parametrize("reduce", ["sum", "prod", "mean", "amax", "amin"])
@pytest.mark.parametrize("include_self", [True, False])
@pytest.mark.parametrize("dim, shapes", [(0, ((5, 4), (3, 4))), (-1, ((3, 5, 2), (2, 4, 2)))], ids=["dim0", "last_smaller_index"])
def test_scatter_reduce_runs_on_the_device(reduce, include_self, dim, shapes):
    generator = torch.Generator().manual_seed(0)
    (x_shape, index_shape) = shapes
    x, src = torch.randn(x_shape, generator=generator), torch.randn(index_shape, generator=generator)
    index = torch.randint(0, x_shape[dim], index_shape, generator=generator)
    fn = lambda a, i, s: torch.scatter_reduce(a, dim, i, s, reduce, include_self=include_self)  # noqa: E731
    # Sums and products of at most five values in another order: a few ulps.
    torch.testing.assert_close(on_device(fn, x, index, src), fn(x, index, src), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize(
    "x, dim",
    [
        (torch.tensor([100.0, 50.0]), 0),  # torch-mlir's log(cumsum(exp(x))) gave inf
        (torch.randn(8, 5, 6, generator=torch.Generator().manual_seed(0)) * 40, -2),
        (torch.rand(5, 3, 6, 9, generator=torch.Generator().manual_seed(1), dtype=torch.float64), 1),
        (torch.tensor([[float("-inf"), float("-inf"), 1.0, float("inf"), float("inf"), float("nan"), 2.0]]), 1),
        ((torch.randn(4, 40, generator=torch.Generator().manual_seed(2)) * 10).bfloat16(), 1),
    ],
    ids=["large", "float32", "float64", "infinities_nan", "bfloat16"],
)
def test_logcumsumexp_runs_on_the_device(x, dim):
    got, expected = on_device(lambda a: torch.logcumsumexp(a, dim), x), torch.logcumsumexp(x, dim)
    assert got.dtype == expected.dtype
    # Log-add-exps in a tree, not in sequence: a few ulps (2^-22 relative in
    # float32, 2^-50 in float64); bfloat16 is computed in float32 as eager does.
    rtol = {torch.float64: 1e-14, torch.float32: 1e-6, torch.bfloat16: 0.0}[x.dtype]
    torch.testing.assert_close(got, expected, rtol=rtol, atol=0, equal_nan=True)


@pytest.mark.parametrize(
    "fn",
    [
        lambda a: torch.ops.aten.norm.Scalar(a, 3.0),
        lambda a: torch.ops.aten.norm.Scalar(a, 2),
        lambda a: torch.ops.aten.norm.ScalarOpt_dim(a, 3.0, [], True),
        lambda a: torch.ops.aten.norm.ScalarOpt_dim(a, None, [0, 2]),  # named dims: lowered already
    ],
    ids=["p3", "p2", "no_dims_keepdim", "named_dims"],
)
def test_norm_over_every_dim_runs_on_the_device(fn):
    x = torch.randn(3, 4, 5, generator=torch.Generator().manual_seed(0))
    # A sum of 60 powers, added in another order than eager's kernel: a few ulps.
    torch.testing.assert_close(on_device(fn, x), fn(x), rtol=1e-6, atol=0)


@pytest.mark.parametrize(
    "op, grad_shape, output_size, input_size, scales",
    [
        (torch.ops.aten.upsample_nearest2d_backward, (1, 1, 6, 12), [6, 12], [1, 1, 2, 3], (3.0, 4.0)),
        (torch.ops.aten.upsample_nearest2d_backward, (1, 1, 4, 8), [4, 8], [1, 1, 2, 3], (None, None)),
        (torch.ops.aten.upsample_nearest2d_backward, (2, 3, 13, 10), [13, 10], [2, 3, 5, 7], (2.7, 1.3)),
        (torch.ops.aten.upsample_nearest1d_backward, (2, 3, 9), [9], [2, 3, 4], (None,)),
        (torch.ops.aten.upsample_nearest3d_backward, (2, 3, 9, 5, 7), [9, 5, 7], [2, 3, 4, 3, 2], (1.3, None, 3.4)),
    ],
    ids=["2d_scales", "2d_no_scales", "2d_fractional", "1d", "3d"],
)
def test_upsample_nearest_backward_runs_on_the_device(op, grad_shape, output_size, input_size, scales):
    grad = torch.randn(grad_shape, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    fn = lambda g: op(g, output_size, input_size, *scales)  # noqa: E731
    # Each input gradient sums at most 12 output gradients, in another order: a few ulps.
    torch.testing.assert_close(on_device(fn, grad), fn(grad), rtol=1e-14, atol=1e-15)


def test_upsample_nearest_backward_of_an_interpolation():
    x = torch.randn(2, 3, 5, 7, requires_grad=True)
    fn = lambda a: (F.interpolate(a, size=(13, 10), mode="nearest") ** 2).sum()  # noqa: E731
    torch.compile(fn, backend="tpu", options={"cache": False})(x).backward()
    got, x.grad = x.grad, None
    assert report.current().fallbacks() == []
    fn(x).backward()
    torch.testing.assert_close(got, x.grad, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("include_self", [True, False])
def test_integer_scatter_reduce_mean_floors_as_eager(include_self):
    generator = torch.Generator().manual_seed(0)
    x = torch.randint(-10, 10, (10, 8, 6), dtype=torch.int32, generator=generator)
    index = torch.randint(0, 4, (2, 4, 3), generator=generator)
    src = torch.randint(-10, 10, (5, 8, 6), dtype=torch.int32, generator=generator)
    fn = lambda a, i, s: torch.scatter_reduce(a, 0, i, s, "mean", include_self=include_self)  # noqa: E731
    # Negative sums: floor, not truncation, as eager's div_(count, "floor"). Integers: exact.
    torch.testing.assert_close(on_device(fn, x, index, src), fn(x, index, src), rtol=0, atol=0)


SMALL_CORNERS = {
    # name: (fn, args, rtol); rtol 0 where the op computes the same thing eager does
    "erf_of_int": (torch.erf, (torch.randint(-3, 10, (3, 4), dtype=torch.int32),), 1e-6),
    "clamp_int_by_floats": (lambda a: torch.clamp(a, min=-2.5, max=2.5), (torch.arange(-5, 5),), 0),
    "clamp_int_by_float_min": (lambda a: torch.clamp(a, min=-2.5), (torch.arange(-5, 5, dtype=torch.int32),), 0),
    "index_select_0d_index": (lambda a, i: torch.index_select(a, 1, i), (torch.randn(4, 5, 6), torch.tensor(2)), 0),
    "embedding_flags": (
        lambda w, i: F.embedding(i, w, scale_grad_by_freq=True) + F.embedding(i, w, sparse=True),
        (torch.randn(10, 4), torch.tensor([[1, 9], [3, 3]])),
        0,
    ),
    # prod of 12 factors, reduced in another order than eager's kernel: an ulp or two.
    "prims_prod": (lambda a: torch.ops.prims.prod(a, (0, 1)), (torch.rand(3, 4, 5) + 0.5,), 1e-6),
    # One convolution in place of one matmul per tap: a few ulps.
    "conv_tbc": (
        lambda a, w, b: torch.conv_tbc(a, w, b, 1),
        (torch.randn(9, 2, 4), torch.randn(3, 4, 5), torch.randn(5)),
        1e-5,
    ),
    "trace_empty": (lambda a: torch.trace(a) + a.sum(), (torch.empty(0, 0),), 0),
    "trace_nonempty_int": (torch.trace, (torch.arange(12).reshape(3, 4),), 0),  # PyTorch's decomposition, kept
    "trace_empty_int": (lambda a: torch.trace(a) + a.sum(), (torch.empty(0, 3, dtype=torch.uint8),), 0),
    # A graph of 0-d tensors only stays in eager by design: a 1-d operand keeps it on the device.
    "int_mm_mixed_sign": (
        torch._int_mm,
        (torch.randint(0, 256, (3, 4)).to(torch.uint8), torch.randint(-128, 128, (4, 3)).to(torch.int8)),
        0,
    ),
    # Every input expanded at dim 0: eager's output has a 0-sized dim (torch-mlir refuses it on purpose).
    "trilinear_empty": (
        lambda a, b, c: torch.ops.aten._trilinear(a, b, c, [0], [0], [0], [2], 0).sum() + a,
        (torch.rand(2, 3, 6), torch.rand(2, 3, 6), torch.rand(2, 3, 6)),
        0,
    ),
    "unfold_0d": (lambda a, b: a.unfold(0, 1, 1) * b, (torch.tensor(3.0), torch.randn(4)), 0),
    "unfold_0d_size_0": (lambda a, b: a.unfold(0, 0, 1).sum() + b, (torch.tensor(3.0), torch.randn(4)), 0),
    # torch-mlir read an end of 0 as the dim's size (passes/empty_slices_at_the_end.py).
    "slice_to_0": (lambda a, b: a[:0] * 2, (torch.randn(4), torch.randn(1)), 0),
    "slice_negative_start_to_0": (lambda a, b: a[:, -3:0].sum(1) + b, (torch.randn(4, 5), torch.randn(4)), 0),
}


@pytest.mark.parametrize(
    "case",
    # torch 2.11's _int_mm takes int8 operands only.
    [pytest.param(c, marks=needs_torch_2_12) if c == "int_mm_mixed_sign" else c for c in sorted(SMALL_CORNERS)],
)
def test_argument_corners_run_on_the_device(case):
    fn, args, rtol = SMALL_CORNERS[case]
    got, expected = on_device(fn, *args), fn(*args)
    assert got.dtype == expected.dtype
    torch.testing.assert_close(got, expected, rtol=rtol, atol=rtol)


def _masked_assignments():
    generator = torch.Generator().manual_seed(0)
    x = torch.rand(5, 5, generator=generator)
    rows = torch.tensor([True, False, True, True, False])
    cells = torch.rand(2, 3, 4, 5, generator=generator) > 0.6
    return {
        # name: (x, mask, values, accumulate)
        "row_per_value": (x, rows, torch.rand(3, 5, generator=generator), False),
        "row_per_value_accumulate": (x, rows, torch.rand(3, 5, generator=generator), True),
        "one_row_broadcast": (x, rows, torch.rand(1, 5, generator=generator), False),
        "scalar_accumulate": (x, rows, torch.tensor(2.0), True),
        "every_dim": (torch.rand(2, 3, 4, 5, generator=generator), cells,
                      torch.rand(int(cells.sum()), generator=generator), False),
        "leading_dims": (torch.rand(2, 3, 4, generator=generator), torch.tensor([[True, False, True], [False, True, True]]),
                         torch.arange(16.0).reshape(4, 4), True),
        # Nothing selected, no values (Higgs Audio's `hidden_states[audio_mask] += audio` without audio):
        # eager's index_select of an empty source raised in the user's call.
        "nothing_selected": (x, torch.zeros(5, dtype=torch.bool), torch.rand(0, 5, generator=generator), False),
        "nothing_selected_accumulate": (x, torch.zeros(5, dtype=torch.bool), torch.rand(0, 5), True),
    }


@pytest.mark.parametrize("case", sorted(_masked_assignments()))
def test_boolean_mask_index_put_runs_on_the_device(case):
    x, mask, values, accumulate = _masked_assignments()[case]
    fn = lambda a, m, v: torch.ops.aten.index_put(a, (m,), v, accumulate)  # noqa: E731
    # Each selected position is written (or added to) once, as in eager: exact.
    torch.testing.assert_close(on_device(fn, x, mask, values), fn(x, mask, values), rtol=0, atol=0)


def test_boolean_mask_index_put_with_a_miscount_is_nan_not_plausible():
    """Eager raises when the mask selects another number of rows than there
    are values; the device cannot raise, so every element is NaN."""
    x, values = torch.rand(5, 5), torch.rand(3, 5)
    three, two = torch.tensor([True, False, True, True, False]), torch.tensor([True, False, False, True, False])
    fn = lambda a, m, v: torch.ops.aten.index_put(a, (m,), v)  # noqa: E731
    with pytest.raises(RuntimeError, match="shape mismatch"):
        fn(x, two, values)
    compiled = torch.compile(fn, backend="tpu", options={"cache": False})
    assert not compiled(x, three, values).isnan().any()
    assert compiled(x, two, values).isnan().all()  # same shapes, no retrace: the executable's answer
    assert report.current().fallbacks() == []


@pytest.mark.parametrize(
    "x_shape, w_shape, stride, padding, output_padding, dilation",
    [
        ((1, 1, 64, 57), (1, 1, 11, 7), [3, 4], [2, 3], [2, 1], [1, 1]),  # torch-mlir's e2e AsymmetricCrop
        ((2, 3, 9, 8), (3, 4, 3, 5), [4, 3], [1, 0], [3, 2], [2, 1]),
        ((2, 3, 9), (3, 2, 4), [3], [5], [2], [2]),  # a crop (lowered before too: checks the crop)
        ((1, 2, 4, 5, 6), (2, 3, 3, 2, 3), [3, 3, 2], [1, 2, 0], [2, 2, 1], [1, 1, 1]),
    ],
    ids=["2d", "2d_dilated", "1d_crop", "3d"],
)
def test_transposed_convolution_with_large_output_padding_runs_on_the_device(
    x_shape, w_shape, stride, padding, output_padding, dilation
):
    generator = torch.Generator().manual_seed(0)
    x, w = torch.randn(x_shape, generator=generator), torch.randn(w_shape, generator=generator)
    b = torch.randn(w_shape[1], generator=generator)
    fn = lambda a, k, c: torch.ops.aten.convolution(  # noqa: E731
        a, k, c, stride, padding, dilation, True, output_padding, 1
    )
    got = torch.compile(fn, backend="tpu", options={"cache": False, "eager_kernels": False})(x, w, b)
    assert report.current().fallbacks() == [] and report.current().islands()
    # Sums of up to 77 products in another order than oneDNN's: a few ulps of the sum.
    torch.testing.assert_close(got, fn(x, w, b), rtol=1e-5, atol=1e-5)


def test_embedding_flags_still_scale_the_gradient():
    """The forward drops ``scale_grad_by_freq``; autograd still differentiates the op with it."""
    weight = torch.randn(10, 4, requires_grad=True)
    indices = torch.tensor([[1, 9], [3, 3]])  # row 3 twice: its gradient is divided by 2
    fn = lambda w: (F.embedding(indices, w, scale_grad_by_freq=True) ** 2).sum()  # noqa: E731
    torch.compile(fn, backend="tpu", options={"cache": False})(weight).backward()
    got, weight.grad = weight.grad, None
    fn(weight).backward()
    torch.testing.assert_close(got, weight.grad)


@pytest.mark.parametrize(
    "x_shape, bound_shape", [((0, 1, 3), (0, 10, 3)), ((4, 1, 3), (4, 5, 3)), ((5,), (3, 5))],
    ids=["empty_from_opinfo", "bound_larger", "bound_adds_a_dim"],
)
def test_clamp_by_a_larger_bound_runs_on_the_device(x_shape, bound_shape):
    """torch-mlir gave stablehlo.clamp the input's shape as its result's, and
    MLIR aborted where a bound is larger (OpInfo's clamp_min sample 7)."""
    generator = torch.Generator().manual_seed(0)
    x, bound = torch.randn(x_shape, generator=generator), torch.randn(bound_shape, generator=generator)
    for fn in (torch.clamp_min, torch.clamp_max, lambda a, b: torch.clamp(a, b, b + 1)):
        torch._dynamo.reset()
        report.reset()
        assert torch.equal(on_device(fn, x, bound), fn(x, bound))
