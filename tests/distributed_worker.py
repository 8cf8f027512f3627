"""One rank of tests/test_distributed.py, started by torchrun.

Runs each scenario named after argv[1] (``name`` or ``name:argument``) with
backend="tpu", one after the other, and writes what it saw to
``<argv[1]>/<scenario>.rank<N>.json`` for the test to check: results against
single-device eager, and the report's islands and fallbacks.
"""

from __future__ import annotations

import copy
import json
import sys
from pathlib import Path

import torch
import torch.distributed as dist
import torch.distributed._functional_collectives as funcol

import tpu_inductor

OPTIONS = {"cache": False}


def _report() -> dict:
    graphs = tpu_inductor.report.current().graphs
    return {
        "collective_islands": [
            {"ops": i.ops, "collectives": i.collectives, "lower_source": i.lower_source}
            for g in graphs for i in g.islands if _holds_collectives(i)
        ],
        "fallbacks": [f.op for g in graphs for f in g.fallbacks],
        "compute_islands": sum(not _holds_collectives(i) for g in graphs for i in g.islands),
        "islands_per_graph": [len(g.islands) for g in graphs],
        "summary": str(tpu_inductor.report.current()),
    }


def _holds_collectives(island) -> bool:
    """A collective's own island, or compute with collectives in one program."""
    return island.lower_source == "collective" or any(op.startswith("_c10d_functional.") for op in island.ops)


def collectives(rank: int, world: int) -> dict:
    def step(x, w):
        y = funcol.all_reduce(x @ w, "sum", dist.group.WORLD)
        gathered = funcol.all_gather_tensor(y.relu(), 0, dist.group.WORLD)
        scattered = funcol.reduce_scatter_tensor(gathered * 2, "sum", 0, dist.group.WORLD)
        return y, gathered, scattered

    torch.manual_seed(0)
    x, w = torch.randn(4, 8) + rank, torch.randn(8, 4)
    expected = step(x, w)
    got = torch.compile(step, backend="tpu", options=OPTIONS)(x, w)
    return {"max_diff": max((a - b).abs().max().item() for a, b in zip(got, expected)), **_report()}


def all_to_all(rank: int, world: int) -> dict:
    """Equal splits: each rank sends its j-th block of rows to rank j."""

    def step(x):
        return funcol.all_to_all_single(x * 2, None, None, dist.group.WORLD) + 1

    x = torch.arange(8 * 3, dtype=torch.float32).reshape(8, 3) + 100 * rank
    expected = step(x)  # the process group (gloo) in eager
    got = torch.compile(step, backend="tpu", options=OPTIONS)(x)
    return {"max_diff": (got - expected).abs().max().item(), **_report()}


def _small_model(kind: str) -> tuple[torch.nn.Sequential, torch.Tensor, torch.Tensor]:
    """The training scenarios' model (seed 0), a batch of 8 and its target."""
    torch.manual_seed(0)
    if kind == "transformer":
        layer = torch.nn.TransformerEncoderLayer(32, 4, dim_feedforward=64, dropout=0.0, batch_first=True)
        return torch.nn.Sequential(layer, torch.nn.Linear(32, 4)), torch.randn(8, 6, 32), torch.randn(8, 6, 4)
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 4))
    return model, torch.randn(8, 16), torch.randn(8, 4)


def data_parallel(rank: int, world: int, model_kind: str = "mlp") -> dict:
    """Each rank takes its half of the batch; gradients averaged in a compiled graph."""
    model, x, target = _small_model(model_kind)
    reference = copy.deepcopy(model)
    compiled = torch.compile(model, backend="tpu", options=OPTIONS)

    @torch.compile(backend="tpu", options=OPTIONS)
    def average(grads):
        return [funcol.all_reduce(g, "avg", dist.group.WORLD) for g in grads]

    def average_gradients() -> None:
        for p, g in zip(model.parameters(), average([p.grad for p in model.parameters()])):
            p.grad = g

    return _train_on_halves(rank, world, compiled, model, reference, x, target, average_gradients)


