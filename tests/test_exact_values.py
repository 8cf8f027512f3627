"""Ops that lowered, ran on the device and returned wrong numbers, now eager's.

Each case failed before decompositions/exact_values.py (or the unsigned reduction
identities of lowering/compare_types.py): results of the right shape that
differed from eager's, with no fallback to say so. Every case checks that the
op ran on the device (no fallback, at least one island); integer, bool and
index results must be exact, and so must float results wherever the device
computes the same operations in the same order as eager (pooling picks
values, it does not compute them).
"""

from __future__ import annotations

import pytest
import torch

from torch_versions import needs_torch_2_12

import tpu_inductor.report as report

F = torch.nn.functional
aten = torch.ops.aten


def compiled(fn):
    return torch.compile(fn, backend="tpu", options={"cache": False})


def on_device(fn, *args):
    """``fn``'s compiled result, after checking nothing of it ran in eager."""
    got = compiled(fn)(*args)
    assert [f.op for f in report.current().fallbacks()] == []
    assert report.current().islands()
    return got


def exact(fn, *args):
    got = on_device(fn, *args)
    torch.testing.assert_close(got, fn(*args), rtol=0, atol=0, equal_nan=True)


# -- max pooling with ceil_mode ----------------------------------------------

POOLS = {1: F.max_pool1d, 2: F.max_pool2d, 3: F.max_pool3d}

CEIL_MODE_CASES = [
    # (dims, input shape, kernel, stride, padding, dilation)
    (2, (1, 1, 20, 20), [6, 8], [2, 2], [3, 4], 2),  # torch-mlir's MaxPool2dCeilModeTrueModule
    (2, (2, 6, 20, 10), 6, 6, 3, 1),  # ...StaticCeilModeTrueReduceOutputModule: the last window is dropped
    (2, (1, 2, 7, 7), 2, 2, 0, 1),  # last window starts on the last row, runs one past it
    (2, (1, 2, 8, 8), 3, 2, 1, 1),  # ... starts inside the input, ends two past it
    (2, (1, 2, 7, 7), 4, 3, 1, 1),
    (2, (1, 2, 9, 5), [3, 2], [2, 3], [1, 0], 1),  # ceil mode adds no window: the op as it is
    (2, (1, 2, 6, 6), 2, 2, 1, 2),  # dilated, first windows half in the padding
    (1, (2, 3, 11), 2, 2, 0, 1),
    (1, (2, 3, 10), 3, 2, 1, 1),
    pytest.param(3, (2, 3, 7, 7, 7), 2, 2, 0, 1, marks=needs_torch_2_12),
    pytest.param(3, (1, 2, 6, 5, 7), [3, 2, 2], [2, 2, 3], [1, 0, 1], 1, marks=needs_torch_2_12),
]


@pytest.mark.parametrize("dims,shape,kernel,stride,padding,dilation", CEIL_MODE_CASES)
def test_max_pool_ceil_mode_windows(dims, shape, kernel, stride, padding, dilation):
    """torch-mlir padded both sides with the extra row ceil mode needs: every
    window moved one position left (off by up to 3.4, ``-inf`` outputs)."""
    x = torch.randn(shape, generator=torch.Generator().manual_seed(0))
    x = torch.where(x > 1.0, x.round(), x)  # ties: the first position wins
    pool = POOLS[dims]
    exact(lambda x: pool(x, kernel, stride, padding, dilation, ceil_mode=True), x)
    # 3-d with indices: PyTorch's own decomposition (torch-mlir lowers no 3-d pool with indices).
    exact(lambda x: pool(x, kernel, stride, padding, dilation, ceil_mode=True, return_indices=True), x)


def test_max_pool_ceil_mode_without_stride_and_all_inf_windows():
    """``stride=[]`` means the kernel size; an all ``-inf`` window reports its
    first tap inside the input, as eager's kernel."""
    x = torch.randn(2, 3, 7, 7)
    exact(lambda x: F.max_pool2d(x, 3, ceil_mode=True, return_indices=True), x)
    inf = torch.full((1, 1, 6, 6), float("-inf"))
    exact(lambda x: F.max_pool2d(x, 2, 2, 1, 2, ceil_mode=True, return_indices=True), inf)


