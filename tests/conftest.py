"""Shared fixtures: every test starts with a fresh Dynamo and a fresh report."""

import pytest
import torch

import tpu_inductor.report


@pytest.fixture(autouse=True)
def fresh_compile_state():
    torch._dynamo.reset()
    tpu_inductor.report.reset()
    yield
    torch._dynamo.reset()
