"""Average pools that exclude padding: eager's values, and a divisor computed on one plane.

The divisor used to be a reduce_window over ones of the input's full size,
which XLA constant-folds element by element (90-124 s of compile for a
[32, 384, 25, 25] PoolFormer pool). The structural test asserts the plane
is [1, 1, H, W]; no test times the compile.
"""

from __future__ import annotations

import pytest
import torch
from torch.fx.experimental.proxy_tensor import make_fx

import tpu_inductor.report as report
from tpu_inductor.passes.avg_pool_counts import AVG_POOL_DECOMPOSITIONS

F = torch.nn.functional


@pytest.mark.parametrize(
    "pool, shape, kwargs",
    [
        (F.avg_pool2d, (2, 3, 9, 7), dict(kernel_size=3, stride=1, padding=1)),
        (F.avg_pool2d, (1, 2, 8, 8), dict(kernel_size=(3, 2), stride=(2, 1), padding=(1, 1))),
        (F.avg_pool2d, (1, 2, 10, 6), dict(kernel_size=4, stride=3, padding=2)),
        (F.avg_pool3d, (1, 2, 5, 6, 7), dict(kernel_size=3, stride=2, padding=1)),
    ],
)
def test_pools_excluding_padding_match_eager_on_the_device(pool, shape, kwargs):
    x = torch.randn(shape)

    def fn(a):
        return pool(a, count_include_pad=False, **kwargs)

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
    assert sorted(tuple(p.args[0].meta["val"].shape) for p in pools) == [(1, 1, 25, 25), (4, 96, 25, 25)]
    assert all(p.args[5] if len(p.args) > 5 else True for p in pools)  # every pool counts padding now
