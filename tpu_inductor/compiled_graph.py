"""Turn one ATen graph into a callable that runs islands on PJRT, the rest eagerly.

``build_compiled_graph`` partitions the graph, lowers and compiles every
island, and, when torch-mlir or XLA rejects an island, learns which op failed,
re-partitions and tries again; the user's call never fails for that reason
(unless ``strict`` asks it to). The result is the graph itself with each
island replaced by a call of its :class:`DeviceIsland`: eager nodes and islands run
in graph order, and tensors pass between them without copies where memory is
shared.
"""

from __future__ import annotations

import dataclasses
import functools
import logging
import math
import weakref
from typing import Any, Callable, Optional, Sequence

import torch
import torch.fx

from tpu_inductor import report, torch_api
from tpu_inductor.analysis.frozen_parameters import parameter_only_nodes
from tpu_inductor.collective_islands import compile_collective_island, holds_collectives
from tpu_inductor.config import Config
from tpu_inductor.dynamic import has_symbolic_inputs, scalar_symbols
from tpu_inductor.errors import OutputMismatchError
from tpu_inductor.lowering.cache import lower_cached
from tpu_inductor.lowering.sharding_annotations import annotate_shardings
from tpu_inductor.lowering.stablehlo import lower_to_stablehlo
from tpu_inductor.lowering.with_collectives import lower_with_collectives
from tpu_inductor.passes.device_random import SEED_META, draw_seed
from tpu_inductor.passes.input_writes_in_place import DEVICE_COPY, WRITES_INPUT, InputWrites
from tpu_inductor.pipeline import GraphFacts, graph_support, lower_with_retries, run_stages
from tpu_inductor.placement.kernel_choice import KernelChooser, choose_eager_kernels, small_islands_between_eager_kernels
from tpu_inductor.placement.partition import Island, PartitionPlan, device_copies_out, fuse_islands, propose_islands
from tpu_inductor.placement.placement import Decision, place, record_eager
from tpu_inductor.placement.results_into_inputs import results_into_inputs
from tpu_inductor.placement.shardings import (
    MeshLayout,
    batch_size,
    dynamo_inputs,
    gradients_of_parameters,
    hints_of,
    tensor_inputs,
)
from tpu_inductor.placement.support import SupportTable
from tpu_inductor.process_state import STATE
from tpu_inductor.reporting import hooks
from tpu_inductor.runtime import (
    Platform,
    compile_stablehlo,
    get_platform,
    select_platform,
)
from tpu_inductor.runtime.disk_cache import CacheDir
from tpu_inductor.runtime.executable import DeviceExecutable, TensorSpec, resident_buffers
from tpu_inductor.runtime.resident_writes import keeping_device_copy
from tpu_inductor.runtime.mesh import Mesh, Spec, mesh_over
from tpu_inductor.runtime.sharded import ShardedExecutable, UnreadableSharding
from tpu_inductor.runtime.threads import eager_workers_compete

log = logging.getLogger(__name__)


