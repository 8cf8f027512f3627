"""Several processes under torchrun: PyTorch's functional collectives in a
compiled graph run in XLA over one PJRT distributed runtime (gloo between
the processes), not through the process group in eager.

Each scenario runs in 2 fresh processes (tests/distributed_worker.py); a
crash or a hang fails the test. Results are checked against single-device
eager, and the report must show the collectives as islands of their own
(``lower_source == "collective"``) with the collective XLA compiled, and
none of them among the fallbacks.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

WORKER = Path(__file__).with_name("distributed_worker.py")
COLLECTIVE_OPS = ("_c10d_functional.all_reduce", "_c10d_functional.all_gather_into_tensor",
                  "_c10d_functional.reduce_scatter_tensor", "_c10d_functional.wait_tensor")


def run_ranks(scenario: str, tmp_path: Path, *arguments: str, ranks: int = 2) -> list[dict]:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "TORCHINDUCTOR_CACHE_DIR": str(tmp_path / "torch")}
    done = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={ranks}",
         str(WORKER), scenario, str(tmp_path), *arguments],
        capture_output=True, text=True, timeout=240, env=env,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return [json.loads((tmp_path / f"rank{rank}.json").read_text()) for rank in range(ranks)]


def lowered_collectives(result: dict) -> list[str]:
    return sorted(name for island in result["collective_islands"] for name in island["collectives"])


def test_functional_collectives_run_in_xla_across_processes(tmp_path):
    for result in run_ranks("collectives", tmp_path):
        assert result["max_diff"] < 1e-5
        assert len(result["collective_islands"]) == 3
        assert set(lowered_collectives(result)) <= {"all-reduce", "all-gather", "reduce-scatter"}
        assert not [op for op in result["fallbacks"] if op.startswith(COLLECTIVE_OPS)]


@pytest.mark.parametrize("model", ["mlp", "transformer"])
def test_data_parallel_training_averages_gradients_in_compiled_graphs(tmp_path, model):
    for result in run_ranks("data_parallel", tmp_path, model):
        assert result["losses"] == pytest.approx(result["reference_losses"], rel=1e-5)
        assert result["parameter_diff"] < 1e-5
        assert lowered_collectives(result).count("all-reduce") >= 4  # one per gradient, at least
        assert not [op for op in result["fallbacks"] if op.startswith(COLLECTIVE_OPS)]


def test_tensor_parallel_linear_pair_through_dtensor(tmp_path):
    """Inference, then 5 SGD steps on the DTensor parameters."""
    for result in run_ranks("tensor_parallel", tmp_path):
        assert result["max_diff"] < 1e-5
        assert result["losses"] == pytest.approx(result["reference_losses"], rel=1e-5)
        assert result["parameter_diff"] < 1e-5
        assert "all-reduce" in lowered_collectives(result)  # the rowwise Linear's partial sums
        assert not [op for op in result["fallbacks"] if op.startswith(COLLECTIVE_OPS)]


def test_ranks_that_trace_different_graphs_get_an_error_naming_both(tmp_path):
    for result in run_ranks("different_graphs", tmp_path):
        assert result["error"] and "different graphs" in result["error"]
        assert "all_reduce(float32[4], sum)" in result["error"] and "all_reduce(float32[8], sum)" in result["error"]
