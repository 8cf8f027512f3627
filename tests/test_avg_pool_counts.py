"""Average pools whose divisor is not the window size: eager's values, on the device.

Excluding padding, the divisor used to be a reduce_window over ones of the
input's full size, which XLA constant-folds element by element (90-124 s of
compile for a [32, 384, 25, 25] PoolFormer pool): the structural test
asserts the counted plane is [1, 1, H, W] (padded); no test times the
compile. ceil_mode windows past the padding and divisor_override ran
eagerly (torch-mlir's shape inference disagreed, or it refused the override).
"""

from __future__ import annotations

import pytest
import torch
from torch.fx.experimental.proxy_tensor import make_fx

import tpu_inductor.report as report
from tpu_inductor.decompositions.avg_pool_counts import AVG_POOL_DECOMPOSITIONS

F = torch.nn.functional


@pytest.mark.parametrize(
    "pool, shape, kwargs",
    [
        (F.avg_pool2d, (2, 3, 9, 7), dict(kernel_size=3, stride=1, padding=1)),
        (F.avg_pool2d, (1, 2, 8, 8), dict(kernel_size=(3, 2), stride=(2, 1), padding=(1, 1))),
        (F.avg_pool2d, (1, 2, 10, 6), dict(kernel_size=4, stride=3, padding=2)),
        (F.avg_pool3d, (1, 2, 5, 6, 7), dict(kernel_size=3, stride=2, padding=1)),
        # torch-mlir's e2e AvgPool2dCeilModeFullDimIndivisibleByStrideModule and kin
        (F.avg_pool2d, (1, 1, 50, 50), dict(kernel_size=3, stride=2, padding=1, ceil_mode=True, count_include_pad=True)),
        (F.avg_pool2d, (2, 3, 7, 8), dict(kernel_size=2, stride=3, ceil_mode=True)),
        (F.avg_pool3d, (1, 1, 5, 7, 6), dict(kernel_size=(2, 3, 2), stride=(2, 2, 3), padding=1, ceil_mode=True)),
        (F.avg_pool2d, (1, 2, 8, 8), dict(kernel_size=2, divisor_override=3)),
        (F.avg_pool3d, (1, 2, 4, 4, 4), dict(kernel_size=2, stride=1, padding=1, divisor_override=2)),
    ],
)
def test_pools_with_other_divisors_match_eager_on_the_device(pool, shape, kwargs):
    x = torch.randn(shape)
    kwargs = {"count_include_pad": False, **kwargs}

    def fn(a):
        return pool(a, **kwargs)

    out = torch.compile(fn, backend="tpu", options={"cache": False})(x)
    # Sums of at most 27 values of order 1 divided by an exact count: a few ulps.
    torch.testing.assert_close(out, fn(x))
    assert report.current().fallbacks() == [] and report.current().islands()


def test_the_divisor_is_counted_on_one_plane_not_the_whole_input():
    x = torch.randn(4, 96, 25, 25)
    gm = make_fx(
        lambda a: F.avg_pool2d(a, 3, 1, 1, count_include_pad=False), decomposition_table=AVG_POOL_DECOMPOSITIONS
    )(x)
    pools = gm.graph.find_nodes(op="call_function", target=torch.ops.aten.avg_pool2d.default)
    assert sorted(tuple(p.args[0].meta["val"].shape) for p in pools) == [(1, 1, 27, 27), (4, 96, 27, 27)]
    assert all(len(p.args) < 4 or p.args[3] == [0, 0] for p in pools)  # padded explicitly: every window is full


@pytest.mark.parametrize(
    "pool, kwargs",
    [
        (F.avg_pool1d, dict(kernel_size=3, stride=1, padding=1, ceil_mode=True, count_include_pad=False)),
        (F.avg_pool2d, dict(kernel_size=3, stride=1, padding=1, count_include_pad=False)),
        (F.avg_pool2d, dict(kernel_size=2, divisor_override=3)),
        (F.avg_pool3d, dict(kernel_size=2, stride=1, padding=1, ceil_mode=True)),
    ],
)
def test_integer_pools_truncate_each_exact_window_sum_as_eager(pool, kwargs):
    """An integer pool truncates its mean toward zero: taken as the pool times
    its size, the remainder was lost (int64 avg_pool1d gave 0 for -2 / 2) and
    counts of 2 / 3 became 0 (results of INT64_MAX); OpInfo's slow claims found it."""
    spatial = {F.avg_pool1d: (9,), F.avg_pool2d: (7, 6), F.avg_pool3d: (4, 5, 3)}[pool]
    x = torch.randint(-9, 10, (2, 3, *spatial), generator=torch.Generator().manual_seed(0))

    def fn(a):
        return pool(a, **kwargs)

    out = torch.compile(fn, backend="tpu", options={"cache": False, "strict": True})(x)
    assert torch.equal(out, fn(x))
    assert report.current().islands() and report.current().fallbacks() == []
