"""Ops torch-mlir cannot lower, decomposed into ops it can: on the device, eager's values."""

from __future__ import annotations

import pytest
import torch

import tpu_inductor.report as report

F = torch.nn.functional


def on_device(fn, *args):
    got = torch.compile(fn, backend="tpu", options={"cache": False})(*args)
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
