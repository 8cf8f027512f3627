"""A native crash of torch-mlir or XLA fails one lowering, not the program
(lowering/pipelines.py, runtime/isolated_compile.py).

The crashes used are real. torch-mlir emits a ``stablehlo.shift_left`` on
operands of two shapes for a broadcasting shift, and MLIR aborts the process
("LLVM ERROR: Failed to infer result type(s)"); our decomposition table
and AOTAutograd's references rewrite that shift first, so those tests build
the ATen graph themselves. XLA aborts on a broadcast to more bytes than an
int64 counts ("overflow in static extent product"), which eager PyTorch
makes as a view of one element: ``x.expand(3 * 2**60)[:4]``. jaxlib 0.11's
XLA raises an error there instead; the same graph then tests the ordinary
failed compile.
"""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch
from torch.fx.experimental.proxy_tensor import make_fx

import tpu_inductor.report as report
from torch_versions import xla_aborts_on_extent_overflow
from tpu_inductor.compiled_graph import CompileContext, compile_graph
from tpu_inductor.config import Config
from tpu_inductor.lowering.pipelines import IslandLoweringError
from tpu_inductor.lowering.stablehlo import lower_to_stablehlo

aten = torch.ops.aten
COLUMN, ROW = torch.arange(5, dtype=torch.int32).reshape(5, 1), torch.arange(5, dtype=torch.int32)
XLA_ABORTS = "def huge_view(x):\n    return x.expand(3 * 2**60)[:4] * 2 + 1\n"


def _aborting_graph() -> torch.fx.GraphModule:
    return make_fx(lambda a, b: aten.bitwise_left_shift.Tensor(a, b))(COLUMN, ROW)


def test_in_process_the_crash_ends_the_program():
    """The hazard itself, in a child process: without isolation MLIR aborts."""
    code = (
        "import torch; from torch.fx.experimental.proxy_tensor import make_fx\n"
        "from tpu_inductor.lowering.stablehlo import lower_to_stablehlo\n"
        "a, b = torch.ones(5, 1, dtype=torch.int32), torch.ones(5, dtype=torch.int32)\n"
        "gm = make_fx(lambda a, b: torch.ops.aten.bitwise_left_shift.Tensor(a, b))(a, b)\n"
        "lower_to_stablehlo(gm, isolate=False)\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert done.returncode != 0 and "LLVM ERROR" in done.stderr


def test_isolated_the_crash_is_a_lowering_error_and_the_next_lowering_works():
    with pytest.raises(IslandLoweringError, match="helper process killed by SIGABRT") as caught:
        lower_to_stablehlo(_aborting_graph())
    assert any("LLVM ERROR" in line for line in caught.value.diagnostics)
    fine = make_fx(lambda a: a.sin() + 1)(torch.ones(3))
    assert lower_to_stablehlo(fine).module  # a new helper


def test_isolated_and_in_process_lowerings_are_the_same_bytes():
    gm = make_fx(lambda a, w: torch.relu(a @ w.t()) > 0)(torch.randn(4, 8), torch.randn(16, 8))
    for for_cpu in (False, True):
        assert lower_to_stablehlo(gm, for_cpu=for_cpu).module == lower_to_stablehlo(
            gm, for_cpu=for_cpu, isolate=False
        ).module


def test_a_crashing_op_runs_eagerly_and_the_graph_returns_eagers_result():
    """The backend's own path for an ATen graph (placement, lowering, the
    culprit search, the eager fallback) around an op whose lowering aborts."""
    gm = make_fx(lambda a, b: aten.bitwise_left_shift.Tensor(a, b) + 1)(COLUMN, ROW)
    context = CompileContext.create(Config.load({"cache": False}), [COLUMN, ROW])
    compiled = compile_graph(gm, [COLUMN, ROW], "inference", context)
    assert torch.equal(compiled([COLUMN, ROW]), (COLUMN << ROW) + 1)
    (fallback,) = report.current().fallbacks()
    assert fallback.op == "aten.bitwise_left_shift.Tensor"
    assert "LLVM ERROR" in fallback.reason
    assert report.current().islands()  # the add still ran on the device


@pytest.mark.skipif(not xla_aborts_on_extent_overflow(), reason="this jaxlib's XLA raises an error there")
def test_in_process_an_xla_abort_ends_the_program():
    """The hazard itself, in a child process: XLA compiling in the user's process aborts it."""
    code = (
        "import torch\n" + XLA_ABORTS
        + "torch.compile(huge_view, backend='tpu', options={'cache': False, 'isolate_lowering': False})"
        "(torch.ones(1))\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert done.returncode != 0 and "overflow in static extent product" in done.stderr


def test_an_xla_abort_moves_its_ops_to_eager_and_the_rest_stays_on_the_device(caplog):
    namespace: dict = {}
    exec(XLA_ABORTS, namespace)
    huge_view, x = namespace["huge_view"], torch.randn(1)
    with caplog.at_level("INFO", logger="tpu_inductor"):
        out = torch.compile(huge_view, backend="tpu", options={"cache": False})(x)
    assert torch.equal(out, huge_view(x))
    (graph,) = report.current().graphs
    assert graph.lowering_retries >= 1
    how = "helper process killed by SIGABRT" if xla_aborts_on_extent_overflow() else "INVALID_ARGUMENT"
    assert any(r.stage == "XLA" and how in r.error for r in report.current().repros)
    assert "aten.expand.default does not lower" in caplog.text and "overflow in static extent product" in caplog.text
    (island,) = graph.islands
    assert island.ops == {"aten.mul.Tensor": 1, "aten.add.Tensor": 1} and island.executions == 1
    # The views that moved to eager are in the report, with XLA's words.
    fallbacks = report.current().fallbacks()
    assert [f.op for f in fallbacks] == ["aten.expand.default", "aten.slice.Tensor"]
    assert all("overflow in static extent product" in f.reason for f in fallbacks)
    assert "overflow in static extent product" in str(report.current()).split("Reproducers:")[1]