@pytest.mark.parametrize("dims,shape,kernel,stride,padding", [(2, (2, 3, 8, 8), 3, 2, 0), (1, (2, 3, 11), 2, 2, 0)])
def test_max_pool_ceil_mode_training(dims, shape, kernel, stride, padding):
    """The backward scatters the gradient at the forward's indices: before, the
    forward with indices did not lower (XLA's shape check) and ran in eager."""
    pool = POOLS[dims]

    def loss(x, w):
        y = pool(x * w, kernel, stride, padding, ceil_mode=True)
        return (y * torch.linspace(-1, 1, y.numel()).view(y.shape)).sum()

    x = torch.randn(shape)
    w = torch.randn(shape, requires_grad=True)
    loss(x, w).backward()
    expected, w.grad = w.grad, None
    on_device(loss, x, w).backward()
    # Each gradient element is one product of two float32 values (at most a
    # few windows add into it, in the same order): equal to float32 rounding.
    torch.testing.assert_close(w.grad, expected)


def test_eight_bit_integer_max_pool():
    """torch-mlir crashed the process (segfault) converting a uint8 max pool."""
    x = torch.tensor([[10, 20, 127, 0], [5, 6, 7, 8], [200, 255, 130, 128], [140, 150, 160, 170]], dtype=torch.uint8)
    exact(lambda x: F.max_pool2d(x, 2, return_indices=True), x.view(1, 1, 4, 4))
    exact(lambda x: F.max_pool2d(x, 3, 2, 1, ceil_mode=True), x.view(1, 1, 4, 4).to(torch.int8))


# -- unsigned and bool min/max reductions -----------------------------------

UINT8 = torch.tensor([[10, 20, 127, 0], [200, 255, 130, 128]], dtype=torch.uint8)


@pytest.mark.parametrize(
    "reduce",
    [
        lambda x: torch.max(x, 1),
        lambda x: torch.min(x, 1),
        lambda x: x.amax(1),
        lambda x: x.amin(1),
        lambda x: torch.aminmax(x, dim=1),
        lambda x: (x.argmax(1), x.argmin(1)),
        lambda x: (x[:1].max(), x[1:].min()),
        lambda x: x.cummax(1),
        lambda x: (torch.max(x > 100, 1), torch.min(x > 100, 1)),
    ],
    ids=["max.dim", "min.dim", "amax", "amin", "aminmax", "argmax-argmin", "max-min", "cummax", "bool"],
)
def test_unsigned_reductions(reduce):
    """uint8 max reductions started from 128 and min ones from 127 (int8's
    extremes): a row below 128 had max 128, one above 127 had min 127."""
    exact(reduce, UINT8)


# -- comparisons folded away --------------------------------------------------

SPECIAL = [float("-inf"), float("inf"), float("nan"), 3.4e38, 1.0, -0.0, -2.3, 65504.0, 7e4]


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.float16, torch.bfloat16])
def test_isfinite_isinf_isnan(dtype):
    """torch-mlir folded ``x == x`` to True: ``isfinite`` (torch-mlir's
    ``IsInfiniteModule``) called NaN finite."""
    x = torch.tensor(SPECIAL, dtype=torch.float64).to(dtype)
    exact(lambda x: (torch.isfinite(x), torch.isinf(x), torch.isnan(x), torch.isposinf(x), torch.isneginf(x)), x)


NAN = float("nan")
EXTREMES = torch.tensor([
    [NAN, -1.7, -4.3, 2.0],
    [3.6, NAN, -0.5, -0.5],  # a tie after the NaN
    [5.1, 1.1, 2.0, 5.1],  # a tie: the first index, as eager
    [-0.0, 0.0, -2.0, -3.0],  # -0.0 ties with 0.0
    [-float("inf"), -1e-40, float("inf"), NAN],
])


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16])
@pytest.mark.parametrize(
    "fn",
    [
        lambda x: torch.argmax(x),
        lambda x: torch.argmax(x, 1),
        lambda x: torch.argmin(x, 0, keepdim=True),
        lambda x: torch.max(x, 1),
        lambda x: torch.min(x, 0, keepdim=True),
    ],
    ids=["argmax", "argmax_dim", "argmin_keepdim", "max_dim", "min_dim_keepdim"],
)
def test_index_reductions_see_nan_as_eager_does(fn, dtype):
    """torch-mlir's argmax/argmin and max/min along a dim skipped NaN (eager:
    NaN is the extreme), and masked.argmax failed 15 of 49 OpInfo samples."""
    exact(fn, EXTREMES.to(dtype))