@dataclasses.dataclass
class CompileContext:
    """Everything one ``torch.compile`` region shares across its graphs."""

    config: Config
    platform: Platform
    support: SupportTable
    disk_cache: Optional[CacheDir]
    kernels: Optional[KernelChooser] = None
    mesh: Optional[Mesh] = None
    """The devices each island is partitioned over (``Config.mesh``); None: one device."""
    hints: dict[int, Spec] = dataclasses.field(default_factory=dict)
    """Dynamo input position -> the layout ``tpu_inductor.shard`` asked for."""
    batch: Optional[int] = None
    """The batch size a mesh's first axis splits, read off the forward or
    inference graph, kept for the backward (placement/shardings.py)."""
    result_shardings: dict[str, Spec] = dataclasses.field(default_factory=dict)
    """A forward's island results (by node name) -> the spec XLA gave each,
    kept for the backward (``MeshLayout.saved``)."""

    @classmethod
    def create(cls, config: Config, example_inputs: Sequence[Any] = ()) -> "CompileContext":
        cache_dir = CacheDir.of(config) if config.cache else None
        platform_name = select_platform(config.platform, example_inputs)
        size = math.prod(n for _, n in config.mesh)
        platform = get_platform(platform_name, zero_copy=config.zero_copy, num_devices=size)
        return cls(
            config=config,
            platform=platform,
            support=_support_table(cache_dir),
            disk_cache=cache_dir,
            kernels=_kernel_chooser(platform, cache_dir) if config.eager_kernels else None,
            mesh=mesh_over(config.mesh, platform) if config.mesh else None,
            hints=hints_of(example_inputs, config.mesh) if config.mesh else {},
        )

    @property
    def checks_tpu_readiness(self) -> bool:
        """Read each compiled module for what a TPU could not run (lowering/tpu_readiness.py)."""
        return self.config.tpu_readiness or self.platform.name == "tpu"

    @property
    def releases_eager_workers(self) -> bool:
        """Islands that follow eager kernels stop OpenMP's spinning workers
        first: XLA:CPU runs on the same cores (runtime/threads.py)."""
        return eager_workers_compete(self.platform.name == "cpu")


def _kernel_chooser(platform: Platform, cache_dir: Optional[CacheDir]) -> Optional[KernelChooser]:
    """One chooser per platform and cache directory: timings are measured once.
    Whether the platform shares host memory is in the key: a copying one
    (``zero_copy=False``) has none, and must not leave a sharing one without."""
    key = (platform.name, platform.device_kind, platform.shares_host_memory, str(cache_dir.root) if cache_dir else None)
    choosers = STATE.kernel_choosers
    if key not in choosers:
        timings = cache_dir.kernel_timings_file(platform.device_kind) if cache_dir else None
        choosers[key] = KernelChooser.for_platform(platform, timings)
    return choosers[key]


def _support_table(cache_dir: Optional[CacheDir]) -> SupportTable:
    """One table per cache directory, shared by every region of the process."""
    key = str(cache_dir.root) if cache_dir else None
    tables = STATE.support_tables
    if key not in tables:
        tables[key] = SupportTable(cache_dir.learned_unsupported_file() if cache_dir else None)
    return tables[key]


class DeviceIsland:
    """What the graph calls in place of an island: its executable (see :meth:`run`)."""

    def __init__(
        self,
        executable: DeviceExecutable,
        record: Optional[report.IslandRecord] = None,
        *,
        aten_graph: Optional[torch.fx.GraphModule] = None,
        graph_record: Optional[report.GraphRecord] = None,
    ) -> None:
        self.executable = executable
        self.record = record
        self.aten_graph = aten_graph
        self.graph_record = graph_record
        self._inputs_checked = not executable.input_specs
        self._run_eagerly = False

    def run(self, *tensors: torch.Tensor) -> tuple[torch.Tensor, ...]:
        if self.record is not None:
            self.record.executions += 1
        if not self._inputs_checked:
            self._check_inputs(tensors)
        if self._run_eagerly:
            return tuple(self.aten_graph(*tensors))
        try:
            return tuple(self.executable.run(*tensors))
        except OutputMismatchError as exc:  # checked on the first call only
            if self.aten_graph is None:
                raise
            self._give_up_device(str(exc))
            return tuple(self.aten_graph(*tensors))

    def _give_up_device(self, reason: str) -> None:
        """Run this island's ATen graph eagerly from now on, which is right by
        construction, and say why in the report."""
        log.warning("tpu_inductor: %s: %s; island runs eagerly", self.executable.name, reason)
        if self.graph_record is not None:
            record_eager(self.graph_record, self.executable.name, Decision("result mismatch", reason))
        self._run_eagerly = True

    def _check_inputs(self, tensors: Sequence[torch.Tensor]) -> None:
        """The first call's inputs must be what the executable was compiled for.

        They can differ when an eager kernel disagrees with its own metadata
        (``_batch_norm_with_update`` returns bf16 running stats where its fake
        kernel promises float32): the island then runs its ATen graph eagerly,
        which is right by construction, and the report says why.
        """
        self._inputs_checked = True
        expected = self.executable.input_specs
        got = [TensorSpec(tuple(t.shape), t.dtype) for t in tensors]
        if got == list(expected) or self.aten_graph is None:
            return
        self._give_up_device(
            f"inputs arrived as {[(s.dtype, s.shape) for s in got if s not in expected]} "
            "where the graph's metadata promised otherwise"
        )


