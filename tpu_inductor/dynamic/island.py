"""One device island of a dynamic graph: lowered once, an executable per bucket.

Why: the island's StableHLO is lowered with dynamic dims once
(:func:`~tpu_inductor.lowering.symbolic.lower_symbolic`); for each bucket the
graph asks for, its shapes are evaluated from the island's symbolic metadata,
the module is refined to them (:func:`~tpu_inductor.lowering.refine.refine_to_static`)
and compiled (memory, disk or XLA, like every executable). The graph selects
the bucket for a call before running; islands read it from the shared
:class:`CallState` instead of re-deriving it from their arguments. An
island torch-mlir lowers only at static sizes is a :class:`PerBucketIsland`,
lowered again per bucket.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Any, Hashable, Mapping, Optional, Sequence

import sympy
import torch
import torch.fx

from tpu_inductor import report
from tpu_inductor.dynamic import SYMBOLIC_TYPES
from tpu_inductor.errors import LoweringError, OutputMismatchError
from tpu_inductor.lowering.refine import refine_to_static
from tpu_inductor.lowering.symbolic import SymbolicModule
from tpu_inductor.passes.eager_views_as_reshape import eager_views_as_reshape
from tpu_inductor.passes.rewrite import runnable_copy
from tpu_inductor.placement.placement import Decision, record_eager
from tpu_inductor.analysis.padding_safety import expr_of
from tpu_inductor.reporting import hooks
from tpu_inductor.runtime import DeviceExecutable
from tpu_inductor.runtime.executable import TensorSpec
from tpu_inductor.runtime.transfer import to_torch

log = logging.getLogger(__name__)


class CallState(threading.local):
    """The bucket of the call in progress, per thread."""

    key: Optional[Hashable] = None


class SymbolicIsland:
    """What a dynamic graph calls in place of an island (see :meth:`run`)."""

    def __init__(
        self,
        name: str,
        graph: torch.fx.GraphModule,
        lowered: Optional[SymbolicModule],
        state: CallState,
        context: Any,
        record: Optional[report.GraphRecord],
        layout: Optional[tuple[Any, list[torch.fx.Node], Sequence[torch.fx.Node]]] = None,
        device_only: frozenset[int] = frozenset(),
    ) -> None:
        """``lowered``: the island's module with dynamic dims (None for a
        :class:`PerBucketIsland`, which has none). ``layout``: the graph's
        ``MeshLayout`` and the owner graph's nodes this island's tensor inputs
        and its results are, to compile each bucket for the mesh.
        ``device_only``: results handed on as device buffers
        (passes/input_writes_in_place.py)."""
        self.island_name = name
        self._device_only = device_only
        self._layout = layout
        self.graph = graph
        self.lowered = lowered
        self._state = state
        self._context = context
        self._record = record
        self._num_nodes = sum(n.op == "call_function" for n in graph.graph.nodes)
        self._tensor_inputs: list[tuple[tuple[sympy.Expr, ...], torch.dtype]] = []
        self._scalar_inputs: dict[int, sympy.Expr] = {}
        for index, node in enumerate(graph.graph.find_nodes(op="placeholder")):
            val = node.meta.get("val")
            if isinstance(val, torch.Tensor):
                self._tensor_inputs.append((tuple(expr_of(s) for s in val.shape), val.dtype))
            elif isinstance(val, (*SYMBOLIC_TYPES, int, float)):
                self._scalar_inputs[index] = expr_of(val) if not isinstance(val, float) else val
            else:
                raise LoweringError(f"{name}: unsupported island input {val!r}")
        outputs = graph.graph.output_node().args[0]
        outputs = outputs if isinstance(outputs, (list, tuple)) else (outputs,)
        self._outputs = [
            (tuple(expr_of(s) for s in n.meta["val"].shape), n.meta["val"].dtype) for n in outputs
        ]
        self._executables: dict[Hashable, DeviceExecutable] = {}
        self._eager_keys: set[Hashable] = set()

    def prepare(self, key: Hashable, sizes: Mapping[sympy.Symbol, int]) -> DeviceExecutable:
        """The executable for the bucket ``key`` whose symbol values are ``sizes``."""
        found = self._executables.get(key)
        if found is not None:
            return found
        context = self._context
        substitution = {s: sympy.Integer(v) for s, v in sizes.items()}

        def size(expr: sympy.Expr) -> int:
            value = expr.xreplace(substitution)
            if not value.is_number:
                raise LoweringError(f"{self.island_name}: size {expr} is not fixed by {sizes}")
            return int(value)

        input_specs = [TensorSpec(tuple(size(e) for e in shape), dtype) for shape, dtype in self._tensor_inputs]
        scalars = {
            i: (e if isinstance(e, float) else _number(e.xreplace(substitution)))
            for i, e in self._scalar_inputs.items()
        }
        started = time.perf_counter()
        module, lower_source = self._module_at(input_specs, scalars)
        refined_seconds = time.perf_counter() - started
        output_specs = [TensorSpec(tuple(size(e) for e in shape), dtype) for shape, dtype in self._outputs]
        label = ",".join(f"{s}={v}" for s, v in sorted(sizes.items(), key=lambda kv: str(kv[0])))
        layout, shardings, output_shardings = None, (), ()
        if self._layout is not None:
            layout, inputs, outputs = self._layout
            shardings = layout.input_shardings(inputs, [s.shape for s in input_specs], sizes)
            output_shardings = layout.output_shardings(outputs, len(output_specs))
        from tpu_inductor.compiled_graph import compile_module, compiled_island_record  # it builds on this package

        executable, stats = compile_module(
            module, input_specs, output_specs, context, f"{self.island_name}[{label}]", layout, shardings,
            device_only=self._device_only, output_shardings=output_shardings,
        )
        self._executables[key] = executable
        if self._record is not None:
            island_record = compiled_island_record(
                f"{self.island_name}[{label}]", self._num_nodes, executable, stats, refined_seconds, lower_source
            )
            self._record.islands.append(island_record)
            hooks.on_island_compiled(self._record, island_record, module, check_tpu=context.checks_tpu_readiness)
        return executable

    def _module_at(self, input_specs: Sequence[TensorSpec], scalars: Mapping[int, Any]) -> tuple[Any, str]:
        """The StableHLO module for one bucket, the dynamic module refined to its
        sizes, and how it was made (``IslandRecord.lower_source``)."""
        module = refine_to_static(
            self.lowered.text,
            [s.shape for s in input_specs],
            scalars,
            for_cpu=self._context.platform.name == "cpu",
        )
        return module, "refined"

    def run(self, *args: Any) -> tuple[torch.Tensor, ...]:
        key = self._state.key
        if key in self._eager_keys:
            return tuple(self.graph(*self._on_host(args)))
        try:
            # Tensors, and device buffers handed on in a tensor's place (dynamic/device_caches.py).
            return tuple(self._executables[key](*[a for a in args if not isinstance(a, _NUMBERS)]))
        except OutputMismatchError as exc:  # checked on a bucket's first call only
            # The island's ATen graph on the padded inputs is right by construction.
            log.warning("tpu_inductor: %s; this bucket runs the island eagerly", exc)
            if self._record is not None:
                record_eager(self._record, self.island_name, Decision("result mismatch", str(exc)))
            self._eager_keys.add(key)
            return tuple(self.graph(*self._on_host(args)))

    def _on_host(self, args: Sequence[Any]) -> list[Any]:
        """``args`` with each device buffer handed on in a tensor's place fetched, for the ATen graph."""
        return [a if isinstance(a, (torch.Tensor, *_NUMBERS)) else to_torch(a, self._context.platform) for a in args]