def test_self_equality_of_nan():
    x = torch.tensor(SPECIAL)
    exact(lambda x: (x == x, x.clone() == x, torch.isclose(x, x), torch.eq(x, x).all()), x)


# -- integer division ---------------------------------------------------------

INT64 = torch.tensor(
    [8_600_000_001, -8_600_000_001, 8_589_934_593, 2**53 + 1, 3 * (2**52 + 1) + 2, -(2**62) - 7,
     7, -7, 0, 2**63 - 1, -(2**63)],
    dtype=torch.int64,
)


@pytest.mark.parametrize(
    "divide",
    [
        lambda x: torch.div(x, 3, rounding_mode="floor"),
        lambda x: torch.div(x, -3, rounding_mode="floor"),
        lambda x: x // 3,
        lambda x: torch.floor_divide(x, 7),
        lambda x: torch.div(x, 3, rounding_mode="trunc"),
        lambda x: torch.div(x, x.flip(0).abs().clamp(1, 100), rounding_mode="floor"),
        lambda x: torch.div(x, -x.flip(0).abs().clamp(1, 100), rounding_mode="floor"),
        lambda x: torch.div(x.to(torch.int32), 3, rounding_mode="floor"),
    ],
    ids=["floor", "floor-negative", "floordiv", "floor_divide", "trunc", "floor-tensor", "floor-negative-tensor", "int32"],
)
def test_integer_floor_division_is_exact(divide):
    """torch-mlir floored an int64 quotient in float64: wrong past 2**53."""
    exact(divide, INT64)


# -- threshold_backward's result dtype ------------------------------------------


@pytest.mark.parametrize(
    "grad_dtype,self_dtype,threshold",
    [
        (torch.int64, torch.float32, 1.0),
        (torch.float32, torch.int64, 1),
        (torch.float16, torch.float32, 0.1),
        (torch.float32, torch.float64, 0.1),
        (torch.bfloat16, torch.int32, 0.5),
        (torch.int64, torch.int64, -0.5),  # the threshold truncates to 0
    ],
)
def test_threshold_backward_promotes(grad_dtype, self_dtype, threshold):
    """PyTorch's decomposition returned ``grad_output``'s dtype."""
    grad = torch.tensor([5, -6, 7, 8, 9]).to(grad_dtype)
    self = torch.tensor([-2.0, 0.0, 0.1, 1.0, 3.5], dtype=torch.float64).to(self_dtype)
    got = on_device(lambda g, s: aten.threshold_backward(g, s, threshold), grad, self)
    expected = aten.threshold_backward(grad, self, threshold)
    assert got.dtype == expected.dtype
    torch.testing.assert_close(got, expected, rtol=0, atol=0)


# -- bfloat16 accumulation ----------------------------------------------------


def _bf16_ulp(reference: torch.Tensor) -> torch.Tensor:
    """The spacing of bfloat16 values (8 significant bits) around ``reference``."""
    exponent = torch.floor(torch.log2(reference.abs().clamp_min(2.0**-126)))
    return torch.exp2(exponent - 7)


