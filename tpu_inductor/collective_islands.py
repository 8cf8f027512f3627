"""Compile the islands that hold functional collectives (under ``torchrun``).

Two forms, decided per graph by placement/placement.py:

* an island whose compute and collectives all run over one process group
  (``collective in island``): one program per rank, compute and collectives
  together (lowering/with_collectives.py), compiled with one replica per
  rank of that group on the job's PJRT distributed runtime;
* a collective alone (``collective``, when a graph's collectives span
  several groups): its program over the group's devices
  (runtime/collectives.py).

Either way the ranks of the group first agree on what they compile, so
ranks that traced different graphs get an error naming both, not a hang.
"""

from __future__ import annotations

import time
from typing import Any

from tpu_inductor import report
from tpu_inductor.lowering.stablehlo import graph_specs
from tpu_inductor.lowering.with_collectives import COLLECTIVES, lower_with_collectives
from tpu_inductor.placement.partition import Island
from tpu_inductor.reporting import hooks
from tpu_inductor.runtime.executable import DeviceExecutable


def compile_collective_island(island: Island, context: Any, record: report.GraphRecord) -> tuple[Any, report.IslandRecord]:
    """``island``'s executable and its report entry: a lone collective's
    program, or compute and collectives in one program per rank."""
    from tpu_inductor.runtime import collectives, distributed

    started = time.perf_counter()
    runtime = distributed.runtime()
    nodes = [node for node in island.nodes if node.target in COLLECTIVES]
    module = None
    if island.collective:
        (collective,) = [collectives.Collective.of(node) for node in nodes]
        executable = collectives.CollectiveExecutable(
            collective, runtime, f"{island.name} ({collective.describe()})", context.disk_cache
        )
        lower_seconds, lower_source, loaded = 0.0, "collective", executable.loaded
        compile_source = executable.compile_source
    else:
        ranks, description = group_of(nodes)
        collectives.agree_across_ranks(ranks, description, runtime)
        lowered, lower_source = lower_with_collectives(
            island.graph, len(ranks), for_cpu=True, isolate=context.config.isolate_lowering,
            disk_cache=context.disk_cache,
        )
        lower_seconds = time.perf_counter() - started
        input_specs, output_specs = graph_specs(island.graph)
        loaded, stats = collectives.compile_for_group(
            lowered.module, ranks, runtime, context.disk_cache, input_specs=input_specs
        )
        compile_source = stats.source
        executable = DeviceExecutable(
            loaded, runtime.platform, output_specs, name=f"{island.name} ({description})", input_specs=input_specs
        )
        module = lowered.module
    island_record = report.IslandRecord(
        name=island.name,
        num_nodes=len(island.nodes),
        compile_source=compile_source,
        lower_seconds=lower_seconds,
        compile_seconds=time.perf_counter() - started - lower_seconds,
        cache_key=executable.name,
        lower_source=lower_source,
        ops=hooks.op_counts(island.nodes),
        collectives=collectives.count_collectives(loaded),
    )
    if module is not None:
        hooks.on_island_compiled(record, island_record, module, check_tpu=context.checks_tpu_readiness)
    return executable, island_record


def group_of(nodes: list) -> tuple[tuple[int, ...], str]:
    """The one process group ``nodes`` (collectives) run over, and what they
    are, in graph order (``all_reduce(float32[4,16], sum); ...``)."""
    from tpu_inductor.runtime import collectives

    described = [collectives.Collective.of(node) for node in nodes]
    (ranks,) = {collective.ranks for collective in described}
    return ranks, "; ".join(collective.describe() for collective in described)


def holds_collectives(island: Island) -> bool:
    return island.collective or any(node.target in COLLECTIVES for node in island.nodes)
