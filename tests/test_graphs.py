"""What real graphs contain: aliases, None/duplicate outputs, mutation, scalars,
SymInts, empty graphs, odd strides, every dtype the path carries.

Each case compares the compiled result with eager PyTorch. Elementwise float32
results are compared with torch.testing's float32 defaults (rtol 1.3e-6,
atol 1e-5): XLA evaluates the same ops in the same order for these graphs;
integer and bool results must be exact.
"""

from __future__ import annotations

import pytest
import torch

import tpu_inductor.report as report

OPTIONS = {"cache": False}


def compiled(fn, **options):
    return torch.compile(fn, backend="tpu", options={**OPTIONS, **options})


def run_both(fn, *args, **options):
    eager = fn(*[a.clone() if isinstance(a, torch.Tensor) else a for a in args])
    got = compiled(fn, **options)(*args)
    torch.testing.assert_close(got, eager)
    return got


def islands() -> int:
    return len(report.current().islands())


def fallback_ops() -> list[str]:
    return [f.op for f in report.current().fallbacks()]


X = torch.randn(4, 5)


def test_output_aliases_input_and_is_duplicated():
    got = run_both(lambda x: (x, x.sin(), x.sin()), X)
    assert got[0] is X or got[0].data_ptr() == X.data_ptr()
    assert islands() == 1


def test_view_outputs_of_computed_values():
    run_both(lambda x: x.view(20).cos().view(4, 5)[1:].t(), X)


def test_empty_graph_returns_input_without_device_call():
    run_both(lambda x: x, X)
    assert islands() == 0


def test_non_contiguous_and_storage_offset_inputs():
    run_both(lambda x: x.exp() * 2, X.t())
    run_both(lambda x: x.exp() * 2, torch.randn(1, 5).expand(3, 5))
    run_both(lambda x: (x + 1).sum(0), torch.randn(21)[1:].view(4, 5))


def test_input_mutation_is_written_back():
    def add_in_place(a):
        a.mul_(2).add_(1)
        return a.sum()

    x = torch.randn(3, 3)
    expected = x * 2 + 1
    total = compiled(add_in_place)(x)
    torch.testing.assert_close(x, expected)
    torch.testing.assert_close(total, expected.sum())


def test_unsorted_topk_values_lower():
    """topk(sorted=False) (MoE routers) lowers as the sorted topk where eager
    sorts it too (k * 64 <= n); its indices run on PyTorch's kernel, whose
    tie order is the reference (tests/test_tie_order.py)."""

    def route(scores):
        weights, _ = torch.topk(scores.softmax(-1), 2, dim=-1, sorted=False)
        return weights.sum(-1)

    scores = torch.randn(8, 256)
    run_both(route, scores)
    assert fallback_ops() == []


@pytest.mark.parametrize("bounds", [(0, 3), (0, 0), (-1.0, 0.5)])
def test_histc_lowers_and_counts_like_eager(bounds):
    """histc (MoE token counts) as scatter_add: exact counts, edges included."""

    def count(ids, values):
        return torch.histc(ids, bins=4, min=0, max=3), torch.histc(values, bins=5, min=bounds[0], max=bounds[1])

    ids = torch.tensor([0.0, 3.0, 3.0, 1.0, 2.0, 5.0, -1.0, 1.0])
    # NaN is dropped from given ranges; with min == max == 0 eager refuses it.
    nan = [float("nan")] if bounds != (0, 0) else []
    values = torch.cat([torch.randn(64), torch.tensor([0.5, -1.0, *nan])])
    got, expected = compiled(count)(ids, values), count(ids, values)
    torch.testing.assert_close(got, expected, rtol=0, atol=0)
    assert fallback_ops() == []


def test_group_norm_lowers_without_as_strided():
    """group_norm's decomposition reshapes with as_strided, whose lowering XLA
    rejected; as a view of the contiguous statistics it lowers."""
    norm = torch.nn.GroupNorm(4, 16)
    with torch.no_grad():
        norm.weight.uniform_(0.5, 1.5)
        norm.bias.uniform_(-0.5, 0.5)
    x = torch.randn(2, 16, 6, 6)
    with torch.no_grad():
        torch.testing.assert_close(compiled(norm)(x), norm(x))
    assert fallback_ops() == [] and islands() == 1


