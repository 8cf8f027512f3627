"""A graph with symbolic shapes: lowered once, compiled per bucket, under a budget.

Why: XLA compiles static shapes, so a model called with changing sizes would
re-trace and re-compile per size. Here the graph Dynamo and AOTAutograd
traced symbolically is:

1. run through the pipeline's stages (:mod:`~tpu_inductor.pipeline`), which
   for a symbolic graph include the analysis of which symbols may be padded
   (:mod:`~tpu_inductor.analysis.padding_safety`);
2. partitioned and lowered to StableHLO once, with dynamic dims
   (:mod:`~tpu_inductor.lowering.symbolic`), by the pipeline's one
   lower-and-retry loop;
3. at each call, its symbols are read off the arguments and bucketed
   (:mod:`.buckets`); a bucket seen before reuses its executables, a new one
   refines and compiles every island for it (:mod:`.island`) and is recorded
   in the report with the sizes that caused it;
4. inputs are padded to the bucket and outputs sliced back (:mod:`.padding`).

Past ``recompile_budget`` sizes of a dim, new ones run the ATen graph in eager
PyTorch (results stay right, nothing is compiled), with one warning naming
the dim that kept changing and the options that help; ``strict`` raises.
"""

from __future__ import annotations

import functools
import logging
import warnings
from typing import TYPE_CHECKING, Any, Optional, Sequence

import sympy
import torch
import torch.fx

from tpu_inductor import report
from tpu_inductor.dynamic import shape_env_of, symbol_source
from tpu_inductor.dynamic.buckets import BucketPolicy, choose_buckets
from tpu_inductor.dynamic.device_caches import DeviceCaches
from tpu_inductor.dynamic.island import CallState, PerBucketIsland, SymbolicIsland
from tpu_inductor.dynamic.padding import ShapeBinding
from tpu_inductor.dynamic.kept_padding import KeptPadding
from tpu_inductor.dynamic.size_functions import SizeFunction
from tpu_inductor.errors import RecompileBudgetError, RecompileBudgetWarning
from tpu_inductor.lowering.cache import lower_symbolic_cached
from tpu_inductor.lowering.pipelines import IslandLoweringError
from tpu_inductor.lowering.symbolic import lower_symbolic
from tpu_inductor.passes.device_random import SEED_META, draw_seed
from tpu_inductor.passes.input_writes_in_place import DeferredWrites, InputWrites
from tpu_inductor.analysis.padding_safety import PaddingAnalysis
from tpu_inductor.passes.rewrite import runnable_copy
from tpu_inductor.placement.partition import ISLAND_PREFIX, Island, device_copies_out, fuse_islands
from tpu_inductor.placement.shardings import tensor_inputs
from tpu_inductor.placement.placement import Decision, record_eager
from tpu_inductor.runtime.executable import resident_buffers
from tpu_inductor.pipeline import GraphFacts, graph_support, lower_with_retries, run_stages

if TYPE_CHECKING:
    from tpu_inductor.compiled_graph import CompileContext

log = logging.getLogger(__name__)


