"""bfloat16/float16 ops compute in float32 and round once, as eager's kernels do
(lowering/half_floats_in_float32.py).

The verdict is each result's distance to the same op computed in float32 from
the same half-precision inputs (what both eager and the device round), element
by element and relative: the device may be no further from it than eager plus
one ulp of the result's type.
Before the rewrite these reductions and composite ops were 10-130x further
than eager (a bf16 avg_pool over 32x32 windows returned half its answer).
"""

from __future__ import annotations

import pytest
import torch
from torch.fx.experimental.proxy_tensor import make_fx

import tpu_inductor.report as report
from benchmarks.sweep_common import float32_verdict
from tpu_inductor.lowering.half_floats_in_float32 import compute_half_floats_in_float32

F = torch.nn.functional
aten = torch.ops.aten
convert = torch.ops.prims.convert_element_type.default

def _inputs(dtype: torch.dtype, shape: tuple[int, ...], low: float, high: float) -> torch.Tensor:
    generator = torch.Generator().manual_seed(0)
    return (torch.rand(shape, generator=generator) * (high - low) + low).to(dtype)


CASES = {
    "avg_pool2d over 32x32": (lambda x: F.avg_pool2d(x, 32), (2, 4, 64, 64), 0.0, 1.0),
    "avg_pool1d over 512": (lambda x: F.avg_pool1d(x, 512), (2, 4, 2048), 0.0, 1.0),
    "lp_pool2d": (lambda x: F.lp_pool2d(x, 2, 16), (2, 4, 64, 64), 0.0, 1.0),
    "gelu": (F.gelu, (64, 256), -4.0, 4.0),
    "gelu tanh": (lambda x: F.gelu(x, approximate="tanh"), (64, 256), -4.0, 4.0),
    "elu": (F.elu, (64, 256), -4.0, 4.0),
    "vector_norm ord 1": (lambda x: torch.linalg.vector_norm(x, 1, dim=-1), (8, 2048), 0.0, 1.0),
    "vector_norm ord 3.5": (lambda x: torch.linalg.vector_norm(x, 3.5, dim=-1), (8, 2048), 0.0, 30.0),
}


def assert_as_close_to_float32_as_eager(fn, x: torch.Tensor, out: torch.Tensor) -> None:
    """The OpInfo sweep's verdict on half precision: relative to each element,
    floored at a thousandth of the largest (gelu's small negative tail is where
    rounding each step in bf16 cancels)."""
    eager = fn(x)
    assert out.dtype == eager.dtype == x.dtype
    assert float32_verdict(out, eager, fn(x.float())) is not None


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=str)
@pytest.mark.parametrize("name", sorted(CASES))
def test_half_precision_ops_are_as_close_to_float32_as_eager(name, dtype):
    fn, shape, low, high = CASES[name]
    x = _inputs(dtype, shape, low, high)
    out = torch.compile(fn, backend="tpu", options={"cache": False, "strict": True})(x)
    assert_as_close_to_float32_as_eager(fn, x, out)
    assert report.current().islands() and report.current().fallbacks() == []


def _graph(fn, *args) -> torch.fx.GraphModule:
    return make_fx(fn, tracing_mode="fake")(*args)


def test_an_op_reads_float32_operands_and_its_result_is_rounded_back_once():
    x = torch.randn(4, 8, dtype=torch.bfloat16)
    gm = _graph(lambda a: (lambda g: (g + 1, g * 2))(F.gelu(a)), x)
    assert compute_half_floats_in_float32(gm) == 3  # gelu, add and mul
    gelu = gm.graph.find_nodes(op="call_function", target=aten.gelu.default)[0]
    assert gelu.args[0].target is convert and gelu.args[0].args[1] == torch.float32
    assert gelu.meta["val"].dtype == torch.float32
    (rounded,) = gelu.users  # read twice: stored in bfloat16, as eager and Inductor store it
    assert rounded.target is convert and rounded.args[1] == torch.bfloat16
    for output in gm.graph.output_node().all_input_nodes:
        assert output.target is convert and output.meta["val"].dtype == torch.bfloat16
    expected = (F.gelu(x) + 1, F.gelu(x) * 2)
    torch.testing.assert_close(gm(x), expected, rtol=0, atol=0)  # eager's arithmetic, bit for bit here
    assert compute_half_floats_in_float32(gm) == 0  # nothing half is computed any more


def test_a_chain_read_once_rounds_once_as_inductor_fuses_it():
    """Dynamo hands ``addcdiv(x, a, b, value=v)`` over as ``x + (a / b) * v``:
    rounded after each op, float16's OpInfo sample was 2.7 ulps from eager's
    one rounding. A sum divided (a mean, decomposed) is one rounding too."""
    x, a, b = (_inputs(torch.float16, (64,), low, high) for low, high in ((4.0, 6.0), (2.0, 4.0), (-0.1, -0.05)))
    gm = _graph(lambda x, a, b: x + (a / b) * 3.14, x, a, b)
    assert compute_half_floats_in_float32(gm) == 3
    roundings = [n for n in gm.graph.nodes if n.target is convert and n.args[1] == torch.float16]
    assert len(roundings) == 1
    rounded_once = (x.float() + (a.float() / b.float()) * 3.14).to(torch.float16)
    torch.testing.assert_close(gm(x, a, b), rounded_once, rtol=0, atol=0)

    gm = _graph(lambda x: (lambda e: (e.sum(-1) / 3, e + 1))(x.exp()), x.reshape(8, 8))
    assert compute_half_floats_in_float32(gm) == 4
    roundings = [n for n in gm.graph.nodes if n.target is convert and n.args[1] == torch.float16]
    assert len(roundings) == 3  # exp (read twice), then one for each output


def test_moves_products_float32_graphs_and_tuple_results():
    x = torch.randn(4, 8, dtype=torch.bfloat16)
    w = torch.randn(8, 8, dtype=torch.bfloat16)
    gm = _graph(lambda a, b: torch.cat([a.t().t(), (a @ b).relu()]).amax(0), x, w)
    assert compute_half_floats_in_float32(gm) == 0  # views, a matmul and exact ops: left as traced
    assert compute_half_floats_in_float32(_graph(lambda a: a.exp() + 1, x.float())) == 0

    gm = _graph(lambda a: torch.var_mean(a, 1), x)
    assert compute_half_floats_in_float32(gm) == 1
    variance, mean = gm(x)
    assert variance.dtype == mean.dtype == torch.bfloat16
    expected = torch.var_mean(x.float(), 1)
    torch.testing.assert_close((variance, mean), tuple(e.to(torch.bfloat16) for e in expected), rtol=0, atol=0)


def test_symbolic_graphs_compute_in_float32_too():
    """The dynamic-shape path (lowering/symbolic.py) imports its islands itself."""
    compiled = torch.compile(F.gelu, backend="tpu", dynamic=True, options={"cache": False, "strict": True})
    for rows in (48, 64):
        x = _inputs(torch.bfloat16, (rows, 256), -4.0, 4.0)
        assert_as_close_to_float32_as_eager(F.gelu, x, compiled(x))  # 0.77 off, relative, at -4 before
    assert report.current().dynamic_graphs


def test_rounding_to_decimals_is_eagers_to_the_bit():
    """``round(x, decimals=2)`` scales, rounds and scales back: not an exact op.
    Computed in bfloat16, a tenth of the results were a bf16 ulp off eager's."""
    x = _inputs(torch.bfloat16, (1000,), 0.0, 10.0)
    compiled = torch.compile(lambda a: torch.round(a, decimals=2), backend="tpu", options={"cache": False})
    assert torch.equal(compiled(x), torch.round(x, decimals=2))
