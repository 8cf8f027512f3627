"""Shared fixtures: every test starts with a fresh Dynamo, a fresh report and
empty PyTorch caches, and every module the suite compiles is read for what a
TPU could not run."""

import os

import pytest
import torch

import tpu_inductor.report
from tpu_inductor.placement.culprits import BUILT_AFTER_COMPILE_FAILED
from tpu_inductor.placement.kernel_choice import KernelChooser
from tpu_inductor.process_state import STATE


@pytest.fixture(autouse=True)
def fresh_compile_state(request, monkeypatch, tmp_path_factory):
    # PyTorch's own caches (AOTAutograd's holds our traced graphs: aot_cache.py)
    # start empty per test, as ours do.
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path_factory.mktemp("torch_cache")))
    torch._dynamo.reset()
    tpu_inductor.report.reset()
    yield
    # A schedule choice still compiling would report into the next test.
    assert tpu_inductor.wait_for_background_compiles(timeout=300), "a background compile did not finish in 5 minutes"
    torch._dynamo.reset()
    # The backend runs a graph eagerly when something escapes its retry loops,
    # so that a user's call never fails for it: in tests that is a bug of ours.
    if request.node.get_closest_marker("backend_failure_expected") is None:
        failed = [f.reason for f in tpu_inductor.report.current().fallbacks() if f.op == "whole graph"]
        assert not failed, f"the backend failed on a graph and ran it eagerly: {failed}"
        # Likewise an island that compiled but whose runner could not be built.
        unbuilt = [f.reason for f in tpu_inductor.report.current().fallbacks()
                   if f.reason.startswith(BUILT_AFTER_COMPILE_FAILED)]
        assert not unbuilt, f"an island compiled but was not built, and ran eagerly: {unbuilt[0]}"
    # TPU readiness (lowering/tpu_readiness.py): no module the test compiled
    # holds what a TPU could not run, unless it is explained.
    if request.node.get_closest_marker("tpu_findings_expected") is not None:
        return
    unexplained = [
        f"{island.name}: {finding['kind']} {finding['op']} {finding['detail']}"
        for island in tpu_inductor.report.current().islands()
        for finding in island.tpu_findings or ()
        if finding["explained"] is None
    ]
    if os.environ.get("TPU_READINESS_COLLECT"):  # a survey of the whole suite instead of a failure
        with open(os.environ["TPU_READINESS_COLLECT"], "a") as out:
            out.writelines(f"{request.node.nodeid}\t{u}\n" for u in unexplained)
        return
    assert not unexplained, f"a TPU could not run what this test compiled: {unexplained}"


# Every compile in the suite checks TPU readiness (an option wins over it, as always).
os.environ.setdefault("TPU_INDUCTOR_TPU_READINESS", "1")


@pytest.fixture
def eager_convolutions(monkeypatch):
    """Every convolution 'measures' faster in eager, on every thread: the choice is decided, not timed."""
    monkeypatch.setattr(KernelChooser, "_measure", lambda self, gm, node: (1e-3, 2e-3, 2e-3))
    monkeypatch.setattr(STATE, "kernel_choosers", {})
