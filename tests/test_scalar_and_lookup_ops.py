"""Op forms users write that ran in eager before (decompositions/table.py's
``_scalar_as_tensor``, decompositions/lookups.py, decompositions/distances.py,
passes/scalar_tensor_as_full.py): each now runs on the device (strict mode
would raise otherwise) and gives eager's values."""

from __future__ import annotations

import pytest
import torch

import tpu_inductor.report as report

aten = torch.ops.aten
T = torch.tensor


def on_device(fn, *args, rtol=0.0, atol=0.0):
    """``fn`` compiled in strict mode (an op left to eager raises), against eager."""
    compiled = torch.compile(fn, backend="tpu", options={"cache": False, "strict": True})
    got = compiled(*[a.clone() for a in args])
    assert report.current().islands() and not report.current().fallbacks()
    torch.testing.assert_close(got, fn(*[a.clone() for a in args]), rtol=rtol, atol=atol, equal_nan=True)


INTS = torch.randint(-10, 10, (3, 4))
FLOATS = torch.randn(3, 4)
BOOLS = torch.randn(3, 4) > 0

# Scalar overloads torch-mlir failed to legalize (the op ran in eager after a
# warning); the operand is a number, the other a tensor, either order.
SCALAR_FORMS = {
    "bitwise_and int": (lambda a: aten.bitwise_and.Scalar(a, 6), INTS),
    "bitwise_or int": (lambda a: aten.bitwise_or.Scalar(a, 6), INTS),
    "bitwise_xor bool": (lambda a: aten.bitwise_xor.Scalar(a, True), BOOLS),
    "number ^ tensor": (lambda a: aten.bitwise_xor.Scalar_Tensor(5, a), INTS),
    "number | tensor": (lambda a: aten.bitwise_or.Scalar_Tensor(5, a), INTS),
    "number & tensor": (lambda a: aten.bitwise_and.Scalar_Tensor(5, a), INTS),
    "number << tensor": (lambda a: aten.bitwise_left_shift.Scalar_Tensor(3, a.abs() % 8), INTS),
    "number >> tensor": (lambda a: aten.bitwise_right_shift.Scalar_Tensor(-100, a.abs() % 8), INTS),
    "number % tensor": (lambda a: aten.remainder.Scalar_Tensor(-2.5, a), FLOATS),
    "fmod int by negative int": (lambda a: torch.fmod(a, -3), INTS),
    "fmod int by float": (lambda a: torch.fmod(a, 2.5), INTS),
    "fmod float": (lambda a: torch.fmod(a, 0.7), FLOATS),
    "copysign float": (lambda a: torch.copysign(a, -1.0), FLOATS),
    "copysign int (a float result)": (lambda a: torch.copysign(a, -2), INTS),
    "copysign bool": (lambda a: torch.copysign(a, True), BOOLS),
    # PyTorch decomposes these into prims.scalar_tensor, which had no lowering.
    "xlogy by a number": (lambda a: torch.xlogy(a, 2.0), FLOATS.abs()),
    "xlog1py by a number": (lambda a: torch.special.xlog1py(a, 2.0), FLOATS),
}
DEFAULT_SCALAR_FORMS = ("bitwise_xor bool", "number >> tensor", "fmod int by negative int", "copysign bool", "xlogy by a number")


@pytest.mark.parametrize(
    "form", [pytest.param(f, marks=() if f in DEFAULT_SCALAR_FORMS else pytest.mark.slow) for f in SCALAR_FORMS]
)
def test_a_number_operand_runs_on_the_device(form):
    fn, tensor = SCALAR_FORMS[form]
    on_device(fn, tensor, rtol=1e-6, atol=1e-6)  # floats: one op each side


def test_put_writes_the_flat_positions_negative_ones_from_the_end():
    on_device(lambda a: a.put(T([0, 11, -1]), T([1.0, 2.0, 3.0])), FLOATS)
    on_device(lambda a: a.put(T([[0, 0], [7, -12]]), T([[1.0, 2.0], [3.0, 4.0]]), accumulate=True), FLOATS)


@pytest.mark.parametrize("reduce", ["add", "multiply"])
def test_scatter_with_a_reduce(reduce):
    index = T([[0, 0], [2, 0], [1, 1]])
    on_device(lambda a: a.scatter(1, index, 3.0, reduce=reduce), FLOATS, rtol=1e-6, atol=0)
    on_device(lambda a: a.scatter(1, index, a[:, 2:] * 2, reduce=reduce), FLOATS, rtol=1e-6, atol=0)


def test_searchsorted_one_sequence_and_a_batch_ties_on_each_side():
    sequence = T([1.0, 2.0, 2.0, 3.0])
    values = T([2.0, 0.0, 3.5, 2.5, 1.0])
    for kwargs in ({}, {"right": True}, {"side": "right", "out_int32": True}):
        on_device(lambda v, kwargs=kwargs: torch.searchsorted(sequence, v, **kwargs), values)
    batch = T([[1.0, 2.0, 2.0], [0.0, 0.0, 5.0]])
    for right in (False, True):
        on_device(lambda s, v, right=right: torch.searchsorted(s, v, right=right), batch, T([[2.0, 1.0], [0.0, 6.0]]))
    on_device(lambda s, v: torch.searchsorted(s, v, sorter=s.argsort()), T([3.0, 1.0, 2.0]), T([2.5, 0.0]))


@pytest.mark.parametrize("p", [1.0, 2.0, 3.0, 0.5, float("inf")])
def test_cdist_and_its_gradient_on_the_device(p):
    """Pairs at distance 0 included (a set against itself): eager's backward
    gives them a zero gradient, where a plain root's would be NaN."""
    torch.manual_seed(0)
    points = torch.randn(6, 3)

    def distances_and_gradient(x):
        x = x.clone().requires_grad_()
        distances = torch.cdist(x, torch.cat([x[:2], x[:3] + 1]), p=p)
        distances.sum().backward()
        return distances.detach(), x.grad

    # Float32 sums of three terms and their roots, eager's order or not.
    on_device(distances_and_gradient, points, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("norm_type", [2.0, 1.0])
def test_embedding_max_norm_rescales_the_rows_it_looks_up_in_place(norm_type):
    torch.manual_seed(0)
    ours = torch.nn.Embedding(10, 4, max_norm=0.8, norm_type=norm_type)
    eager = torch.nn.Embedding(10, 4, max_norm=0.8, norm_type=norm_type)
    eager.load_state_dict(ours.state_dict())
    indices = T([[1, 2, 1], [9, 0, 2]])  # a repeated row is rescaled once
    before = ours.weight.detach().clone()
    compiled = torch.compile(ours, backend="tpu", options={"cache": False, "strict": True})
    with torch.no_grad():
        got, expected = compiled(indices), eager(indices)
    assert report.current().islands() and not report.current().fallbacks()
    # One norm and one scale a row: float32 rounding of the same operations.
    torch.testing.assert_close(got, expected, rtol=1e-6, atol=1e-7)
    torch.testing.assert_close(ours.weight, eager.weight, rtol=1e-6, atol=1e-7)
    assert not torch.equal(ours.weight, before)  # rows over the norm were rescaled in place
