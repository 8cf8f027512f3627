"""Matmul operands laid out for XLA:CPU (lowering/cpu_dot_operands.py): a
transposed right operand is read in place, a weight gradient's transposed
left operand is materialised.

Values are compared at torch.testing's float32 defaults: both rewrites only
change where (or whether) a transpose is materialised, not the products summed.
"""

from __future__ import annotations

import pytest
import torch
from torch.fx.experimental.proxy_tensor import make_fx

import tpu_inductor.report as report
from tpu_inductor.lowering.cpu_dot_operands import fold_transposed_rhs
from tpu_inductor.lowering.refine import _context
from tpu_inductor.lowering.stablehlo import lower_to_stablehlo
from tpu_inductor.reporting.files import stablehlo_text


def weight_gradient(grad_out, activations):
    return torch.mm(grad_out.t(), activations)


def _lowered_text(fn, *args, for_cpu: bool) -> str:
    gm = make_fx(fn, tracing_mode="fake")(*args)
    return stablehlo_text(lower_to_stablehlo(gm, for_cpu=for_cpu).module)


def test_transposed_left_operand_is_materialised_for_cpu():
    args = torch.randn(16, 128), torch.randn(16, 96)
    assert _lowered_text(weight_gradient, *args, for_cpu=True).count("stablehlo.optimization_barrier") == 1
    assert "optimization_barrier" not in _lowered_text(weight_gradient, *args, for_cpu=False)


@pytest.mark.parametrize(
    "fn, shapes",
    [
        (weight_gradient, [(16, 128), (16, 32)]),  # the other side is under 64 wide: not worth the copy
        (lambda a, b: torch.mm(a, b), [(128, 16), (16, 96)]),  # no transpose to keep
        (lambda a, b: torch.bmm(a.transpose(1, 2), b), [(2, 16, 128), (2, 16, 96)]),  # batched: left alone
    ],
)
def test_other_dots_are_left_alone(fn, shapes):
    args = [torch.randn(s) for s in shapes]
    assert "optimization_barrier" not in _lowered_text(fn, *args, for_cpu=True)


def test_training_step_gradients_match_eager(tmp_path):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(96, 128), torch.nn.ReLU(), torch.nn.Linear(128, 96))
    compiled_model = torch.nn.Sequential(torch.nn.Linear(96, 128), torch.nn.ReLU(), torch.nn.Linear(128, 96))
    compiled_model.load_state_dict(model.state_dict())
    x = torch.randn(16, 96)
    model(x).square().mean().backward()
    options = {"cache": False, "report_dir": str(tmp_path)}
    compiled = torch.compile(compiled_model, backend="tpu", options=options)
    compiled(x).square().mean().backward()
    for p, q in zip(model.parameters(), compiled_model.parameters()):
        torch.testing.assert_close(q.grad, p.grad)
    assert [g.kind for g in report.current().graphs] == ["forward", "backward"]
    (backward,) = tmp_path.glob("*/stablehlo/g1-island_0.mlir")
    # Two weight gradients; the first layer's input gradient is not needed.
    assert backward.read_text().count("stablehlo.optimization_barrier") == 2


def linear(x, weight, bias):
    return torch.nn.functional.linear(x, weight, bias)


def test_linear_reads_its_weight_in_place_for_cpu():
    args = torch.randn(1, 96), torch.randn(128, 96), torch.randn(128)
    folded = _lowered_text(linear, *args, for_cpu=True)
    assert "stablehlo.transpose" not in folded
    assert "contracting_dims = [1] x [1]" in folded
    assert "stablehlo.transpose" in _lowered_text(linear, *args, for_cpu=False)


def test_batched_transposed_keys_are_read_in_place():
    args = torch.randn(2, 1, 16), torch.randn(2, 8, 16)
    folded = _lowered_text(lambda q, k: torch.bmm(q, k.transpose(1, 2)), *args, for_cpu=True)
    assert "stablehlo.transpose" not in folded
    assert "contracting_dims = [2] x [2]" in folded


_SWAPPED_FREE_DIMS = """
func.func @main(%x: tensor<4x8xf32>, %w: tensor<8x3x5xf32>) -> tensor<4x5x3xf32> {
  %t = stablehlo.transpose %w, dims = [0, 2, 1] : (tensor<8x3x5xf32>) -> tensor<8x5x3xf32>
  %y = stablehlo.dot_general %x, %t, contracting_dims = [1] x [0] : (tensor<4x8xf32>, tensor<8x5x3xf32>) -> tensor<4x5x3xf32>
  return %y : tensor<4x5x3xf32>
}
"""


def test_a_transpose_that_reorders_the_result_stays():
    """Reading ``%w`` in place would give a 4x3x5 result: the fold must not apply."""
    from torch_mlir import ir

    with _context():
        module = ir.Module.parse(_SWAPPED_FREE_DIMS)
        assert fold_transposed_rhs(module) == 0
        assert "stablehlo.transpose" in str(module)


@pytest.mark.parametrize("batch", [1, 2])
def test_mlp_at_batch_one_matches_eager(batch):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(96, 128), torch.nn.ReLU(), torch.nn.Linear(128, 64)).eval()
    x = torch.randn(batch, 96)
    compiled = torch.compile(model, backend="tpu", options={"cache": False})
    with torch.no_grad():
        torch.testing.assert_close(compiled(x), model(x))


def _swapped(text: str) -> bool:
    """Whether a dot was computed as (W . x^T)^T: its result goes through a barrier and a transpose."""
    return "optimization_barrier" in text and "dims = [1, 0]" in text


@pytest.mark.parametrize(
    "batch, features, swapped",
    [
        (8, 512, True),  # a thin batch against a 1 MB weight: packing the weight dominates
        (512, 512, False),  # as many rows as the weight: transposing them would cost as much
        (8, 128, False),  # a small weight: the extra transpose costs more than it saves
    ],
)
def test_thin_batch_times_wide_weight_puts_the_weight_on_the_left(batch, features, swapped):
    args = torch.randn(batch, features), torch.randn(features, features), torch.randn(features)
    assert _swapped(_lowered_text(linear, *args, for_cpu=True)) == swapped
    assert not _swapped(_lowered_text(linear, *args, for_cpu=False))


def test_double_transposed_weight_reads_in_place():
    """AOTAutograd's backward reads a weight as t(t(W)): both transposes fold."""
    args = torch.randn(8, 512), torch.randn(512, 512)
    text = _lowered_text(lambda g, w: torch.mm(g, w.t().t()), *args, for_cpu=True)
    assert "stablehlo.transpose" not in text and "contracting_dims = [1] x [0]" in text


def test_swapped_linear_matches_eager():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(512, 512), torch.nn.ReLU(), torch.nn.Linear(512, 512)).eval()
    x = torch.randn(8, 512)
    compiled = torch.compile(model, backend="tpu", options={"cache": False})
    with torch.no_grad():
        torch.testing.assert_close(compiled(x), model(x))
