"""The ``tpu`` Dynamo backend: Dynamo graph -> AOTAutograd -> islands on PJRT.

Registered under the ``torch_dynamo_backends`` entry point, so
``torch.compile(model, backend="tpu", options={...})`` needs no import.
AOTAutograd traces forward and backward ATen graphs with our decomposition
table and handles input mutation, aliasing and autograd; each ATen graph then
goes to :func:`tpu_inductor.compiled_graph.compile_graph`.
"""

from __future__ import annotations

import contextlib
import functools
import logging
from typing import Any, Callable, Mapping, Optional, Sequence

import torch

from tpu_inductor import aot_cache, report
from tpu_inductor.torch_api import above_autograd, aot_autograd, min_cut_rematerialization_partition, recompile_reason
from tpu_inductor.compiled_graph import CompileContext, compile_graph, eager_graph, parameter_inputs
from tpu_inductor.config import Config, check_mode
from tpu_inductor.dynamic import dynamic_dims
from tpu_inductor.errors import TpuInductorError
from tpu_inductor.lowering.pipelines import start_worker
from tpu_inductor.decompositions.table import above_autograd_decompositions, decomposition_table
from tpu_inductor.analysis.in_place_updates import in_place_update_reason
from tpu_inductor.passes.input_writes_in_place import InputWrites
from tpu_inductor.passes.rewrite import runnable_copy
from tpu_inductor.placement.placement import Decision, record_eager
from tpu_inductor.reporting import hooks
from tpu_inductor.runtime import cache_artifacts  # noqa: F401  (registers our entries with PyTorch's cache bundle)
from tpu_inductor.runtime import threads

log = logging.getLogger(__name__)


def tpu_backend(
    gm: torch.fx.GraphModule,
    example_inputs: Sequence[Any],
    options: Optional[Mapping[str, Any]] = None,
    mode: Optional[str] = None,
) -> Callable[..., Any]:
    """Compile one Dynamo graph; ``options`` and ``mode`` come from
    ``torch.compile(options=...)`` / ``torch.compile(mode=...)``
    (:data:`~tpu_inductor.config.COMPILE_MODES` says what each mode means here)."""
    check_mode(mode)
    context = CompileContext.create(Config.load(options), example_inputs)
    if context.config.isolate_lowering:
        start_worker()  # its start overlaps tracing (lowering/pipelines.py)
    dims = dynamic_dims(gm)
    dynamo_trace = report.record_trace(dims, recompile_reason())
    hooks.on_dynamo_graph(gm, dynamo_trace, context.config.report_dir)
    in_place = in_place_update_reason(gm) if context.kernels is not None else None
    if in_place:
        return _run_in_place(gm, example_inputs, in_place, dynamo_trace, context.releases_eager_workers)

    compile_aten = functools.partial(_compile_aten, context=context, trace=dynamo_trace, options=options or {})
    needs_grad = _needs_grad(example_inputs)
    cached = context.config.cache and aot_cache.pays(gm, needs_grad)
    # On the CPU client PyTorch's embedding-bag kernels run them
    # (placement/kernel_choice.py); elsewhere they are decomposed to lower.
    keep_embedding_bags = context.kernels is not None

    def compiler(kind: str):
        if cached:
            return aot_cache.serializable(kind, compile_aten)
        # The callable itself: no wrapper's frame on every call.
        return lambda gm, example_inputs: compile_aten(gm, example_inputs, kind).compiled

    trace = aot_autograd(
        fw_compiler=compiler("forward"),
        bw_compiler=compiler("backward"),
        inference_compiler=compiler("inference"),
        partition_fn=min_cut_rematerialization_partition,
        # Inference keeps attention whole: for the padding analysis of dynamic
        # shapes (analysis/padding_safety.py), and because passes/attention.py
        # builds it from ATen ops faster than AOTAutograd traces PyTorch's
        # decomposition of it.
        decompositions=decomposition_table(keep_attention=not needs_grad, keep_embedding_bags=keep_embedding_bags),
    )
    traced_level = (
        aot_cache.traced_level(
            compile_aten, needs_grad, gm, example_inputs, context.disk_cache,
            decompositions="embedding bags kept" if keep_embedding_bags else "embedding bags decomposed",
        )
        if cached
        else contextlib.nullcontext()
    )
    with _attention_for_autograd(needs_grad), above_autograd(above_autograd_decompositions(keep_embedding_bags)):
        with report.within_trace(dynamo_trace), report.stage("aot_autograd"), traced_level:
            return trace(gm, example_inputs)