class ReusedResults:
    """A frozen island's results, kept while its inputs are the same tensors,
    unchanged (``freeze_parameters``; analysis/frozen_parameters.py).

    A tensor is the same while it is the same object (held weakly) with the
    same data pointer and version counter: in-place writes bump the counter,
    ``.data`` swaps move the pointer.
    """

    def __init__(self, run: Callable[..., tuple[torch.Tensor, ...]]) -> None:
        self._run = run
        self._inputs: list[weakref.ref] = []
        self._states: list[tuple[int, int]] = []
        self._results: Optional[tuple[torch.Tensor, ...]] = None

    def run(self, *tensors: torch.Tensor) -> tuple[torch.Tensor, ...]:
        try:
            states = [(t._version, t.data_ptr()) for t in tensors]
        except RuntimeError:  # an inference tensor: no version counter to watch
            return self._run(*tensors)
        if (
            states == self._states
            and self._results is not None
            and all(ref() is t for ref, t in zip(self._inputs, tensors))
        ):
            return self._results
        self._results = self._run(*tensors)
        self._inputs, self._states = [weakref.ref(t) for t in tensors], states
        return self._results


class _BoxedGraph:
    """AOTAutograd's boxed calling convention: one list of args, freed early."""

    def __init__(self, module: torch.fx.GraphModule) -> None:
        # forward itself: GraphModule.__call__ adds nn.Module's hook dispatch
        # and an error-rewriting wrapper, ~5 us per call, for hooks we never add.
        self.run = module.forward
        # An instance attribute, so wrappers made with functools.wraps (Dynamo's
        # disable() around backward graphs) copy it and keep the boxed call.
        self._boxed_call = True
        self.record: Optional[report.GraphRecord] = module.meta.get(_RECORD_KEY)
        self.seed_device: Optional[torch.device] = module.meta.get(SEED_META)

    def __call__(self, args: list[Any]) -> Any:
        if self.record is not None:
            self.record.executions += 1
        module_args = list(args)
        args.clear()
        if self.seed_device is not None:  # random ops draw on the device (passes/device_random.py)
            module_args.append(draw_seed(self.seed_device))
        return self.run(*module_args)


_RECORD_KEY = "tpu_inductor_graph_record"


def compile_graph(
    gm: torch.fx.GraphModule,
    example_inputs: Sequence[Any],
    kind: str,
    context: CompileContext,
    as_traced: Optional[torch.fx.GraphModule] = None,
    parameters: Sequence[int] = (),
    input_writes: Optional[InputWrites] = None,
):
    """The AOTAutograd compiler entry: a boxed callable for ``gm``.
    ``as_traced``: an untouched copy of ``gm``, when the caller keeps one;
    ``parameters``: positions of the parameter inputs (:func:`parameter_inputs`);
    ``input_writes``: the outputs AOTAutograd copies back into inputs (an
    inference graph's, passes/input_writes_in_place.py)."""
    writes = input_writes if kind == "inference" else None
    freeze = kind == "inference" and context.config.freeze_parameters
    if not has_symbolic_inputs(example_inputs):
        return _BoxedGraph(build_compiled_graph(gm, kind, context, parameters, freeze=freeze, input_writes=writes))
    from tpu_inductor.dynamic.graph import DynamicShapeGraph

    found = scalar_symbols.plan(gm)
    if found is None:
        return DynamicShapeGraph(gm, example_inputs, kind, context, as_traced, parameters, writes)
    numbers_beside = scalar_symbols.split(gm, found)
    inputs = [node.meta.get("val") for node in gm.graph.find_nodes(op="placeholder")]
    if has_symbolic_inputs(inputs):  # symbols that size tensors remain: buckets for them
        # as_traced takes numbers where this graph now takes 0-d tensors: its own copy runs past the budget
        tensors = DynamicShapeGraph(gm, inputs, kind, context, None, parameters, writes)
    else:
        tensors = _BoxedGraph(build_compiled_graph(gm, kind, context, parameters, freeze=freeze, input_writes=writes))
    return numbers_beside(tensors)