@pytest.mark.parametrize(
    "size, stride, offset", [((3, 4), (2, 1), 0), ((2, 2, 3), (1, 6, 2), 3), ((4,), (3,), 1), ((), (), 5)]
)
def test_overlapping_as_strided_of_a_computed_tensor(size, stride, offset):
    def windows(x):
        return (x * 2).as_strided(size, stride, offset) + 1

    run_both(windows, torch.randn(4, 6))
    assert fallback_ops() == []


def _window_of_a_slice(x):
    return (x * 2)[:, 1:].as_strided((3, 3), (6, 1), 0) + 1


def _window_of_a_transpose(x):
    return (x * 2).t()[1:].as_strided((3, 3), (1, 4), 0) * 3


@pytest.mark.parametrize("fn", [_window_of_a_slice, _window_of_a_transpose])
def test_as_strided_of_a_view_reads_the_viewed_tensor(fn):
    """as_strided reads the storage of the tensor its input views, including
    elements outside the view (Longformer's overlapping chunks). Run eagerly on
    an island's row-major output it read other elements, silently; rewritten
    from the viewed tensor it lowers and is exact."""
    run_both(fn, torch.arange(24.0).view(4, 6))
    assert fallback_ops() == []


def test_as_strided_beyond_a_strided_input_runs_on_its_real_storage():
    def windows(x):
        return x[:, 1:].sin().sum() + x[:, 1:].as_strided((3, 3), (12, 1), 0).cos()

    x = torch.arange(48.0).view(4, 12)[:, ::2]  # the windows read the skipped columns
    torch.testing.assert_close(compiled(windows)(x), windows(x))
    assert fallback_ops() == ["aten.as_strided.default"]


@pytest.mark.parametrize("value", [0, 1.5])
def test_boolean_mask_assignment_lowers(value):
    """x[mask] = scalar failed in torch-mlir (index_put with a bool index); as
    where(mask, scalar, x) it lowers. Gemma 3 does it to its input ids."""

    def replace_tokens(ids, features):
        ids, features = ids.clone(), features.clone()
        ids[ids > 50] = 0
        features[ids == 0] = value  # mask over the leading dims only
        return ids * 2, features

    ids, features = torch.randint(0, 100, (2, 16)), torch.randn(2, 16, 4)
    run_both(replace_tokens, ids, features)
    assert fallback_ops() == []


@pytest.mark.parametrize("dtype", [torch.bool, torch.uint8])
def test_comparisons_of_unsigned_values_lower(dtype):
    """torch-mlir emits SIGNED compares for bool and uint8, which XLA rejects
    (lowering/compare_types.py). uint8 values above 127 check that the order is
    unsigned, not merely accepted."""

    def compare(x, y):
        return (x > 0).float() + (x <= y).float() * 2 + (x >= 1).float() * 4 + (torch.maximum(x, y) == x) * 8

    values = torch.tensor([0, 1, 100, 200, 255, 128])
    x, y = values.to(dtype), values.flip(0).to(dtype)
    run_both(compare, x, y)
    assert fallback_ops() == []


@pytest.mark.parametrize("start", [8, 16, -4])
def test_open_ended_slice_assignment_lowers(start):
    """``x[:, 8:] = y`` is slice_scatter with end 2**63-1, which torch-mlir sized
    its allocation from (bad_alloc, or the OOM killer): clamped, it lowers."""

    def assign_tail(x, y):
        x = x.clone()
        x[:, start:] = y
        return x * 2

    x = torch.randn(2, 16)
    run_both(assign_tail, x, torch.randn(2, x[:, start:].shape[1]))
    assert fallback_ops() == [] and islands() == 1


@pytest.mark.parametrize(
    "dtype", [torch.float32, torch.bfloat16, torch.float16, torch.int32, torch.int64, torch.bool]
)
def test_dtypes_round_trip(dtype):
    x = (torch.randn(4, 6) * 10).to(dtype)
    if dtype == torch.bool:
        got = run_both(lambda a: (a & ~a.flip(0)) | a.roll(1, 1), x)
    elif dtype in (torch.bfloat16, torch.float16):
        # One rounding for the fused chain, as Inductor's code (its tests compare
        # half precision with reference_in_float): float32's exact ops, then one rounding.
        fn = lambda a: (a * 3 + a.flip(0)).abs()  # noqa: E731
        got = compiled(fn)(x)
        torch.testing.assert_close(got, fn(x.float()).to(dtype), rtol=0, atol=0)
    else:
        got = run_both(lambda a: (a * 3 + a.flip(0)).abs(), x)
    assert got.dtype == dtype


