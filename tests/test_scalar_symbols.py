"""A Python number that sizes no tensor (dynamic/scalar_symbols.py): the graph
compiles once, the number reaches the device as a 0-d tensor, numbers it
returns are computed in Python.

Each test calls with several values of the number after the one Dynamo
specialised on, so the graph under test is the one with the SymInt input.
Results are compared with eager exactly where they are integers and at
torch.testing's float32 defaults otherwise; ``strict`` makes any op left to
eager PyTorch an error, so a passing call ran on the device.
"""

from __future__ import annotations

import torch
from torch.fx.experimental.proxy_tensor import make_fx

import tpu_inductor.report as report
from tpu_inductor.dynamic import scalar_symbols

OPTIONS = {"cache": False, "strict": True}


def compiled(fn):
    return torch.compile(fn, backend="tpu", options=OPTIONS)


class SlidingCounter:
    """The pattern of transformers' sliding-window static cache: a Python int
    count of the tokens seen, read by the step and advanced by it."""

    def __init__(self) -> None:
        self.seen = 0
        self.keys = torch.zeros(1, 8)


def step(counter: SlidingCounter, x: torch.Tensor) -> torch.Tensor:
    positions = torch.arange(x.shape[-1]) + counter.seen
    counter.seen += x.shape[-1]
    counter.keys.copy_(counter.keys.roll(-1, dims=-1))
    return x * 2 + positions


def test_a_count_read_and_advanced_by_each_step_compiles_once():
    eager_counter, tpu_counter = SlidingCounter(), SlidingCounter()
    fn = compiled(step)
    for value in range(6):
        x = torch.full((1, 4), float(value))
        torch.testing.assert_close(fn(tpu_counter, x), step(eager_counter, x))
        assert tpu_counter.seen == eager_counter.seen and type(tpu_counter.seen) is int
    assert report.current().dynamic_graphs == []  # no bucket for a number that sizes nothing
    counts = report.compile_counts()
    assert counts["xla_compiles"] == 2, counts  # the first trace at seen=0, the one with the SymInt
    assert sum(g.executions for g in report.current().graphs) == 6


def test_integer_and_bool_tensors_keep_the_dtype_a_python_number_gives():
    def f(ints, flags, n):
        return ints + n, flags + n, ints * n > 7

    fn = compiled(f)
    ints = torch.arange(6, dtype=torch.int32)
    flags = torch.tensor([True, False, True])
    for n in (1, 2, 3, 4):
        got, want = fn(ints, flags, n), f(ints, flags, n)
        for g, w in zip(got, want):
            assert g.dtype == w.dtype and torch.equal(g, w), (n, g, w)
    assert report.current().dynamic_graphs == []


def test_a_number_beside_a_padded_dim_is_not_bucketed():
    """The rows are bucketed (a symbol that sizes a tensor); the offset is not
    among the bucketed symbols and is read at its real value."""

    def f(x, offset):
        return x.sin() + offset, offset + 1

    fn = torch.compile(f, backend="tpu", options=OPTIONS, dynamic=True)
    for rows, offset in [(3, 5), (5, 9), (6, 2), (7, 11)]:
        x = torch.randn(rows, 4)
        got, number = fn(x, offset)
        torch.testing.assert_close(got, f(x, offset)[0])
        assert number == offset + 1
    (dynamic,) = report.current().dynamic_graphs
    sources = [*dynamic.padded.values(), *dynamic.exact]
    assert "L['x'].size()[0]" in sources and not any("offset" in source for source in sources), sources


def _symbolic_graph(fn, *inputs):
    return make_fx(fn, tracing_mode="symbolic")(*inputs)


def test_the_plan_leaves_a_number_that_sizes_a_tensor_to_the_buckets():
    gm = _symbolic_graph(lambda x, n: x[:n] * 2, torch.randn(8, 3), 4)
    assert scalar_symbols.plan(gm) is None


def test_the_plan_leaves_a_number_passed_where_only_a_scalar_goes():
    gm = _symbolic_graph(lambda x, n: torch.clamp(x, max=n), torch.randn(8), 4)
    assert scalar_symbols.plan(gm) is None


def test_a_number_passed_where_only_a_scalar_goes_stays_right():
    def f(x, n):
        return torch.clamp(x, max=n) * 2

    fn = torch.compile(f, backend="tpu", options={"cache": False})
    for n in (1, 2, 3):
        x = torch.randn(8) * 4
        torch.testing.assert_close(fn(x, n), f(x, n))


def gelu_tanh(x: torch.Tensor) -> torch.Tensor:
    """GPT-2's GELU (transformers' ``NewGELUActivation``): ``math.pi`` is a float
    Dynamo traces symbolically under ``dynamic=True`` and divides as a tensor."""
    import math

    return 0.5 * x * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * torch.pow(x, 3.0))))


def test_python_float_arithmetic_under_dynamic_true_runs_on_the_device():
    # strict: the 0-d true_divide Dynamo writes for 2.0 / math.pi failed to
    # lower and ran eagerly before passes/true_divide_as_div.py.
    fn = torch.compile(gelu_tanh, backend="tpu", options=OPTIONS, dynamic=True)
    for rows in (5, 9):
        x = torch.randn(rows, 3)
        torch.testing.assert_close(fn(x), gelu_tanh(x))
    assert report.current().fallbacks() == []