def _graph_record(gm: torch.fx.GraphModule, kind: str) -> report.GraphRecord:
    shapes = [
        tuple(n.meta["val"].shape)
        for n in gm.graph.find_nodes(op="placeholder")
        if isinstance(n.meta.get("val"), torch.Tensor)
    ]
    return report.new_graph_record(kind, num_nodes=len(gm.graph.nodes), input_shapes=shapes)


def eager_graph(gm: torch.fx.GraphModule, kind: str, reason: str) -> "_BoxedGraph":
    """``gm`` run by PyTorch as it is, recorded as one fallback with ``reason``."""
    record = _graph_record(gm, kind)
    record_eager(record, "whole graph", Decision("whole graph", reason))
    gm.meta[_RECORD_KEY] = record
    return _BoxedGraph(gm)


def parameter_inputs() -> tuple[int, ...]:
    """Positions of the graph inputs that are parameters and buffers, as
    AOTAutograd learnt them from Dynamo (the same list Inductor's CUDA graphs use)."""
    return torch_api.static_input_indices() or ()


def build_compiled_graph(
    gm: torch.fx.GraphModule,
    kind: str,
    context: CompileContext,
    parameters: Sequence[int] = (),
    *,
    freeze: bool = False,
    input_writes: Optional[InputWrites] = None,
) -> torch.fx.GraphModule:
    """The static path of the pipeline (pipeline.py): stages, placement, one
    executable per island. ``parameters``: positions of the parameter inputs
    (replicated on a mesh); ``freeze``: their parameter-only computation may
    be kept between calls (``freeze_parameters``); ``input_writes``: see
    :func:`compile_graph`."""
    gm = run_stages(gm, GraphFacts.of(context, symbolic=False, input_writes=input_writes))
    record = _graph_record(gm, kind)
    probe = functools.partial(_probe_lowers, context=context)
    support = graph_support(gm, context, probe)
    chosen = choose_eager_kernels(gm, context.kernels, support.lowers)
    parameter_nodes = parameter_placeholders(gm, kind, parameters)
    frozen = parameter_only_nodes(gm, parameter_nodes) if freeze and parameter_nodes else set()
    layout = mesh_layout(gm, kind, context, parameters, record)
    plan: Optional[PartitionPlan] = propose_islands(gm, place(gm, support, chosen, frozen))
    small = small_islands_between_eager_kernels(plan.islands, chosen) if chosen else {}
    if small:
        chosen.update(small)
        plan = None  # proposed again with them

    def build(island: Island) -> DeviceIsland:
        executable, island_record = _compile_island(island, context, record, layout)
        return DeviceIsland(executable, island_record, aten_graph=island.graph, graph_record=record)

    plan, runners = lower_with_retries(
        gm, support, record, context, build, probe, learn_for_later=True, chosen=chosen, frozen=frozen, plan=plan
    )
    record.islands = [runners[island.name].record for island in plan.islands]
    devices = {}
    for island in plan.islands:
        run = runners[island.name].run
        if island.frozen:
            runners[island.name].record.results_kept = True
            run = ReusedResults(run).run
        devices[island.name] = run
    record.inputs_written_in_place = sum(1 for node in gm.graph.nodes if node.meta.get(WRITES_INPUT))
    if record.inputs_written_in_place:
        _keep_device_copies(gm, context.platform)
    if context.platform.keeps_device_copies:
        for name, pairs in results_into_inputs(gm, plan.islands, input_writes).items():
            executable = runners[name].executable
            if isinstance(executable, DeviceExecutable):  # a mesh's sharded results are not written back
                executable.write_results_into_arguments(pairs)
                record.inputs_written_in_place += len(pairs)
    fused = fuse_islands(gm, plan, devices, context.releases_eager_workers)
    fused.meta[_RECORD_KEY] = record  # execution counts
    if SEED_META in gm.meta:
        fused.meta[SEED_META] = gm.meta[SEED_META]
    return fused


