"""Adaptive pools whose windows differ in length run on the device (decompositions/adaptive_pools.py)."""

from __future__ import annotations

import pytest
import torch

import tpu_inductor.report as report

F = torch.nn.functional


def on_device(fn, *args):
    got = torch.compile(fn, backend="tpu", options={"cache": False})(*args)
    assert report.current().fallbacks() == [] and report.current().islands()
    return got


def _input(shape, kind: str) -> torch.Tensor:
    x = torch.randn(shape, generator=torch.Generator().manual_seed(0))
    if kind == "ties":  # few distinct values: most windows hold their maximum twice
        return x.round().clamp(-1, 1)
    if kind == "nan":  # eager takes the last NaN of a window
        return torch.where(x > 1.0, float("nan"), x)
    return x


@pytest.mark.parametrize("kind", ["random", "ties", "nan"])
@pytest.mark.parametrize(
    "pool, shape, size",
    [
        (F.adaptive_max_pool1d, (2, 3, 10), 7),
        (F.adaptive_max_pool2d, (1, 4, 10, 9), (7, 13)),  # e2e AdaptiveMaxPool2dStatic: output larger than input
        (F.adaptive_max_pool2d, (4, 10, 16), (7, 13)),  # no batch dim
        (F.adaptive_max_pool3d, (1, 2, 10, 9, 5), (7, 13, 15)),
        (F.adaptive_max_pool3d, (2, 10, 16, 17), (7, 13, 15)),
        (F.adaptive_max_pool3d, (1, 2, 4, 6, 8), (2, 3, 4)),  # evenly dividing
    ],
    ids=["1d", "2d", "2d_no_batch", "3d", "3d_no_batch", "3d_dividing"],
)
def test_adaptive_max_pool_runs_on_the_device_with_eagers_indices(pool, shape, size, kind):
    x = _input(shape, kind)
    fn = lambda a: pool(a, size, return_indices=True)  # noqa: E731
    (values, indices), (expected_values, expected_indices) = on_device(fn, x), fn(x)
    # A maximum is one of the inputs and the index a comparison: both exact.
    torch.testing.assert_close(values, expected_values, rtol=0, atol=0, equal_nan=True)
    torch.testing.assert_close(indices, expected_indices, rtol=0, atol=0)


def test_bfloat16_adaptive_max_pool_is_exact():
    x = torch.randn(2, 3, 10, 7, 5, generator=torch.Generator().manual_seed(2)).to(torch.bfloat16)
    fn = lambda a: F.adaptive_max_pool3d(a, (4, 3, 7), return_indices=True)  # noqa: E731
    for got, expected in zip(on_device(fn, x), fn(x)):
        torch.testing.assert_close(got, expected, rtol=0, atol=0)


@pytest.mark.parametrize("shape, size", [((1, 3, 10, 16, 17), (7, 13, 15)), ((3, 10, 9, 5), (4, 4, 4))])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_adaptive_avg_pool3d_runs_on_the_device(shape, size, dtype):
    x = torch.randn(shape, dtype=dtype, generator=torch.Generator().manual_seed(1)).to(dtype)
    fn = lambda a: F.adaptive_avg_pool3d(a, size)  # noqa: E731
    # Window sums of at most 27 values, added in another order than eager's loop: a few ulps.
    tolerance = {torch.float32: 1e-6, torch.float64: 1e-14}[dtype]
    torch.testing.assert_close(on_device(fn, x), fn(x), rtol=tolerance, atol=tolerance)


def test_symbolic_sizes_keep_the_op():
    """Symbolic input sizes: the windows are not known at trace time, so the op stays (eager's values)."""
    fn = torch.compile(lambda a: F.adaptive_max_pool3d(a, (3, 2, 5), return_indices=True),
                       backend="tpu", options={"cache": False}, dynamic=True)
    for shape in [(1, 2, 7, 5, 9), (1, 2, 8, 6, 11)]:
        x = torch.randn(shape)
        for got, expected in zip(fn(x), F.adaptive_max_pool3d(x, (3, 2, 5), return_indices=True)):
            torch.testing.assert_close(got, expected, rtol=0, atol=0)


@pytest.mark.parametrize(
    "pool, shape, size",
    [
        (F.adaptive_avg_pool2d, (2, 3, 32, 32), (3, 3)),  # windows of 11 and 12 rows
        (F.adaptive_avg_pool2d, (3, 10, 9), (7, 13)),  # no batch dim, output larger than input
        (F.adaptive_avg_pool2d, (2, 4, 8, 8), (4, 2)),  # evenly dividing
        (F.adaptive_avg_pool3d, (1, 2, 10, 9, 5), (4, 3, 2)),
    ],
    ids=["2d", "2d_no_batch", "2d_dividing", "3d"],
)
def test_adaptive_avg_pool_backward_runs_on_the_device(pool, shape, size):
    x = torch.randn(shape, generator=torch.Generator().manual_seed(0), requires_grad=True)
    twin = x.detach().clone().requires_grad_()
    cotangent = torch.randn(pool(twin, size).shape, generator=torch.Generator().manual_seed(1))
    (on_device(lambda t: pool(t, size), x) * cotangent).sum().backward()
    assert report.current().fallbacks() == []  # the backward too
    (pool(twin, size) * cotangent).sum().backward()
    # Each gradient is a sum of at most a few window shares: a few ulps.
    torch.testing.assert_close(x.grad, twin.grad, rtol=1e-6, atol=1e-6)