def _train_on_halves(rank: int, world: int, compiled, model, reference, x, target, after_backward=None) -> dict:
    """5 SGD steps, each rank on its part of the batch, against ``reference`` on
    the whole batch on one device: both losses, and the largest parameter difference."""
    mine = slice(rank * len(x) // world, (rank + 1) * len(x) // world)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    reference_optimizer = torch.optim.SGD(reference.parameters(), lr=0.1)
    losses, reference_losses = [], []
    for _ in range(5):
        loss = torch.nn.functional.mse_loss(compiled(x[mine]), target[mine])
        loss.backward()
        if after_backward is not None:
            after_backward()
        optimizer.step()
        optimizer.zero_grad()
        losses.append(funcol.all_reduce(loss.detach(), "avg", dist.group.WORLD).item())
        reference_loss = torch.nn.functional.mse_loss(reference(x), target)
        reference_loss.backward()
        reference_optimizer.step()
        reference_optimizer.zero_grad()
        reference_losses.append(reference_loss.item())
    parameter_diff = max(
        (getattr(a, "full_tensor", lambda: a)() - b).abs().max().item()  # DTensor parameters: all of it
        for a, b in zip(model.parameters(), reference.parameters())
    )
    return {"losses": losses, "reference_losses": reference_losses, "parameter_diff": parameter_diff, **_report()}


class _Block(torch.nn.Module):
    def __init__(self, layer: torch.nn.Module) -> None:
        super().__init__()
        self.layer = layer

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.layer(x)


def fsdp2(rank: int, world: int, model_kind: str = "mlp") -> dict:
    """FSDP2 (``fully_shard`` per layer, then the root), the root compiled.

    FSDP2's hooks are ``torch._dynamo.disable``d: its all-gathers and
    reduce-scatters run through the process group between the compiled
    graphs, which hold the layers' compute on the unsharded parameters.
    Each rank takes its half of the batch; FSDP averages the gradients."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    layers, x, target = _small_model(model_kind)
    # Each layer in a block class of the model's own, as TorchTitan's and
    # transformers' layers are: Dynamo compiles user code between FSDP's
    # hooks, but not the frames of torch.nn's modules when a hook breaks there.
    model = torch.nn.Sequential(*(_Block(layer) for layer in layers))
    reference = copy.deepcopy(model)
    mesh = init_device_mesh("cpu", (world,))
    for block in model:
        if any(True for _ in block.parameters()):
            fully_shard(block, mesh=mesh)
    fully_shard(model, mesh=mesh)
    compiled = torch.compile(model, backend="tpu", options=OPTIONS)
    return _train_on_halves(rank, world, compiled, model, reference, x, target)


def tensor_parallel(rank: int, world: int, layout: str = "1d") -> dict:
    """A Linear pair split colwise then rowwise through DTensor (parallelize_module),
    over every rank (``1d``) or over the ``tp`` dim of a (dp, tp) mesh (``2d``:
    DTensor's collectives then run over subgroups of the ranks)."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 16))
    reference = copy.deepcopy(model)
    if layout == "2d":
        mesh = init_device_mesh("cpu", (2, world // 2), mesh_dim_names=("dp", "tp"))["tp"]
    else:
        mesh = init_device_mesh("cpu", (world,))
    parallelize_module(model, mesh, {"0": ColwiseParallel(), "2": RowwiseParallel()})
    x, target = torch.randn(4, 16), torch.randn(4, 16)
    compiled = torch.compile(model, backend="tpu", options=OPTIONS)
    with torch.no_grad():
        inference_diff = (compiled(x) - reference(x)).abs().max().item()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    reference_optimizer = torch.optim.SGD(reference.parameters(), lr=0.1)
    losses, reference_losses = [], []
    for _ in range(5):
        for m, opt, out in ((compiled, optimizer, losses), (reference, reference_optimizer, reference_losses)):
            loss = torch.nn.functional.mse_loss(m(x), target)
            loss.backward()
            opt.step()
            opt.zero_grad()
            out.append(loss.item())
    parameter_diff = max(
        (a.full_tensor() - b).abs().max().item() for a, b in zip(model.parameters(), reference.parameters())
    )
    return {
        "max_diff": inference_diff,
        "losses": losses,
        "reference_losses": reference_losses,
        "parameter_diff": parameter_diff,
        **_report(),
    }


def subgroups(rank: int, world: int) -> dict:
    """Collectives over the dims of a (dp, tp) DeviceMesh: each over a subgroup of the ranks."""
    from torch.distributed.device_mesh import init_device_mesh

    mesh = init_device_mesh("cpu", (2, world // 2), mesh_dim_names=("dp", "tp"))
    tp, dp = mesh.get_group("tp"), mesh.get_group("dp")

    def step(x):
        reduced = funcol.all_reduce(x * 2, "sum", tp)
        gathered = funcol.all_gather_tensor(reduced + 1, 0, dp)
        scattered = funcol.reduce_scatter_tensor(gathered, "sum", 0, tp)
        return reduced, gathered, scattered, funcol.all_to_all_single(scattered - 1, None, None, dp)

    # Like two pipeline stages: each half of the ranks compiles its own graph,
    # whose collective is over a group inside that half; the other half takes no part.
    def first_stage(x):
        return funcol.all_reduce(x + 1, "max", tp)

    def second_stage(x):
        return funcol.all_gather_tensor(x - 1, 0, tp)

    x = torch.arange(4 * 3, dtype=torch.float32).reshape(4, 3) + 100 * rank
    stage = first_stage if rank < world // 2 else second_stage
    expected = [*step(x), stage(x)]  # the process groups (gloo) in eager
    got = [*torch.compile(step, backend="tpu", options=OPTIONS)(x),
           torch.compile(stage, backend="tpu", options=OPTIONS)(x)]
    return {"max_diff": max((a - b).abs().max().item() for a, b in zip(got, expected)), **_report()}


def different_graphs(rank: int, world: int) -> dict:
    """Ranks that compile different collectives must get an error, not hang."""
    x = torch.randn(4 if rank == 0 else 8)
    try:
        torch.compile(lambda a: funcol.all_reduce(a, "sum", dist.group.WORLD), backend="tpu", options=OPTIONS)(x)
    except Exception as exc:  # Dynamo wraps the backend's error
        return {"error": str(exc)}
    return {"error": None}


def main() -> None:
    """Each scenario in turn, in one process group (one torchrun start for all)."""
    out, scenarios = Path(sys.argv[1]), sys.argv[2:]
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    for scenario in scenarios:
        name, *arguments = scenario.split(":")
        torch._dynamo.reset()
        tpu_inductor.report.reset()
        result = globals()[name](rank, world, *arguments)
        (out / f"{scenario.replace(':', '-')}.rank{rank}.json").write_text(json.dumps(result))
        dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