def _keep_device_copies(gm: torch.fx.GraphModule, platform: Platform) -> None:
    """The graph's in-place input writes that got the device's new value
    (passes/input_writes_in_place.py) keep it as the input's device copy
    (runtime/resident_writes.py)."""
    resident = resident_buffers(platform)
    for node in gm.graph.nodes:
        if DEVICE_COPY in node.kwargs:
            node.target = keeping_device_copy(node.target, resident)


def compile_module(
    module: bytes,
    input_specs: Sequence[TensorSpec],
    output_specs: Sequence[TensorSpec],
    context: CompileContext,
    name: str,
    layout: Optional[MeshLayout] = None,
    shardings: Sequence[Spec] = (),
    device_only: frozenset[int] = frozenset(),
    output_shardings: Sequence[Optional[Spec]] = (),
) -> tuple[DeviceExecutable, Any]:
    """One StableHLO module as an executable (from memory, disk or XLA), for
    one device or, with a ``layout``, the inputs' ``shardings`` and the
    outputs' (:meth:`MeshLayout.output_shardings`), partitioned over the
    mesh. Both paths compile their islands here. Returns the executable and
    the compile stats."""
    mesh = layout.mesh if layout is not None else None
    annotated = module
    if mesh is not None:
        results = [
            mesh.fit(spec, out.shape) if spec is not None else None
            for spec, out in zip(output_shardings, output_specs)
        ]
        annotated = annotate_shardings(module, mesh.axes, shardings, results)
    loaded, stats = compile_stablehlo(
        annotated,
        context.platform,
        context.disk_cache,
        input_specs=input_specs,
        xla_flags=context.config.xla_flags,
        mesh=mesh,
        isolate=context.config.isolate_lowering,
        choose_schedule=context.config.choose_xla_schedule,
    )
    keyed_name = f"{name} ({stats.key})"
    if mesh is not None:
        try:
            sharded = ShardedExecutable(
                loaded, context.platform, mesh, input_specs, shardings, output_specs, keyed_name
            )
        except UnreadableSharding as exc:  # compiled again with every result whole
            log.info("tpu_inductor: %s: %s; its results are replicated instead", keyed_name, exc)
            replicated = [()] * len(output_specs)
            return compile_module(
                module, input_specs, output_specs, context, name, layout, shardings, output_shardings=replicated
            )
        return sharded, stats
    executable = DeviceExecutable(
        loaded, context.platform, output_specs, name=keyed_name, input_specs=input_specs, device_only=device_only,
        schedule_choice=stats.schedule_choice,
    )
    return executable, stats


def parameter_placeholders(gm: torch.fx.GraphModule, kind: str, parameters: Sequence[int]) -> list[torch.fx.Node]:
    """The placeholders of ``gm`` that are the parameter inputs at Dynamo positions ``parameters``."""
    inputs = dynamo_inputs(gm, kind)
    return [inputs[i] for i in parameters if i in inputs]