_NUMBERS = (int, float, bool)
"""A padded call's scalar arguments (sizes at their bucket values); the executables take none."""


def _number(value: sympy.Expr) -> Any:
    if value.is_Integer:
        return int(value)
    if value.is_Boolean:
        return bool(value)
    return float(value)


class PerBucketIsland(SymbolicIsland):
    """An island torch-mlir lowers only at static sizes, lowered again for each bucket.

    Why: some of torch-mlir's lowerings need a static dim: ``cumsum`` along a
    dynamic one (OPT's, BLOOM's and RoBERTa's positions from the mask) failed
    to legalize, and ``sort`` made an ``iota`` of dynamic type, which StableHLO
    refuses (MoE routers). The op ran in eager PyTorch, splitting its island,
    after a failed compile with a warning and a reproducer. Here the island's
    ATen graph is traced again at each bucket's sizes and lowered as a static
    island is: torch-mlir runs once per bucket instead of once, which only
    such islands pay. The graph cache keeps each bucket's StableHLO and the
    refusal itself (lowering/cache.py, ``STATIC_ONLY``), so a restarted
    process runs no torch-mlir for them.
    """

    def _module_at(self, input_specs: Sequence[TensorSpec], scalars: Mapping[int, Any]) -> tuple[Any, str]:
        from tpu_inductor.lowering.cache import lower_cached

        graph = _at_sizes(self.graph, input_specs, scalars)
        context = self._context
        # A probe (no record) bypasses the graph cache: a failure must be seen.
        lowered, stats = lower_cached(
            graph,
            context.disk_cache if self._record is not None else None,
            for_cpu=context.platform.name == "cpu",
            isolate=context.config.isolate_lowering,
        )
        return lowered.module, stats.source


def _at_sizes(
    graph: torch.fx.GraphModule, input_specs: Sequence[TensorSpec], scalars: Mapping[int, Any]
) -> torch.fx.GraphModule:
    """``graph`` traced at static sizes: its tensor inputs fake tensors of
    ``input_specs``, its number inputs the values ``scalars`` gives them (by
    placeholder position), which the trace folds in and drops as inputs."""
    from torch.fx.experimental.proxy_tensor import make_fx

    from tpu_inductor.torch_api import FakeTensorMode

    # An island's views read its values, not its inputs' strides (torch-mlir
    # imports a view as a reshape, and the partition dropped the copies that
    # made them contiguous), so running it needs a reshape where it has a view.
    graph = eager_views_as_reshape(runnable_copy(graph))
    tensors = iter(input_specs)
    args: list[Any] = []
    with FakeTensorMode():
        for index, node in enumerate(graph.graph.find_nodes(op="placeholder")):
            if index in scalars:
                args.append(scalars[index])
            else:
                spec = next(tensors)
                args.append(torch.empty(spec.shape, dtype=spec.dtype, device=node.meta["val"].device))
    static = make_fx(graph, tracing_mode="fake")(*args)
    for node in static.graph.find_nodes(op="placeholder"):
        if not isinstance(node.meta.get("val"), torch.Tensor):
            if node.users:
                raise LoweringError(f"number input {node.name} is still read after tracing at static sizes")
            static.graph.erase_node(node)
    static.recompile()
    return static