@pytest.mark.parametrize(
    "reduce",
    [
        lambda x: x.cumsum(1),
        lambda x: torch.var_mean(x, 1),
        lambda x: x.sum(1),
        lambda x: x.mean(1),
        lambda x: torch.nn.functional.layer_norm(x, (1024,)),
    ],
    ids=["cumsum", "var_mean", "sum", "mean", "layer_norm"],
)
def test_bfloat16_reductions_accumulate_in_float32(reduce):
    """Each result within one bfloat16 ulp of eager's error against float64.

    Accumulated in bfloat16, a cumsum of 1024 was up to 41x its value off
    (eager: 0.4%) and var_mean's mean 17x further from float64 than eager's.
    In float32, only the summation order differs from eager: the final
    rounding to bfloat16 may land one ulp apart, never more.
    """
    x = torch.randn(4, 1024, generator=torch.Generator().manual_seed(0)).to(torch.bfloat16) + 0.5
    got = on_device(reduce, x)
    eager, reference = reduce(x), reduce(x.double())
    if not isinstance(got, tuple):
        got, eager, reference = (got,), (eager,), (reference,)
    for g, e, r in zip(got, eager, reference):
        assert g.dtype == e.dtype == torch.bfloat16
        assert ((g.double() - r).abs() <= (e.double() - r).abs() + _bf16_ulp(r)).all()


def test_bfloat16_cross_is_at_least_as_exact_as_eager():
    """Not a fix: PyTorch's decomposition of ``cross`` computes in float32
    (``pw_cast_for_opmath``) and rounds once; eager's kernel rounds each
    product to bfloat16 first. The device is the closer to float64 (mean
    error 0.0014 against eager's 0.0021, worst relative 0.4% against 100%)."""
    generator = torch.Generator().manual_seed(0)
    a, b = (torch.randn(1000, 3, generator=generator).to(torch.bfloat16) for _ in range(2))
    got = on_device(lambda a, b: torch.linalg.cross(a, b), a, b)
    eager, reference = torch.linalg.cross(a, b), torch.linalg.cross(a.double(), b.double())
    assert ((got.double() - reference).abs() <= (eager.double() - reference).abs() + _bf16_ulp(reference)).all()
    assert (got.double() - reference).abs().mean() < (eager.double() - reference).abs().mean()


# -- variance without degrees of freedom --------------------------------------


@pytest.mark.filterwarnings("ignore:.*degrees of freedom")
@pytest.mark.parametrize(
    "fn",
    [
        lambda x: torch.var_mean(x),
        lambda x: torch.var_mean(x, 0),
        lambda x: torch.var(x, 0),
        lambda x: torch.std(x, 0),
        lambda x: torch.std_mean(x, 0, keepdim=True),
    ],
    ids=["var_mean_all", "var_mean_dim", "var", "std", "std_mean_keepdim"],
)
def test_variance_of_an_empty_reduction_is_nan(fn):
    """OpInfo's empty ``var_mean`` samples: eager divides by max(N - 1, 0), so
    0 / 0 is NaN; torch-mlir divided by -1 and returned -0.0."""
    x = torch.randn(0, 5)
    got, expected = on_device(fn, x), fn(x)
    for g, e in zip(got if isinstance(got, tuple) else (got,), expected if isinstance(expected, tuple) else (expected,)):
        torch.testing.assert_close(g, e, equal_nan=True)


@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
def test_multilabel_margin_loss_ignores_the_targets_after_the_first_minus_one(reduction):
    """PyTorch's own decomposition (Inductor's too) summed a margin for every
    target after the ``-1`` that ends a sample's list, read at class 0: 9.68
    against eager's 2.66 for the first sample below."""
    torch.manual_seed(0)
    scores = torch.randn(4, 8)
    targets = torch.tensor([[1, 2, -1, 0, 0, 0, 0, 0], [1, 2, 5, 7, 0, 4, 3, 6], [-1, 2, 0, 0, 0, 0, 0, 0], [6, 6, -1, 3, 0, 0, 0, 0]])

    def loss_and_gradient(x, t):
        x = x.clone().requires_grad_()
        loss = F.multilabel_margin_loss(x, t, reduction=reduction)
        loss.sum().backward()
        return loss.detach(), x.grad

    got = on_device(loss_and_gradient, scores, targets)
    # Sums of up to 8 x 8 float32 margins, in another order than eager's.
    torch.testing.assert_close(got, loss_and_gradient(scores, targets), rtol=1e-5, atol=1e-6)
    if reduction == "none":  # a single sample keeps eager's 0-d result
        one = on_device(lambda x, t: F.multilabel_margin_loss(x, t, reduction="none"), scores[0], targets[0])
        torch.testing.assert_close(one, F.multilabel_margin_loss(scores[0], targets[0], reduction="none"))