class DynamicShapeGraph:
    """AOTAutograd's callable for a graph with symbolic shapes (boxed calling convention)."""

    def __init__(
        self,
        gm: torch.fx.GraphModule,
        example_inputs: Sequence[Any],
        kind: str,
        context: "CompileContext",
        as_traced: Optional[torch.fx.GraphModule] = None,
        parameters: Sequence[int] = (),
        input_writes: Optional[InputWrites] = None,
    ) -> None:
        """``input_writes``: the outputs AOTAutograd copies back into inputs (an
        inference graph's); they are written in place after each call instead."""
        # An instance attribute, so wrappers made with functools.wraps keep it.
        self._boxed_call = True
        self.kind = kind
        self.context = context
        self.policy = BucketPolicy.from_config(context.config)
        # The graph as traced, for calls past the budget (and nothing else);
        # the backend's own untouched copy where it made one.
        self._eager = as_traced if as_traced is not None else runnable_copy(gm)
        placeholders = list(gm.graph.find_nodes(op="placeholder"))
        self.shape_env = shape_env_of([n.meta.get("val") for n in placeholders])

        facts = GraphFacts.of(context, symbolic=True, input_writes=input_writes)
        gm = run_stages(gm, facts)
        self._deferred_writes: Optional[DeferredWrites] = facts.deferred_writes
        self.analysis: PaddingAnalysis = facts.analysis
        self._real_lengths = SizeFunction(facts.real_length_exprs)
        self._seed_device: Optional[torch.device] = gm.meta.get(SEED_META)
        self.binding = ShapeBinding(placeholders, gm.graph.output_node().args[0], self.analysis.safe)
        self.symbols = self.binding.symbols

        self.record = report.new_graph_record(
            kind,
            num_nodes=len(gm.graph.nodes),
            input_shapes=[
                tuple(str(s) for s in n.meta["val"].shape)
                for n in placeholders
                if isinstance(n.meta.get("val"), torch.Tensor)
            ],
        )
        self._device_caches = (
            DeviceCaches(facts.grown_caches, resident_buffers(context.platform))
            if facts.grown_caches is not None
            else None
        )
        self._kept_padding = None
        if self._deferred_writes is not None:
            self.record.inputs_written_in_place = len(self._deferred_writes.writes)
            resident = resident_buffers(context.platform) if facts.keeps_device_copies else None
            self._kept_padding = KeptPadding({w.input_index for w in self._deferred_writes.writes}, resident)
        self.dynamic_record = report.DynamicGraphRecord(
            graph_id=self.record.graph_id,
            kind=kind,
            padded={str(s): self._source(s) for s in self.symbols if s in self.analysis.safe},
            exact={
                str(s): self.analysis.unsafe.get(s, "not a dim")
                for s in self.symbols
                if s not in self.analysis.safe
            },
        )
        report.record_dynamic_graph(self.dynamic_record)
        from tpu_inductor.compiled_graph import mesh_layout  # it builds on this package

        self.layout = mesh_layout(gm, kind, context, parameters, self.record)
        for symbol, why in self.dynamic_record.exact.items():
            log.info("tpu_inductor: %s compiles at exact sizes: %s", symbol, why)

        self._state = CallState()
        self._buckets: dict[tuple, dict[sympy.Symbol, int]] = {}
        self._compiled: dict[tuple, dict[sympy.Symbol, int]] = {}
        self._eager_keys: set[tuple] = set()
        self._warned = False
        hints = self._hints()
        first = self._bucket(hints)
        self.module, self.islands = self._lower(gm, self._key(first), first)
        if self._device_caches is not None:
            self._device_caches.only_for(self._read_on_device_only())
            self.record.caches_kept_on_device = len(self._device_caches.inputs)
        self._note_compiled(hints, first, cause="traced at these sizes")

    # -- calls ---------------------------------------------------------------

    def __call__(self, args: list[Any]) -> Any:
        call_args = list(args)
        args.clear()
        sizes = self.binding.bind(call_args)
        bucket = self._bucket(sizes)
        key = self._key(bucket)
        if key not in self._compiled and not self._specialise(key, bucket, sizes):
            self.dynamic_record.eager_calls += 1
            return self._eager(*call_args)
        self.dynamic_record.device_calls += 1
        padded = self.binding.pad(call_args, bucket, self._kept_padding, self._device_caches)
        padded += [_length_tensor(value) for value in self._real_lengths(sizes)]
        if self._seed_device is not None:  # after the valid_<size> inputs, as device_random appends it
            padded.append(draw_seed(self._seed_device))
        self._state.key = key
        outputs = self.binding.unpad(self.module.forward(*padded), sizes, call_args)  # no nn.Module hooks
        if self._device_caches is not None:
            outputs = self._device_caches.finish(outputs, call_args)
        if self._deferred_writes is not None:
            return self._deferred_writes.finish(outputs, call_args, self._kept_padding)
        return outputs

    def _specialise(self, key: tuple, bucket: dict, sizes: dict) -> bool:
        """Compile the islands for a new bucket; False when it must run eagerly."""
        # The sizes the graph was traced at always compile, so a budget of 0 acts as 1.
        budget = max(self.context.config.recompile_budget, 1)
        if key in self._eager_keys:
            return False
        over = self._dims_over_budget(bucket, budget)
        if over:
            self._over_budget(key, bucket, sizes, budget, over)
            return False
        try:
            for island in self.islands:
                island.prepare(key, bucket)
        except Exception as exc:  # refinement / XLA refused this bucket only
            if self.context.config.strict:
                raise
            why = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
            log.warning("tpu_inductor: running sizes %s eagerly: %s", self._label(sizes), why)
            self._eager_keys.add(key)
            self._record_recompile(sizes, bucket, "new sizes", f"eager: {why}")
            return False
        self._note_compiled(sizes, bucket, cause=self._cause(bucket))
        return True

    def _dims_over_budget(self, bucket: dict, budget: int) -> list[sympy.Symbol]:
        """The dims to which ``bucket`` would give one size more than ``budget``.

        The budget counts sizes per dim, not executables: two dims that change
        independently (an encoder-decoder's source length and its decoder's
        cache length) need their buckets' product, and each alone is already
        bounded by its buckets. A dim compiled at exact sizes is what it stops.
        """
        over = []
        for symbol in self.symbols:
            seen = {known.get(symbol) for known in self._compiled.values()}
            if bucket.get(symbol) not in seen and len(seen) >= budget:
                over.append(symbol)
        return over

    def _over_budget(self, key: tuple, bucket: dict, sizes: dict, budget: int, over: list[sympy.Symbol]) -> None:
        """``over``: the dims the bucket would give one size too many."""
        message = (
            f"tpu_inductor: the {self.kind} graph reached its recompile budget of {budget} "
            f"sizes per dim; {self._describe_changing(over)} New sizes "
            f"({self._label(sizes)}) now run in eager PyTorch. {self._advice(over)}"
        )
        self._eager_keys.add(key)
        self._record_recompile(sizes, bucket, self._cause(bucket), f"eager: recompile budget of {budget} reached")
        if self.context.config.strict:
            raise RecompileBudgetError(message + " (strict: set strict=False to run them eagerly)")
        if not self._warned:
            self._warned = True
            record_eager(self.record, f"{self.kind} graph at new sizes", Decision("budget exceeded", message))
            log.warning("%s", message)
            warnings.warn(message, RecompileBudgetWarning, stacklevel=2)

    def _read_on_device_only(self) -> list[int]:
        """Argument positions that only device islands read (a device buffer may stand in for them)."""
        placeholders = self.module.graph.find_nodes(op="placeholder")
        return [
            index
            for index, node in enumerate(placeholders)
            if node.users and all(user.name.startswith(ISLAND_PREFIX) for user in node.users)
        ]

    # -- buckets ---------------------------------------------------------------

    def _hints(self) -> dict[sympy.Symbol, int]:
        """The sizes the graph was traced at (the call that triggered the trace)."""
        env = self.shape_env
        values = getattr(env, "backed_var_to_val", None) or getattr(env, "var_to_val", {})
        return {s: int(values[s]) for s in self.symbols if s in values}

    def _bucket(self, sizes: dict[sympy.Symbol, int]) -> dict[sympy.Symbol, int]:
        # Checking Dynamo's guards for a bucket is sympy work: once per distinct sizes.
        values = tuple(sizes.get(s) for s in self.symbols)
        bucket = self._buckets.get(values)
        if bucket is None:
            bucket = choose_buckets(
                sizes, self.analysis.safe, self.analysis.upper_bounds, self.policy, self.shape_env
            )
            self._buckets[values] = bucket
        return bucket

    def _key(self, bucket: dict[sympy.Symbol, int]) -> tuple:
        return tuple(bucket.get(s) for s in self.symbols)

    def _note_compiled(self, sizes: dict, bucket: dict, cause: str) -> None:
        self._compiled[self._key(bucket)] = bucket
        self._record_recompile(sizes, bucket, cause, "compiled")
        log.info("tpu_inductor: %s graph compiled for %s (%s)", self.kind, self._label(bucket), cause)

    def _record_recompile(self, sizes: dict, bucket: dict, cause: str, outcome: str) -> None:
        report.record_recompile(
            report.RecompileRecord(
                graph_id=self.record.graph_id,
                kind=self.kind,
                cause=cause,
                sizes={str(s): v for s, v in sizes.items()},
                bucket={str(s): v for s, v in bucket.items()},
                outcome=outcome,
            )
        )

    def _cause(self, bucket: dict) -> str:
        """Which symbols' values differ from every bucket compiled so far."""
        new = [
            s
            for s in self.symbols
            if all(known.get(s) != bucket.get(s) for known in self._compiled.values())
        ]
        parts = [
            f"{s} ({self._source(s)}) = {bucket[s]}"
            + (" (bucket)" if s in self.analysis.safe else " (exact)")
            for s in new or self.symbols
        ]
        return "no executable for " + ", ".join(parts)

    def _describe_changing(self, symbols: list[sympy.Symbol]) -> str:
        if not symbols:
            return "the sizes kept changing."
        parts = []
        for s in symbols:
            values = sorted({b.get(s) for b in self._compiled.values()})
            if s in self.analysis.safe:
                state = "is padded to buckets"
            else:
                state = f"compiles at exact sizes because {self.analysis.unsafe.get(s, 'it is not a dim')}"
            parts.append(f"{self._source(s)} ({s}) kept changing (compiled for {values}) and {state}.")
        return " ".join(parts)

    def _advice(self, symbols: list[sympy.Symbol]) -> str:
        if any(s in self.analysis.safe for s in symbols):
            return (
                "Raise the 'recompile_budget' option (TPU_INDUCTOR_RECOMPILE_BUDGET), or use "
                "coarser buckets with 'bucket_sizes' / 'bucket_step' / 'bucket_max'."
            )
        return (
            "Raise the 'recompile_budget' option (TPU_INDUCTOR_RECOMPILE_BUDGET); buckets "
            "cannot help a dim that is not padding-safe."
        )

    def _source(self, symbol: sympy.Symbol) -> str:
        return symbol_source(self.shape_env, symbol)

    def _label(self, values: dict) -> str:
        return ", ".join(f"{self._source(s)}={values[s]}" for s in self.symbols if s in values)

    # -- lowering --------------------------------------------------------------

    def _lower(
        self, gm: torch.fx.GraphModule, key: tuple, bucket: dict
    ) -> tuple[torch.fx.GraphModule, list[SymbolicIsland]]:
        """The pipeline's placement and lowering (pipeline.py), each island
        lowered once with dynamic dims and compiled for the first bucket.

        A failure with dynamic shapes may hold only for this graph's buckets,
        so what is learned stays with this graph, out of the shared table.
        """
        probe = functools.partial(self._probe_lowers, key=key, bucket=bucket)

        def build(island: Island) -> SymbolicIsland:
            target = self._island(island, self.record)
            target.prepare(key, bucket)
            return target

        support = graph_support(gm, self.context, probe)
        plan, islands = lower_with_retries(
            gm, support, self.record, self.context, build, probe, learn_for_later=False
        )
        fused = fuse_islands(
            gm, plan, {name: target.run for name, target in islands.items()}, self.context.releases_eager_workers
        )
        return fused, list(islands.values())

    def _island(self, island: Island, record: Optional[report.GraphRecord]) -> SymbolicIsland:
        """``record``: None for a probe, which bypasses the cache (a failure must be seen).

        An island torch-mlir refuses with dynamic dims is lowered per bucket at
        static sizes instead (:class:`PerBucketIsland`); where that fails too,
        the bucket's ``prepare`` raises and the op that fails goes to eager.
        """
        kind = SymbolicIsland
        try:
            if record is None:
                lowered = lower_symbolic(island.graph, isolate=self.context.config.isolate_lowering)
            else:
                lowered, stats = lower_symbolic_cached(
                    island.graph, self.context.disk_cache, isolate=self.context.config.isolate_lowering
                )
                self.dynamic_record.lowerings += stats.source == "torch-mlir"
        except IslandLoweringError as exc:
            log.info("tpu_inductor: %s lowers per bucket at static sizes: %s", island.name, exc)
            kind, lowered = PerBucketIsland, None
        # A probe proves that the island lowers; it compiles for one device.
        layout = (
            (self.layout, tensor_inputs(island), island.outputs)
            if record is not None and self.layout is not None
            else None
        )
        return kind(
            island.name, island.graph, lowered, self._state, self.context, record, layout,
            device_only=device_copies_out(island) if record is not None else frozenset(),
        )

    def _probe_lowers(self, probe: Island, *, key: tuple, bucket: dict) -> None:
        self._island(probe, None).prepare(key, bucket)


@functools.lru_cache(maxsize=4096)
def _length_tensor(value: int) -> torch.Tensor:
    """The ``valid_<size>`` argument holding ``value``: made once per value (the
    graph only reads it), where ``torch.tensor`` costs ~2 us a call. Never an
    inference tensor, though the first call may run under ``inference_mode``:
    a later training graph's eager node may save it for backward."""
    with torch.inference_mode(False):
        return torch.tensor(value, dtype=torch.int64)
