"""Grouped matmuls (MoE experts) lower as dense math and equal eager's loop.

The reference is the loop every eager implementation runs: one matmul per
expert over its row block. Each output row is one K-long dot product in both,
so float32 results agree to a few ULPs (torch.testing's float32 defaults).
"""

from __future__ import annotations

import pytest
import torch

import tpu_inductor.report as report
from tpu_inductor.decompositions.grouped_matmul import grouped_mm, grouped_mm_backward

OPTIONS = {"cache": False}

# Experts 1 and 3 own no rows; rows 9..10 lie past the last offset (no expert).
OFFSETS = torch.tensor([3, 3, 9, 9], dtype=torch.int32)
ROWS, K, N = 11, 8, 4


def loop_reference(input: torch.Tensor, weight: torch.Tensor, offs: torch.Tensor) -> torch.Tensor:
    out = torch.zeros(input.shape[0], weight.shape[2], dtype=input.dtype)
    start = 0
    for expert, end in enumerate(offs.tolist()):
        out[start:end] = input[start:end] @ weight[expert]
        start = end
    return out


def test_each_row_uses_its_own_expert():
    input, weight = torch.randn(ROWS, K), torch.randn(len(OFFSETS), K, N)
    torch.testing.assert_close(grouped_mm(input, weight, OFFSETS), loop_reference(input, weight, OFFSETS))


def test_inf_in_one_row_stays_in_that_row():
    input, weight = torch.randn(ROWS, K), torch.randn(len(OFFSETS), K, N)
    input[0, 0] = float("inf")
    out = grouped_mm(input, weight, OFFSETS)
    torch.testing.assert_close(out, loop_reference(input, weight, OFFSETS))
    assert torch.isfinite(out[1:]).all()


def test_backward_equals_autograd_of_the_loop():
    input = torch.randn(ROWS, K, requires_grad=True)
    weight = torch.randn(len(OFFSETS), K, N, requires_grad=True)
    grad_output = torch.randn(ROWS, N)
    loop_reference(input, weight, OFFSETS).backward(grad_output)
    grad_input, grad_weight = grouped_mm_backward(input.detach(), weight.detach(), OFFSETS, grad_output)
    torch.testing.assert_close(grad_input, input.grad)
    torch.testing.assert_close(grad_weight, weight.grad)


def test_aten_grouped_mm_is_fully_lowered():
    def experts(input, weight, offs):
        return torch.nn.functional.grouped_mm(input, weight, offs=offs).relu()

    # PyTorch traces aten._grouped_mm for bfloat16 with 16-byte strides only.
    # Rows are rounded to bfloat16 once in both (torch.testing's bfloat16 tolerance).
    input = torch.randn(ROWS, K, dtype=torch.bfloat16)
    weight = torch.randn(len(OFFSETS), K, 2 * N, dtype=torch.bfloat16)
    # Eager's kernel leaves rows past the last offset unwritten, so every row has an expert here.
    offsets = torch.tensor([3, 3, 9, ROWS], dtype=torch.int32)
    compiled = torch.compile(experts, backend="tpu", options=OPTIONS)
    torch.testing.assert_close(compiled(input, weight, offsets), experts(input, weight, offsets))
    assert report.current().fallbacks() == []


def test_aten_grouped_mm_trains_fully_lowered():
    """Autograd's backward of ``aten._grouped_mm`` calls it again over the
    contracted dim (``_grouped_mm(input.T, grad, offs)``: each expert's weight
    gradient from its rows), which bfloat16 MoE models train through. One
    bfloat16 rounding of each float32 sum in both (torch.testing's bfloat16
    tolerance)."""

    def experts(input, weight, offs):
        return torch.nn.functional.grouped_mm(input, weight, offs=offs)

    input = torch.randn(ROWS, K, dtype=torch.bfloat16, requires_grad=True)
    weight = torch.randn(len(OFFSETS), K, 2 * N, dtype=torch.bfloat16, requires_grad=True)
    offsets = torch.tensor([3, 3, 9, ROWS], dtype=torch.int32)  # expert 1 owns no row: a zero gradient
    grad_output = torch.randn(ROWS, 2 * N, dtype=torch.bfloat16)
    expected_grads = torch.autograd.grad(experts(input, weight, offsets), (input, weight), grad_output)
    report.reset()
    actual = torch.compile(experts, backend="tpu", options=OPTIONS)(input, weight, offsets)
    actual_grads = torch.autograd.grad(actual, (input, weight), grad_output)
    for got, want in zip(actual_grads, expected_grads):
        torch.testing.assert_close(got, want)
    assert not actual_grads[1][1].any()
    assert report.current().fallbacks() == [] and len(report.current().islands()) == 2  # forward and backward


def test_transformers_fallback_op_trains_fully_lowered():
    pytest.importorskip("transformers")
    import transformers.integrations.moe  # noqa: F401  (registers the op)

    def experts(input, weight, offs):
        return (torch.ops.transformers.grouped_mm_fallback(input, weight, offs).tanh() ** 2).sum()

    input = torch.randn(ROWS, K, requires_grad=True)
    weight = torch.randn(len(OFFSETS), K, N, requires_grad=True)
    expected = experts(input, weight, OFFSETS)
    expected_grads = torch.autograd.grad(expected, (input, weight))

    report.reset()
    actual = torch.compile(experts, backend="tpu", options=OPTIONS)(input, weight, OFFSETS)
    actual_grads = torch.autograd.grad(actual, (input, weight))
    torch.testing.assert_close(actual, expected)
    for got, want in zip(actual_grads, expected_grads):
        torch.testing.assert_close(got, want)
    assert report.current().fallbacks() == []