def mesh_layout(
    gm: torch.fx.GraphModule,
    kind: str,
    context: CompileContext,
    parameters: Sequence[int],
    record: report.GraphRecord,
) -> Optional[MeshLayout]:
    """How the islands of ``gm`` (static or symbolic; ``parameters``: Dynamo
    positions) lie over the mesh, noted in its ``record``; None without a
    mesh. A forward or inference graph fixes the batch
    (placement/shardings.py), which its backward reuses: a backward's inputs
    are not Dynamo's."""
    if context.mesh is None:
        return None
    inputs = dynamo_inputs(gm, kind)
    parameter_nodes = parameter_placeholders(gm, kind, parameters)
    if kind != "backward":
        context.batch = batch_size(list(inputs.values()), parameter_nodes)
    record.mesh = context.mesh.describe()
    hints = {inputs[i]: spec for i, spec in context.hints.items() if i in inputs}
    gradients = gradients_of_parameters(gm, kind, parameters)
    saved = context.result_shardings if kind == "backward" else {}
    return MeshLayout(context.mesh, frozenset(parameter_nodes), hints, context.batch, gradients, saved)


def _compile_island(
    island: Island, context: CompileContext, record: report.GraphRecord, layout: Optional[MeshLayout] = None
) -> tuple[Any, report.IslandRecord]:
    """One island through both levels of the disk cache: ATen graph -> StableHLO
    -> executable; with a ``layout``, one executable over the mesh's devices."""
    if holds_collectives(island):
        return compile_collective_island(island, context, record)
    lowered, lower_stats = lower_cached(
        island.graph,
        context.disk_cache,
        name="main",
        for_cpu=context.platform.name == "cpu",
        isolate=context.config.isolate_lowering,
    )
    shardings, output_shardings = (), ()
    if layout is not None:
        shardings = layout.input_shardings(tensor_inputs(island), [s.shape for s in lowered.input_specs])
        output_shardings = layout.output_shardings(island.outputs, len(lowered.output_specs))
    executable, stats = compile_module(
        lowered.module, lowered.input_specs, lowered.output_specs, context, island.name, layout, shardings,
        device_only=device_copies_out(island), output_shardings=output_shardings,
    )
    if isinstance(executable, ShardedExecutable) and len(island.outputs) == len(executable.output_layouts):
        context.result_shardings.update(
            (node.name, spec) for node, spec in zip(island.outputs, executable.output_layouts) if spec is not None
        )
    island_record = compiled_island_record(
        island.name, len(island.nodes), executable, stats, lower_stats.seconds, lower_stats.source,
        ops=hooks.op_counts(island.nodes),
    )
    hooks.on_island_compiled(record, island_record, lowered.module, check_tpu=context.checks_tpu_readiness)
    return executable, island_record


def compiled_island_record(
    name: str,
    num_nodes: int,
    executable: Any,
    stats: Any,
    lower_seconds: float,
    lower_source: str,
    ops: Optional[dict[str, int]] = None,
) -> report.IslandRecord:
    """The report's entry for an executable :func:`compile_module` made, a
    static island's or one bucket's of a symbolic island (dynamic/island.py)."""
    island_record = report.IslandRecord(
        name=name,
        num_nodes=num_nodes,
        compile_source=stats.source,
        lower_seconds=lower_seconds,
        compile_seconds=stats.seconds,
        cache_key=stats.key,
        lower_source=lower_source,
        ops=ops or {},
        ynn_reductions_off=stats.ynn_reductions_off,
    )
    if stats.schedule_choice is not None:  # filled in when the executable is hot
        island_record.xla_schedule = stats.schedule_choice.words
        stats.schedule_choice.records.append(island_record)
    if isinstance(executable, ShardedExecutable):
        executable.record_into(island_record)
    return island_record


def _probe_lowers(probe: Island, context: CompileContext) -> None:
    """Lower and compile ``probe`` (uncached); raises what torch-mlir or XLA raised."""
    if holds_collectives(probe):  # lowered only: its program compiles for a group of ranks
        lower_with_collectives(probe.graph, 1, for_cpu=True, isolate=context.config.isolate_lowering)
        return
    lowered = lower_to_stablehlo(probe.graph, isolate=context.config.isolate_lowering)
    compile_stablehlo(lowered.module, context.platform, None, isolate=context.config.isolate_lowering)
