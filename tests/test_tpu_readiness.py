"""TPU readiness on XLA:CPU: what a TPU could not run is found, and what we emit avoids it.

lowering/tpu_readiness.py reads modules; lowering/float64_constants.py and
lowering/static_iota.py keep torch-mlir's float64 scalars and arange
lengths out of them. The whole suite runs with the check on (conftest.py).
"""

from __future__ import annotations

import logging

import pytest
import torch

import tpu_inductor.report as report
from tpu_inductor.lowering.float64_constants import _bfloat16_bits
from tpu_inductor.lowering.tpu_readiness import tpu_findings, violations

MODULE = """
module {
  func.func @main(%arg0: tensor<4xf32>, %arg1: tensor<?x4xf32>) -> (tensor<4xf32>) {
    %0 = stablehlo.convert %arg0 : (tensor<4xf32>) -> tensor<4xf64>
    %1 = stablehlo.custom_call @xla_python_cpu_callback(%arg0) : (tensor<4xf32>) -> tensor<4xf32>
    %2 = stablehlo.custom_call @lapack_sgetrf(%arg0) : (tensor<4xf32>) -> tensor<4xf32>
    %3 = stablehlo.custom_call @Sharding(%arg0) : (tensor<4xf32>) -> tensor<4xf32>
    %4 = stablehlo.abs %arg1 : tensor<?x4xf32>
    %5 = arith.constant dense<2> : tensor<1xi64>
    return %arg0 : tensor<4xf32>
  }
}
"""


def test_findings_name_the_kind_and_the_op():
    found = {(f.kind, f.op, f.detail) for f in tpu_findings(MODULE)}
    assert found == {
        ("float64", "stablehlo.convert", "tensor<4xf64>"),
        ("host callback", "stablehlo.custom_call", "xla_python_cpu_callback"),
        ("custom call", "stablehlo.custom_call", "lapack_sgetrf"),
        ("dynamic shape", "stablehlo.abs", "tensor<?...>"),
        ("unstable dialect", "arith.constant", "a PJRT plugin cannot be sent it"),
    }
    assert len(violations(tpu_findings(MODULE))) == 5  # Sharding is XLA's own


def test_float64_the_graph_asks_for_is_explained():
    text = MODULE.replace("%arg0: tensor<4xf32>,", "%arg0: tensor<4xf64>,")
    (float64,) = [f for f in tpu_findings(text) if f.kind == "float64"]
    assert float64.explained


def _checked(fn, *args):
    got = torch.compile(fn, backend="tpu", options={"cache": False, "tpu_readiness": True})(*args)
    islands = report.current().islands()
    assert islands and all(i.tpu_findings is not None for i in islands)
    return got, [f for i in islands for f in i.tpu_findings]


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_python_numbers_and_aranges_bring_no_float64(dtype):
    """torch-mlir's float64 scalar constants and arange lengths are folded away
    with the values convert gives (bit-exact against the unfolded module); its
    integer ones (``* 2``) become StableHLO constants, not ``arith`` ones."""

    def fn(a, b, c):
        positions = torch.arange(a.shape[0], dtype=dtype) * 0.1 * 2
        return torch.addcdiv(a, b, c, value=0.3) * 1e-3 + positions, a.clamp(min=-0.25, max=0.7)

    torch.manual_seed(0)
    args = [torch.rand(16, dtype=dtype) + 0.5 for _ in range(3)]
    got, findings = _checked(fn, *args)
    assert findings == []
    from tpu_inductor.lowering import float64_constants, static_iota

    with pytest.MonkeyPatch.context() as patch:  # the module as torch-mlir left it
        patch.setattr(float64_constants, "fold_float64_constants", lambda module: 0)
        patch.setattr(static_iota, "static_iotas", lambda module: 0)
        torch._dynamo.reset()
        unfolded = torch.compile(fn, backend="tpu", options={"cache": False, "isolate_lowering": False})(*args)
    report.reset()  # that module's float64 is this test's doing
    for g, u in zip(got, unfolded):
        assert torch.equal(g, u)


def test_bfloat16_constants_round_once_to_nearest_even():
    # 1 + 2**-8 is a tie between two bfloat16 neighbours (even: 1.0); just above it rounds up.
    for number, expected in [(1 + 2**-8, 0x3F80), (1 + 2**-8 + 2**-30, 0x3F81), (-0.1, 0xBDCD), (0.0, 0x0000)]:
        assert int(_bfloat16_bits(number), 16) == expected
    assert _bfloat16_bits(float("-inf")) == "0xFF80" and _bfloat16_bits(1e-45) is None


@pytest.mark.tpu_findings_expected
def test_float64_inside_a_float32_graph_is_reported_and_warned(caplog):
    with caplog.at_level(logging.WARNING, logger="tpu_inductor"):
        _, findings = _checked(lambda a: (a.double() * a.double()).sum().float(), torch.rand(8))
    assert any(f["kind"] == "float64" and f["explained"] is None for f in findings)
    assert "a TPU could not run island" in caplog.text
    from tpu_inductor.reporting.summary import summarize

    assert "finding" in summarize(report.current()) and "a TPU could not run" in summarize(report.current())
