"""One pipeline: static and symbolic graphs run one stage list, minus stated exclusions."""

from __future__ import annotations

import dataclasses

import pytest
import torch

import tpu_inductor.pipeline as pipeline
import tpu_inductor.report as report
from tpu_inductor.pipeline import STAGES, GraphFacts, stages_for

STATIC = GraphFacts(symbolic=False, platform="cpu")
SYMBOLIC = GraphFacts(symbolic=True, platform="cpu")


@pytest.mark.parametrize("facts", [STATIC, SYMBOLIC, GraphFacts(symbolic=False, platform="tpu")], ids=["static", "symbolic", "tpu"])
def test_a_skipped_stage_says_why_and_the_order_is_the_pipelines(facts):
    ran = stages_for(facts)
    assert ran == [stage.name for stage in STAGES if stage.name in ran]
    for stage in STAGES:
        if stage.name not in ran:
            assert stage.skip(facts), f"{stage.name} is skipped without a stated reason"


def test_static_and_symbolic_graphs_differ_only_by_the_stated_exclusions():
    every = {stage.name for stage in STAGES}
    assert every - set(stages_for(STATIC)) == {"padding_safety", "padded_positions", "hoist_sizes"}
    assert every - set(stages_for(SYMBOLIC)) == {
        "small_convolutions_as_matmuls",
        "depthwise_convolutions_as_taps",
        "pointwise_convolutions_as_matmuls",
    }


def test_both_paths_run_the_pipeline_they_declare(monkeypatch):
    """Compiled for real: what ran is what stages_for says, for each path."""
    ran: list[str] = []
    recorded = tuple(
        dataclasses.replace(stage, run=lambda gm, facts, stage=stage: (ran.append(stage.name), stage.run(gm, facts))[1])
        for stage in STAGES
    )
    monkeypatch.setattr(pipeline, "STAGES", recorded)

    def f(x):
        return torch.nn.functional.gelu(x @ x.T).sum(-1)

    torch.compile(f, backend="tpu", options={"cache": False})(torch.randn(4, 8))
    assert ran == stages_for(STATIC)
    ran.clear()
    torch._dynamo.reset()
    compiled = torch.compile(f, backend="tpu", options={"cache": False}, dynamic=True)
    x = torch.randn(5, 8)
    torch.testing.assert_close(compiled(x), f(x))
    assert ran == stages_for(SYMBOLIC)
    assert report.current().dynamic_graphs
