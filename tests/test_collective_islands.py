"""An island that holds functional collectives lowers to one program per rank
(lowering/with_collectives.py): the compute between its collectives through
torch-mlir, the collectives as StableHLO ops over replicas.

Run here in one process on a CPU client with two devices, one replica per
device, so the program's numbers are checked without torchrun; the same
programs across processes are tests/test_distributed.py's.
"""

from __future__ import annotations

import torch
from torch.fx.experimental.proxy_tensor import make_fx
from torch.utils.dlpack import to_dlpack

from tpu_inductor.lowering import cache as lowering_cache
from tpu_inductor.lowering.with_collectives import lower_with_collectives
from tpu_inductor.reporting.files import stablehlo_text
from tpu_inductor.runtime import jaxlib_api, transfer
from tpu_inductor.runtime.collectives import compile_for_group
from tpu_inductor.runtime.disk_cache import CacheDir
from tpu_inductor.runtime.distributed import DistributedRuntime

c10d = torch.ops._c10d_functional
RANKS = 2


def step(x: torch.Tensor, w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Compute, all_reduce, compute, all_gather, compute, reduce_scatter (avg),
    with work that depends on no collective on the side."""
    y = c10d.wait_tensor(c10d.all_reduce(x @ w, "sum", "group"))
    side = (x * 3).sum(1, keepdim=True)
    gathered = c10d.wait_tensor(c10d.all_gather_into_tensor(y.relu(), RANKS, "group"))
    scattered = c10d.wait_tensor(c10d.reduce_scatter_tensor(gathered * 2, "avg", RANKS, "group"))
    return scattered + side, y


def expected(xs: list[torch.Tensor], w: torch.Tensor) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """What each rank gets, the collectives done by hand."""
    y = sum(x @ w for x in xs)
    gathered = torch.cat([y.relu()] * RANKS) * 2
    mean = sum([gathered] * RANKS) / RANKS
    parts = mean.chunk(RANKS)
    return [(parts[rank] + (x * 3).sum(1, keepdim=True), y) for rank, x in enumerate(xs)]


def test_collectives_and_compute_run_as_one_program_per_rank():
    torch.manual_seed(0)
    xs, w = [torch.randn(4, 8) + rank for rank in range(RANKS)], torch.randn(8, 4)
    gm = make_fx(step, tracing_mode="fake")(xs[0], w)
    lowered, _ = lower_with_collectives(gm, RANKS, for_cpu=True, isolate=False)

    text = stablehlo_text(lowered.module)
    for op in ("stablehlo.all_reduce", "stablehlo.all_gather", "stablehlo.reduce_scatter"):
        assert text.count(f'"{op}"') == 1
    assert text.count("replica_groups = dense<[[0, 1]]>") == 3
    assert text.count("func.func private @segment_") == 4  # the compute between the collectives

    runtime = DistributedRuntime(jaxlib_api.make_cpu_client(num_devices=RANKS, threads=1), rank=0, world_size=RANKS)
    loaded, _ = compile_for_group(lowered.module, tuple(range(RANKS)), runtime)
    check_on_every_rank(loaded, runtime, xs, w)


def check_on_every_rank(loaded, runtime: DistributedRuntime, xs: list[torch.Tensor], w: torch.Tensor) -> None:
    """``loaded`` (the program of ``step``) run once with every replica's
    inputs gives each rank what :func:`expected` says."""
    devices = runtime.devices
    # One array per argument holding each replica's own value: under torchrun
    # each process passes its one device's buffer instead.
    every_device = jaxlib_api.hlo_sharding(jaxlib_api.DeviceList(devices), "{replicated}")
    arguments = [
        jaxlib_api.ArrayImpl(
            jaxlib_api.shaped_array(values[0].shape, transfer.numpy_dtype(values[0].dtype)),
            every_device,
            [jaxlib_api.buffer_from_dlpack(to_dlpack(value), device, None) for value, device in zip(values, devices)],
            True,
            _skip_checks=True,
        )
        for values in (xs, [w] * RANKS)
    ]
    results = loaded.execute_sharded(arguments).disassemble_into_single_device_arrays()
    for rank, want in enumerate(expected(xs, w)):
        got = [transfer.host_tensor(per_device[rank]) for per_device in results]
        for g, e in zip(got, want):
            torch.testing.assert_close(g, e, rtol=1e-5, atol=1e-5)


def test_a_restarted_rank_lowers_its_collective_island_from_the_disk_cache(tmp_path, monkeypatch):
    """Each segment goes through the graph level of the cache: the next
    process gets the same program without running torch-mlir."""
    gm = make_fx(step, tracing_mode="fake")(torch.randn(4, 8), torch.randn(8, 4))
    first, first_source = lower_with_collectives(
        gm, RANKS, for_cpu=True, isolate=False, disk_cache=CacheDir(tmp_path)
    )

    def torch_mlir_again(*args, **kwargs):
        raise AssertionError("torch-mlir ran on a warm cache")

    monkeypatch.setattr(lowering_cache, "lower_to_stablehlo", torch_mlir_again)
    second, second_source = lower_with_collectives(
        gm, RANKS, for_cpu=True, isolate=False, disk_cache=CacheDir(tmp_path)
    )
    assert second.module == first.module
    assert (first_source, second_source) == ("torch-mlir", "disk")
    assert len(CacheDir(tmp_path).entries()) == 4  # one per segment


def test_a_restarted_rank_loads_its_compiled_program_from_the_disk_cache(tmp_path, monkeypatch):
    """The program compiled for the group's replicas is kept like every
    island's executable: the next process deserializes it instead of
    compiling, and it computes the same."""
    from tpu_inductor.process_state import STATE

    torch.manual_seed(0)
    xs, w = [torch.randn(4, 8) + rank for rank in range(RANKS)], torch.randn(8, 4)
    gm = make_fx(step, tracing_mode="fake")(xs[0], w)
    module = lower_with_collectives(gm, RANKS, for_cpu=True, isolate=False)[0].module
    runtime = DistributedRuntime(jaxlib_api.make_cpu_client(num_devices=RANKS, threads=1), rank=0, world_size=RANKS)
    _, first = compile_for_group(module, tuple(range(RANKS)), runtime, CacheDir(tmp_path))
    assert first.source == "xla"
    monkeypatch.setattr(STATE, "executables", {})  # a new process
    loaded, second = compile_for_group(module, tuple(range(RANKS)), runtime, CacheDir(tmp_path))
    assert second.source == "disk" and second.key == first.key
    check_on_every_rank(loaded, runtime, xs, w)


def test_a_restarted_rank_loads_a_lone_collectives_program_from_the_disk_cache(tmp_path, monkeypatch):
    """A collective compiled alone (a graph whose collectives span several
    groups) is kept like every executable: the next process loads it, and
    it reduces the ranks' rows as before."""
    from tpu_inductor.process_state import STATE
    from tpu_inductor.runtime import collectives

    runtime = DistributedRuntime(jaxlib_api.make_cpu_client(num_devices=RANKS, threads=1), rank=0, world_size=RANKS)
    monkeypatch.setattr(collectives, "agree_across_ranks", lambda *args: None)  # one process plays both ranks
    collective = collectives.Collective("all_reduce", (4, 8), torch.float32, "sum", tuple(range(RANKS)), True)
    first = collectives.CollectiveExecutable(collective, runtime, "all_reduce", CacheDir(tmp_path))
    monkeypatch.setattr(STATE, "executables", {})  # a new process
    second = collectives.CollectiveExecutable(collective, runtime, "all_reduce", CacheDir(tmp_path))
    assert (first.compile_source, second.compile_source) == ("xla", "disk")
    assert second.collectives == {"all-reduce": 1}
    # The program's input: the ranks' rows, one per device.
    rows = [torch.randn(1, 4, 8) for _ in range(RANKS)]
    argument = jaxlib_api.ArrayImpl(
        jaxlib_api.shaped_array((RANKS, 4, 8), transfer.numpy_dtype(torch.float32)),
        jaxlib_api.hlo_sharding(jaxlib_api.DeviceList(runtime.devices), "{devices=[2,1,1]0,1}"),
        [jaxlib_api.buffer_from_dlpack(to_dlpack(row), device, None) for row, device in zip(rows, runtime.devices)],
        True,
        _skip_checks=True,
    )
    results = second.loaded.execute_sharded([argument]).disassemble_into_single_device_arrays()
    for per_device in results[0]:
        torch.testing.assert_close(transfer.host_tensor(per_device), rows[0][0] + rows[1][0])
