"""Several processes under torchrun: PyTorch's functional collectives in a
compiled graph run in XLA over one PJRT distributed runtime (gloo between
the processes), not through the process group in eager.

Every scenario runs in the same 2 fresh processes, started once, and the
subgroup scenarios in 4 (tests/distributed_worker.py); a crash or a hang
fails every test. Results
are checked against single-device eager, and the report must show the
collectives inside the compiled programs (with the compute around them
where the graph's collectives share one process group; as islands of their
own, ``lower_source == "collective"``, where they span several), with the
collective XLA compiled, and none of them among the fallbacks.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

WORKER = Path(__file__).with_name("distributed_worker.py")
RANKS = 2
# The ranks that compile different graphs go last: the runtime is theirs to spoil.
SCENARIOS = ("collectives", "all_to_all", "data_parallel:mlp", "data_parallel:transformer", "tensor_parallel",
             "fsdp2:mlp", "fsdp2:transformer", "different_graphs")
COLLECTIVE_OPS = ("_c10d_functional.all_reduce", "_c10d_functional.all_gather_into_tensor",
                  "_c10d_functional.reduce_scatter_tensor", "_c10d_functional.all_to_all_single",
                  "_c10d_functional.wait_tensor")


# Over a (dp=2, tp=2) DeviceMesh: collectives over subgroups of the ranks.
SCENARIOS_ON_FOUR = ("subgroups", "tensor_parallel:2d")


def _torchrun(out: Path, ranks: int, scenarios: tuple[str, ...]) -> Path:
    """Run ``scenarios`` once under torchrun with ``ranks`` processes; the directory of their results."""
    env = {**os.environ, "OMP_NUM_THREADS": "1", "TORCHINDUCTOR_CACHE_DIR": str(out / "torch")}
    done = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={ranks}",
         str(WORKER), str(out), *scenarios],
        capture_output=True, text=True, timeout=300, env=env,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return out


@pytest.fixture(scope="module")
def ranks(tmp_path_factory) -> Path:
    return _torchrun(tmp_path_factory.mktemp("ranks"), RANKS, SCENARIOS)


@pytest.fixture(scope="module")
def four_ranks(tmp_path_factory) -> Path:
    return _torchrun(tmp_path_factory.mktemp("four_ranks"), 4, SCENARIOS_ON_FOUR)


def results(ranks: Path, scenario: str) -> list[dict]:
    name = scenario.replace(":", "-")
    return [json.loads(path.read_text()) for path in sorted(ranks.glob(f"{name}.rank*.json"))]


def lowered_collectives(result: dict) -> list[str]:
    """Each collective XLA compiled, once per occurrence in the compiled HLO."""
    return sorted(name for island in result["collective_islands"] for name, n in island["collectives"].items()
                  for _ in range(n))


def no_collective_fell_back(result: dict) -> bool:
    return not [op for op in result["fallbacks"] if op.startswith(COLLECTIVE_OPS)]


def test_functional_collectives_run_in_xla_across_processes(ranks):
    """matmul, all_reduce, relu, all_gather, mul, reduce_scatter over one group:
    one program per rank, the compute and the collectives together."""
    for result in results(ranks, "collectives"):
        assert result["max_diff"] < 1e-5
        assert result["islands_per_graph"] == [1]
        (island,) = result["collective_islands"]
        assert island["lower_source"] == "torch-mlir"
        assert {"aten.mm.default", "aten.relu.default", "aten.mul.Tensor"} <= set(island["ops"])
        assert lowered_collectives(result) == ["all-gather", "all-reduce", "reduce-scatter"]
        assert no_collective_fell_back(result)
        assert "1 island, 0 eager, across ranks (all-gather x1, all-reduce x1, reduce-scatter x1)" in result["summary"]


def test_all_to_all_single_runs_in_xla(ranks):
    for result in results(ranks, "all_to_all"):
        assert result["max_diff"] == 0
        (island,) = result["collective_islands"]
        assert island["ops"]["_c10d_functional.all_to_all_single.default"] == 1
        assert {"aten.mul.Tensor", "aten.add.Tensor"} <= set(island["ops"])  # the compute around it, in one program
        assert lowered_collectives(result) == ["all-to-all"]
        assert no_collective_fell_back(result)


@pytest.mark.parametrize("model", ["mlp", "transformer"])
def test_data_parallel_training_averages_gradients_in_compiled_graphs(ranks, model):
    for result in results(ranks, f"data_parallel:{model}"):
        assert result["losses"] == pytest.approx(result["reference_losses"], rel=1e-5)
        assert result["parameter_diff"] < 1e-5
        # Every gradient's all_reduce in one program, which XLA combines into
        # as few all-reduces as it likes (one, on the CPU client).
        (island,) = result["collective_islands"]
        assert island["ops"]["_c10d_functional.all_reduce.default"] == (4 if model == "mlp" else 14)
        assert 1 <= lowered_collectives(result).count("all-reduce") <= island["ops"]["_c10d_functional.all_reduce.default"]
        assert no_collective_fell_back(result)


def test_tensor_parallel_linear_pair_through_dtensor(ranks):
    """Inference, then 5 SGD steps on the DTensor parameters."""
    for result in results(ranks, "tensor_parallel"):
        assert result["max_diff"] < 1e-5
        assert result["losses"] == pytest.approx(result["reference_losses"], rel=1e-5)
        assert result["parameter_diff"] < 1e-5
        assert "all-reduce" in lowered_collectives(result)  # the rowwise Linear's partial sums
        assert no_collective_fell_back(result)
        # The forward is one program: both matmuls and the all_reduce between them and the bias.
        forward = result["collective_islands"][0]
        assert forward["ops"]["aten.addmm.default"] == 2
        assert forward["ops"]["_c10d_functional.all_reduce.default"] == 1
        assert result["islands_per_graph"][0] == 1


@pytest.mark.parametrize("model", ["mlp", "transformer"])
def test_fsdp2_blocks_compile_between_its_hooks(ranks, model):
    """``fully_shard`` per block, the root compiled, 5 SGD steps on half a batch each.

    FSDP2's all-gathers and reduce-scatters run in its (Dynamo-disabled) hooks
    through the process group; each block's forward and backward compute is a
    compiled graph on the unsharded parameters (two blocks with parameters:
    at least 4 islands)."""
    for result in results(ranks, f"fsdp2:{model}"):
        assert result["losses"] == pytest.approx(result["reference_losses"], rel=1e-5)
        assert result["parameter_diff"] < 1e-5
        assert result["compute_islands"] >= 4
        assert result["fallbacks"] == []


def test_collectives_over_subgroups_run_in_xla(four_ranks):
    """all_reduce, all_gather, reduce_scatter and all_to_all over a DeviceMesh's
    dims, then each half of the ranks a graph of its own over its tp group
    (as pipeline stages do): exactly gloo's results, none through the process group.

    The first graph's collectives span the tp and dp groups, so each is an
    island of its own; a stage's one collective is over one group, so it
    shares its program with the compute before it."""
    outcomes = results(four_ranks, "subgroups")
    assert len(outcomes) == 4
    for rank, result in enumerate(outcomes):
        assert result["max_diff"] == 0
        assert len(result["collective_islands"]) == 5
        assert lowered_collectives(result)
        assert no_collective_fell_back(result)
        *alone, stage = result["collective_islands"]
        assert [island["lower_source"] for island in alone] == ["collective"] * 4
        assert stage["lower_source"] == "torch-mlir"
        assert stage["ops"]["aten.add.Tensor" if rank < 2 else "aten.sub.Tensor"] == 1
        assert stage["collectives"] == ({"all-reduce": 1} if rank < 2 else {"all-gather": 1})


def test_tensor_parallel_over_one_dim_of_a_2d_mesh(four_ranks):
    """DTensor's collectives over the tp dim of a (dp, tp) mesh: inference and 5 SGD steps."""
    for result in results(four_ranks, "tensor_parallel:2d"):
        assert result["max_diff"] < 1e-5
        assert result["losses"] == pytest.approx(result["reference_losses"], rel=1e-5)
        assert result["parameter_diff"] < 1e-5
        assert "all-reduce" in lowered_collectives(result)
        assert no_collective_fell_back(result)


def test_ranks_that_trace_different_graphs_get_an_error_naming_both(ranks):
    for result in results(ranks, "different_graphs"):
        assert result["error"] and "different graphs" in result["error"]
        assert "all_reduce(float32[4], sum)" in result["error"] and "all_reduce(float32[8], sum)" in result["error"]
