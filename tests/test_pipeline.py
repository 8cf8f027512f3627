"""One pipeline: static and symbolic graphs run one stage list, minus stated
exclusions; one placement decides where every node runs, and the report reads it."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest
import torch
from torch.fx.experimental.proxy_tensor import make_fx

import tpu_inductor
import tpu_inductor.pipeline as pipeline
import tpu_inductor.report as report
from tpu_inductor.pipeline import STAGES, GraphFacts, stages_for
from tpu_inductor.placement import placement
from tpu_inductor.placement.partition import propose_islands
from tpu_inductor.placement.placement import place
from tpu_inductor.placement.support import GraphSupport, SupportTable

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
    device_copies = {"find_grown_caches", "keep_grown_caches"}  # only where the client keeps device copies
    assert every - set(stages_for(STATIC)) == {"padding_safety", "padded_positions", "hoist_sizes"} | device_copies
    assert every - set(stages_for(SYMBOLIC)) == {
        "small_convolutions_as_matmuls",
        "depthwise_convolutions_as_taps",
        "pointwise_convolutions_as_matmuls",
    } | device_copies
    symbolic_with_copies = dataclasses.replace(SYMBOLIC, keeps_device_copies=True)
    assert set(stages_for(symbolic_with_copies)) == set(stages_for(SYMBOLIC)) | device_copies


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


# -- one placement -------------------------------------------------------------------


def test_every_eager_entry_of_the_report_comes_from_the_placement():
    """One place writes the report's fallbacks and choices (placement.record_eager)."""
    root = Path(tpu_inductor.__file__).parent
    writers = sorted(str(p.relative_to(root)) for p in root.rglob("*.py") if "FallbackRecord(" in p.read_text())
    assert writers == ["placement/placement.py"]


def test_the_schema_lists_every_kind_of_eager_decision():
    schema = json.loads((Path(tpu_inductor.__file__).parent / "reporting" / "report_schema.json").read_text())
    assert schema["$defs"]["fallback"]["properties"]["why"]["enum"] == list(placement.FALLBACKS + placement.CHOICES)


def _unsupported_and_random(x):
    y = torch.special.i0(x.sin())  # torch-mlir has no StableHLO lowering for i0
    return (y.cos() + torch.rand_like(x)).sum(-1)


@pytest.mark.parametrize("dynamic", [False, True], ids=["static", "symbolic"])
def test_the_report_says_why_each_node_runs_where_it_does(dynamic):
    options = {"cache": False, "fallback_random": True}
    compiled = torch.compile(_unsupported_and_random, backend="tpu", options=options, dynamic=dynamic)
    x = torch.randn(5, 8)
    assert compiled(x).shape == (5,)
    whys = {f.op: (f.why, f.reason) for g in report.current().graphs for f in g.fallbacks}
    assert whys["aten.i0.default"] == ("unsupported", "torch-mlir has no StableHLO lowering for it")
    random_op = next(op for op in whys if "rand" in op)
    assert whys[random_op][0] == "random"
    assert len(report.current().graphs[-1].islands) >= 1  # the rest ran on the device


def test_placement_decides_every_call_and_the_partition_reads_it():
    def f(x):
        return torch.special.i0(x.sin()).cos()

    gm = make_fx(f)(torch.randn(3))
    support = GraphSupport(SupportTable(), "cpu")
    decided = place(gm, support)
    calls = [n for n in gm.graph.nodes if n.op == "call_function"]
    assert set(decided.decisions) == set(calls)
    assert [decided.of(n).why for n in calls] == ["lowers", "unsupported", "lowers"]
    plan = propose_islands(gm, decided)
    assert [[n.target for n in island.nodes] for island in plan.islands] == [
        [torch.ops.aten.sin.default],
        [torch.ops.aten.cos.default],
    ]
