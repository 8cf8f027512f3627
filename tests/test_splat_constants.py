"""Pointwise ops on constants of one value, computed by PyTorch before
torch-mlir folds them (passes/splat_constants.py): each case gave a wrong
number, with no fallback, before."""

from __future__ import annotations

import operator

import pytest
import torch

import tpu_inductor.report as report

F = torch.nn.functional


def exact(fn, *args):
    got = torch.compile(fn, backend="tpu", options={"cache": False})(*args)
    assert [f.op for f in report.current().fallbacks()] == []
    assert report.current().islands()
    torch.testing.assert_close(got, fn(*args), rtol=0, atol=0)


COMPARISONS = {"eq": operator.eq, "ne": operator.ne, "lt": operator.lt, "le": operator.le, "gt": operator.gt, "ge": operator.ge}
CONSTANT_AGAINST_NUMBER = {
    # name: (fill, dtype, number). torch-mlir folded the first three wrongly
    # (each of the six comparisons gave one answer whatever the values), and
    # crashed (SIGSEGV) on the last two, which then ran in eager.
    "float_vs_equal_int": (1.0, torch.float32, 1),
    "float_vs_smaller_int": (2.0, torch.float32, -3),
    "bool_vs_int": (True, torch.bool, 1),
    "int_vs_float": (2, torch.int64, 2.5),
    "bool_vs_float": (True, torch.bool, 0.5),
}


# In the default run, one case that folded wrongly and one that crashed; the rest under ``-m slow``.
DEFAULT_CASES = ("float_vs_equal_int", "int_vs_float")


@pytest.mark.parametrize(
    "case",
    [pytest.param(c, marks=() if c in DEFAULT_CASES else pytest.mark.slow) for c in sorted(CONSTANT_AGAINST_NUMBER)],
)
@pytest.mark.parametrize("comparison", sorted(COMPARISONS))
def test_constant_compared_with_a_number(comparison, case):
    fill, dtype, number = CONSTANT_AGAINST_NUMBER[case]
    compare = COMPARISONS[comparison]
    # The input keeps the island from being all constants.
    exact(lambda x: compare(torch.full((4,), fill, dtype=dtype), number) | (x > 5), torch.ones(4))


@pytest.mark.parametrize(
    "arithmetic",
    [
        lambda c: c + (-3),  # gave 1.8e19: -3 read as an unsigned 64-bit int
        lambda c: c * (-3),
        lambda c: (c - 1).abs() - 3,
        lambda c: torch.addcmul(c, c, c, value=-3),
        lambda c: torch.sign(c - 0.5),  # gave -1
        lambda c: torch.sign(c - 1),  # gave 1
        lambda c: torch.where(c > 0, c.to(torch.int32) * -2, 7),
        lambda c: c.expand(2, 4).t() * -1,
    ],
    ids=["add", "mul", "abs_sub", "addcmul", "sign", "sign_of_zero", "where_int", "view_of_splat"],
)
@pytest.mark.parametrize("dtype", [torch.float32, pytest.param(torch.bfloat16, marks=pytest.mark.slow)])
def test_arithmetic_on_a_constant(arithmetic, dtype):
    exact(lambda x: (arithmetic(torch.ones(4, dtype=dtype)), x + 1), torch.ones(4))


def test_cosine_embedding_loss_with_a_built_target():
    """``cosine_embedding_loss(..., torch.ones(n))`` selects by ``target == 1``: it returned 0."""
    generator = torch.Generator().manual_seed(0)
    x, y = torch.randn(3, 7, generator=generator), torch.randn(3, 7, generator=generator)
    fn = lambda x, y: F.cosine_embedding_loss(x, y, torch.ones(3))  # noqa: E731
    got = torch.compile(fn, backend="tpu", options={"cache": False})(x, y)
    assert report.current().fallbacks() == []
    torch.testing.assert_close(got, fn(x, y))