def test_int64_beyond_int32_stays_exact():
    big = torch.tensor([2**40 + 7, -(2**35) - 1, 3, 2**62], dtype=torch.int64)
    got = run_both(lambda a: (a // 2 + a % 5, a.cumsum(0), a.max()), big)
    assert got[0].dtype == torch.int64
    assert int(got[2]) == 2**62


def test_python_scalars_and_symint_arguments():
    run_both(lambda a, s: a * s + 1, X, 2.5)

    def sized(a, n):
        return a.sum() * n + a.shape[0]

    fn = torch.compile(sized, backend="tpu", options=OPTIONS, dynamic=True)
    for rows, n in [(2, 3), (3, 4), (5, 7)]:
        a = torch.randn(rows, 3)
        torch.testing.assert_close(fn(a, n), sized(a, n))


def test_changing_shapes_with_default_dynamic():
    def f(a):
        return (a.softmax(-1) * a.shape[0]).sum(0)

    fn = compiled(f)
    for rows in (2, 3, 8, 5):
        a = torch.randn(rows, 4)
        torch.testing.assert_close(fn(a), f(a))


def test_backward_with_none_gradients():
    def f(a, w):
        return (a @ w).relu().sum()

    a = torch.randn(3, 4)  # no grad: its gradient output is None
    w = torch.randn(4, 2, requires_grad=True)
    w_ref = w.detach().clone().requires_grad_(True)
    compiled(f)(a, w).backward()
    f(a, w_ref).backward()
    torch.testing.assert_close(w.grad, w_ref.grad)
    assert a.grad is None


@pytest.mark.parametrize(
    "channels, out_channels, groups, kernel, stride, padding, dilation",
    [(8, 8, 8, 4, 1, 3, 1), (6, 9, 3, 3, 2, 1, 2)],
    ids=["depthwise-causal", "grouped-strided-dilated"],
)
def test_grouped_conv1d_backward_lowers(channels, out_channels, groups, kernel, stride, padding, dilation):
    """Mamba's and gated delta nets' short depthwise convolutions: torch-mlir
    rejects the grouped backward, decomposed it lowers. Gradients sum a few
    dozen products, so float32 defaults with atol 1e-5 hold."""
    torch.manual_seed(0)
    conv = torch.nn.Conv1d(channels, out_channels, kernel, stride, padding, dilation, groups)
    x = torch.randn(2, channels, 17, requires_grad=True)

    def loss(x):
        return (conv(x).tanh() ** 2).sum()

    wrt = [x, conv.weight, conv.bias]
    expected = torch.autograd.grad(loss(x), wrt)
    actual = torch.autograd.grad(compiled(loss, eager_kernels=False)(x), wrt)
    torch.testing.assert_close(actual, expected)
    assert fallback_ops() == []


@pytest.mark.parametrize("before", [lambda x: x, torch.sin], ids=["input", "computed"])
def test_as_strided_of_a_diagonal_reads_the_storage_the_diagonal_views(before):
    """torch-mlir's e2e ``AtenAsStridedAfterDiagonalModule``: a diagonal made a
    gather while tracing is a new tensor, and an as_strided of it read past its
    four elements (``setStorage: ... out of bounds``) in the user's call."""

    def f(x):
        view = torch.ops.aten.diagonal(before(x), offset=0, dim1=0, dim2=1)
        return torch.ops.aten.as_strided(view, size=(3,), stride=(6,), storage_offset=0) * 1

    run_both(f, torch.arange(20, dtype=torch.float32).reshape(4, 5))
    assert fallback_ops() == []


@pytest.mark.parametrize("offset, dims", [(0, (0, 1)), (1, (1, 2)), (-2, (2, 0))])
def test_diagonal_backward_lowers(offset, dims):
    """The backward of a diagonal is a diagonal_scatter, lowered as an index_put."""
    x = torch.randn(4, 3, 5, requires_grad=True)
    fn = lambda a: (torch.diagonal(a.sin(), offset, *dims) ** 2).sum()  # noqa: E731
    compiled(fn)(x).backward()
    got, x.grad = x.grad, None
    fn(x).backward()
    torch.testing.assert_close(got, x.grad)
    assert fallback_ops() == []
