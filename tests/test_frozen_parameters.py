"""``freeze_parameters``: what depends only on parameters is computed once and
reused while they are unchanged (analysis/frozen_parameters.py,
compiled_graph.ReusedResults).

Results are compared with eager at rtol/atol 1e-5: the frozen island is the
same computation run once instead of every call; BatchNorm folded into a
convolution (passes/conv_epilogue.py) is only in the CNN test, at that
file's tolerance.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch.fx.experimental.proxy_tensor import make_fx

import tpu_inductor.report as report
from tpu_inductor.analysis.frozen_parameters import parameter_only_nodes
from tpu_inductor.reporting.summary import summarize

aten = torch.ops.aten
TOLERANCE = {"rtol": 1e-5, "atol": 1e-5}


class ScaledLinear(torch.nn.Module):
    """A weight normalised on every call (weight norm), a bias, and one
    parameter-only value handed back to the caller."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.direction = torch.nn.Parameter(torch.randn(16, 16))
        self.gain = torch.nn.Parameter(torch.rand(16) + 0.5)
        self.bias = torch.nn.Parameter(torch.randn(16))

    def forward(self, x):
        weight = self.direction * (self.gain / self.direction.norm(dim=1)).unsqueeze(1)
        return F.linear(x, weight, self.bias).relu(), self.bias * 2


def _kept_islands():
    return [i for g in report.current().graphs for i in g.islands if i.results_kept]


def _compiled(model, **options):
    return torch.compile(model, backend="tpu", options={"cache": False, "freeze_parameters": True, **options})


def test_parameter_work_runs_once_and_matches_eager():
    model, x = ScaledLinear(), torch.randn(4, 16)
    compiled = _compiled(model)
    with torch.no_grad():
        for _ in range(3):
            for actual, expected in zip(compiled(x), model(x)):
                torch.testing.assert_close(actual, expected, **TOLERANCE)
    (kept,) = _kept_islands()
    assert kept.executions == 1  # three calls, one computation
    assert "aten.linalg_vector_norm.default" in kept.ops
    assert "parameter-only work kept (1 computations)" in summarize(report.current())


def test_in_place_updates_and_replaced_parameters_are_seen():
    model, x = ScaledLinear(), torch.randn(4, 16)
    compiled = _compiled(model)
    with torch.no_grad():
        compiled(x)
        model.gain.mul_(3)  # an optimizer step writes like this: the version counter moves
        torch.testing.assert_close(compiled(x)[0], model(x)[0], **TOLERANCE)
        model.direction = torch.nn.Parameter(torch.randn(16, 16))  # a new tensor object
        torch.testing.assert_close(compiled(x)[0], model(x)[0], **TOLERANCE)
        compiled(x)
    (kept,) = _kept_islands()
    assert kept.executions == 3


def test_values_returned_to_the_caller_are_not_kept():
    """``bias * 2`` goes back to the caller, who may write into it."""
    model, x = ScaledLinear(), torch.randn(4, 16)
    compiled = _compiled(model)
    with torch.no_grad():
        _, doubled = compiled(x)
        doubled.zero_()
        torch.testing.assert_close(compiled(x)[1], model.bias * 2)


def test_off_by_default():
    model, x = ScaledLinear(), torch.randn(4, 16)
    with torch.no_grad():
        torch.compile(model, backend="tpu", options={"cache": False})(x)
    assert _kept_islands() == []


def _linear_graph():
    def linear(x, weight, scale):
        return x @ weight.t(), x * (scale * 2)

    gm = make_fx(linear)(torch.randn(2, 4), torch.randn(3, 4), torch.randn(4))
    _, weight, scale = gm.graph.find_nodes(op="placeholder")
    return gm, weight, scale


def test_transposed_weights_are_not_copies_to_keep():
    """``t(weight)`` before a matmul is a view XLA folds into the dot: keeping
    it would hold a second copy of the weight."""
    gm, weight, scale = _linear_graph()
    assert [n.target for n in parameter_only_nodes(gm, [weight, scale])] == [aten.mul.Tensor]


def test_a_linear_reads_its_weight_in_place():
    """Through torch.compile on the CPU client: no transposed copy of the
    weights is kept (the dot reads them in place), and results match eager."""
    torch.manual_seed(0)
    model, x = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 4)), torch.randn(8, 16)
    compiled = _compiled(model)
    with torch.no_grad():
        for _ in range(3):
            torch.testing.assert_close(compiled(x), model(x), **TOLERANCE)
    assert _kept_islands() == []


class SharedView(torch.nn.Module):
    """``t(weight)`` is read by the matmul and by parameter-only work."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.weight = torch.nn.Parameter(torch.randn(8, 16))

    def forward(self, x):
        transposed = self.weight.t()
        return x @ transposed + (transposed * 2).sum(0)


def test_a_view_shared_with_other_readers_is_copied_for_the_kept_work():
    """One node cannot be in two islands: the kept work reads its own copy of
    the view, the matmul keeps the original (no island boundary, no cycle)."""
    model, x = SharedView(), torch.randn(4, 16)
    compiled = _compiled(model)
    with torch.no_grad():
        for _ in range(2):
            torch.testing.assert_close(compiled(x), model(x), **TOLERANCE)
    (kept,) = _kept_islands()
    assert kept.executions == 1 and "aten.mm.default" not in kept.ops

    def shared_view(x, weight):
        transposed = weight.t()
        return x @ transposed + (transposed * 2).sum(0)

    gm = make_fx(shared_view)(x, model.weight.detach())
    _, weight = gm.graph.find_nodes(op="placeholder")
    frozen = parameter_only_nodes(gm, [weight])
    views = [n for n in gm.graph.nodes if n.target in (aten.t.default, aten.permute.default)]
    assert len(views) == 2  # the original for the matmul, a copy for the kept work
    assert sum(v in frozen for v in views) == 1
