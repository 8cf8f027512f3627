"""Shared fixtures: every test starts with a fresh Dynamo and a fresh report."""

import pytest
import torch

import tpu_inductor.compiled_graph
import tpu_inductor.report
from tpu_inductor.passes.kernel_choice import KernelChooser


@pytest.fixture(autouse=True)
def fresh_compile_state(request):
    torch._dynamo.reset()
    tpu_inductor.report.reset()
    yield
    torch._dynamo.reset()
    # The backend runs a graph eagerly when something escapes its retry loops,
    # so that a user's call never fails for it: in tests that is a bug of ours.
    if request.node.get_closest_marker("backend_failure_expected") is None:
        failed = [f.reason for f in tpu_inductor.report.current().fallbacks() if f.op == "whole graph"]
        assert not failed, f"the backend failed on a graph and ran it eagerly: {failed}"


@pytest.fixture
def eager_convolutions(monkeypatch):
    """Every convolution 'measures' faster in eager: the choice is decided, not timed."""
    monkeypatch.setattr(KernelChooser, "_measure", lambda self, gm, node: (1e-3, 2e-3))
    monkeypatch.setattr(tpu_inductor.compiled_graph, "_kernel_choosers", {})