def _run_in_place(
    gm: torch.fx.GraphModule,
    example_inputs: Sequence[Any],
    reason: str,
    trace: report.TraceRecord,
    release_eager_workers: bool,
) -> Callable[..., Any]:
    """Run an in-place update graph as Dynamo traced it (analysis/in_place_updates.py).

    ``release_eager_workers``: stop OpenMP's workers after it, so that the
    islands of the next step (forward, backward) get every core
    (runtime/threads.py)."""
    with report.within_trace(trace):
        record = report.new_graph_record(
            "inference",
            num_nodes=len(gm.graph.nodes),
            input_shapes=[tuple(x.shape) for x in example_inputs if isinstance(x, torch.Tensor)],
        )
    record_eager(record, "in-place update graph", Decision("in-place update graph", reason))

    def run(*args: Any) -> Any:
        record.executions += 1
        return gm.forward(*args)

    return threads.then_releasing_eager_workers(run) if release_eager_workers else run


def _needs_grad(example_inputs: Sequence[Any]) -> bool:
    """Whether AOTAutograd will trace a backward (as it decides it)."""
    return torch.is_grad_enabled() and any(
        isinstance(x, torch.Tensor) and x.requires_grad for x in example_inputs
    )


def _attention_for_autograd(needs_grad: bool) -> contextlib.AbstractContextManager:
    """Trace scaled_dot_product_attention as plain matmuls when gradients flow.

    On CPU, SDPA dispatches to the flash kernel, whose second output is the
    logsumexp its backward needs. The decomposition torch-mlir's table uses
    for it returns the attention probabilities there instead: fine for
    inference, where that output is dead, but in training the backward read
    it as the logsumexp and gradients came out silently wrong. The math
    backend decomposes SDPA above autograd, so forward and backward are
    ordinary ops that lower.
    """
    if not needs_grad:
        return contextlib.nullcontext()
    from torch.nn.attention import SDPBackend, sdpa_kernel

    return sdpa_kernel(SDPBackend.MATH)


def _compile_aten(
    gm: torch.fx.GraphModule,
    example_inputs: Sequence[Any],
    kind: str,
    parameters: Optional[tuple[int, ...]] = None,
    input_writes: Optional[InputWrites] = None,
    *,
    context: CompileContext,
    trace: Optional[report.TraceRecord] = None,
    options: Mapping[str, Any],
) -> aot_cache.CompiledAten:
    """One ATen graph through the backend. ``parameters``: positions of the
    parameter inputs, and ``input_writes``: the outputs AOTAutograd copies back
    into inputs, both read from AOTAutograd's metadata unless given (a graph
    from the traced cache brings its own)."""
    if parameters is None:
        parameters = parameter_inputs()
        input_writes = InputWrites.of_current_trace()
    # A backward graph may compile at the first backward call (unless the
    # traced level compiles it with the forward), after Dynamo's trace is
    # over: the trace record travels with the compiler.
    with report.within_trace(trace), report.stage("backend"):
        # The pipeline rewrites gm in place; a failure half-way must not leave
        # the eager fallback a half-rewritten graph.
        as_traced = runnable_copy(gm)
        try:
            compiled = compile_graph(gm, example_inputs, kind, context, as_traced, parameters, input_writes)
        except TpuInductorError:  # strict mode, config, budget: raised on purpose
            raise
        except Exception as exc:  # a failure no retry caught must not fail the user's call
            if context.config.strict:
                raise
            log.warning(
                "tpu_inductor: compiling the %s graph failed (%s: %s); it runs in eager PyTorch",
                kind, type(exc).__name__, str(exc).splitlines()[0] if str(exc) else "",
                exc_info=log.isEnabledFor(logging.DEBUG),
            )
            # A copy: eager_graph keeps its record in the graph's meta, and
            # as_traced is what the traced level pickles.
            compiled = eager_graph(
                runnable_copy(as_traced), kind, f"the backend failed on this graph: {type(exc).__name__}: {exc}"
            )
    hooks.on_graph_compiled()
    return aot_cache.CompiledAten(kind, as_traced, parameters, compiled, options, input_writes)


def compile_without_dynamo(options: Mapping[str, Any]) -> aot_cache.CompileAten:
    """The backend's compile for ATen graphs that PyTorch's precompile cache
    hands back without calling the backend (Dynamo is skipped): a context
    made from the options the graphs were compiled with."""

    def compile_aten(gm, example_inputs, kind, parameters=None, input_writes=None):
        context = CompileContext.create(Config.load(options), example_inputs)
        trace = report.record_trace({}, "loaded from PyTorch's precompile cache")
        return _compile_aten(
            gm, example_inputs, kind, parameters, input_writes, context=context, trace=trace, options=options
        )

    return compile_aten
