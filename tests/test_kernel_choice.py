"""Convolutions run on PyTorch's kernel where it measured faster (passes/kernel_choice.py).

Timings are injected (``KernelChooser._measure``) so each partition here is
decided, not measured: a test must not depend on this machine's speed. Values
are compared at torch.testing's float32 defaults: XLA's and oneDNN's
convolutions both accumulate in float32 over 3x3x8 products.
"""

from __future__ import annotations

import pytest
import torch

import tpu_inductor.compiled_graph as compiled_graph
import tpu_inductor.report as report
from tpu_inductor.passes.kernel_choice import KernelChooser


class ConvBlock(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv = torch.nn.Conv2d(8, 8, 3, padding=1)
        self.norm = torch.nn.BatchNorm2d(8)

    def forward(self, x):
        return torch.relu(self.norm(self.conv(x))) + x


@pytest.fixture
def timings(monkeypatch):
    """Every conv signature 'measures' as given; counts the measurements."""
    measured = []
    result = {"eager_s": 1e-3, "xla_s": 2e-3}

    def measure(self, gm, node):
        measured.append(node)
        return result["eager_s"], result["xla_s"]

    monkeypatch.setattr(KernelChooser, "_measure", measure)
    monkeypatch.setattr(compiled_graph, "_kernel_choosers", {})
    result["measured"] = measured
    return result


def _run(options, x):
    torch.manual_seed(0)
    model = ConvBlock().eval()
    compiled = torch.compile(model, backend="tpu", options=options)
    with torch.no_grad():
        return model(x), compiled(x)


def _graph():
    (graph,) = report.current().graphs
    return graph


def test_faster_eager_kernel_runs_the_conv(timings, tmp_path):
    x = torch.randn(2, 8, 16, 16)
    expected, actual = _run({"cache_dir": str(tmp_path)}, x)
    torch.testing.assert_close(actual, expected)
    graph = _graph()
    assert [k.op for k in graph.eager_kernels] == ["aten.convolution.default"]
    assert "faster" in graph.eager_kernels[0].reason
    assert graph.fallbacks == []  # a choice, not a fallback
    assert graph.islands and "aten.convolution.default" not in graph.islands[0].ops


def test_slower_eager_kernel_leaves_the_conv_on_the_device(timings, tmp_path):
    timings["eager_s"] = 1.9e-3  # within the margin: a near tie stays on the device
    x = torch.randn(2, 8, 16, 16)
    expected, actual = _run({"cache_dir": str(tmp_path)}, x)
    torch.testing.assert_close(actual, expected)
    graph = _graph()
    assert graph.eager_kernels == []
    assert graph.islands[0].ops.get("aten.convolution.default") == 1


def test_decision_is_kept_for_later_processes(timings, tmp_path):
    x = torch.randn(2, 8, 16, 16)
    _run({"cache_dir": str(tmp_path)}, x)
    assert len(timings["measured"]) == 1
    assert list(tmp_path.glob("kernel_timings-*.json"))
    # A new process: no chooser in memory, the timing comes from the file.
    compiled_graph._kernel_choosers.clear()
    torch._dynamo.reset()
    report.reset()
    _run({"cache_dir": str(tmp_path)}, x)
    assert len(timings["measured"]) == 1
    assert [k.op for k in _graph().eager_kernels] == ["aten.convolution.default"]


def test_option_off_keeps_every_conv_on_the_device(timings):
    x = torch.randn(2, 8, 16, 16)
    expected, actual = _run({"cache": False, "eager_kernels": False}, x)
    torch.testing.assert_close(actual, expected)
    assert timings["measured"] == []
    assert _graph().islands[0].ops.get("aten.convolution.default") == 1


def test_only_the_cpu_client_considers_eager_kernels():
    class Device:
        shares_host_memory = False
        name = "tpu"
        device_kind = "TPU v5e"

    assert KernelChooser.for_platform(Device(), None) is None
