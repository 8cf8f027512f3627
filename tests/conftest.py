"""Shared fixtures: every test starts with a fresh Dynamo and a fresh report."""

import pytest
import torch

import tpu_inductor.compiled_graph
import tpu_inductor.report
from tpu_inductor.passes.kernel_choice import KernelChooser


@pytest.fixture(autouse=True)
def fresh_compile_state():
    torch._dynamo.reset()
    tpu_inductor.report.reset()
    yield
    torch._dynamo.reset()


@pytest.fixture
def eager_convolutions(monkeypatch):
    """Every convolution 'measures' faster in eager: the choice is decided, not timed."""
    monkeypatch.setattr(KernelChooser, "_measure", lambda self, gm, node: (1e-3, 2e-3))
    monkeypatch.setattr(tpu_inductor.compiled_graph, "_kernel_choosers", {})
