"""The traced level of the cache: PyTorch's AOTAutogradCache keeps our compiled graphs.

Why: the graph and executable levels (``<cache_dir>/graphs``, ``executables``)
skip torch-mlir and XLA on a warm start, but the user still waited for
AOTAutograd to trace every graph again: functionalisation, the joint graph,
the partitioner, often most of a first call. PyTorch's own AOTAutogradCache
skips that for any backend whose compilers return a picklable
``OutputCode`` (``torch/_functorch/_aot_autograd/autograd_cache.py``; the facts
are in docs/design/aot-autograd-cache.md). :class:`CompiledAten` is ours: it
keeps the ATen graph as AOTAutograd traced it. On a hit PyTorch unpickles it
and calls :meth:`CompiledAten.post_compile`, which runs the backend on that
graph again; its islands then come from the graph and executable levels
(disk reads, no torch-mlir, no XLA).

What is in the key besides PyTorch's own parts (the Dynamo graph, input
metadata and dynamic dims, grad mode, torch's configs and sources, the thread
count): :func:`key_tag`, our source digest, because our decomposition table
shapes the traced graph, and which decomposition set traced it (embedding
bags left whole on the CPU client with ``eager_kernels``). No other option
is: none changes what AOTAutograd traces (they act in the pipeline, which
reruns on a hit), and the levels below key on the options that change their
output.

PyTorch keeps these entries in its own cache directory
(``TORCHINDUCTOR_CACHE_DIR``, shared with Inductor); ``tpu-inductor cache``
lists and clears ours there (runtime/torch_cache.py).
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import logging
import threading
from typing import Any, Callable, Iterator, Mapping, Optional, Sequence

import torch
import torch.fx

from tpu_inductor import report, torch_api
from tpu_inductor.torch_api import BypassAOTAutogradCache, OutputCode, SerializableAOTDispatchCompiler
from tpu_inductor.passes.input_writes_in_place import InputWrites
from tpu_inductor.process_state import STATE
from tpu_inductor.runtime.disk_cache import CacheDir
from tpu_inductor.versions import versions_digest
from tpu_inductor.runtime.persisted_dict import PersistedDict

log = logging.getLogger(__name__)

CompileAten = Callable[
    [torch.fx.GraphModule, Sequence[Any], str, tuple[int, ...], Optional[InputWrites]], "CompiledAten"
]
"""The backend's compile for one Dynamo graph: (ATen graph, example inputs,
kind, positions of parameter inputs, outputs copied back into inputs) -> :class:`CompiledAten`."""

_AOT_CACHE_LOGGER = "torch._functorch._aot_autograd.autograd_cache"


class CompiledAten(OutputCode):
    """What our AOTAutograd compilers return: the backend's callable for one
    ATen graph, and that graph as traced, which is what the cache stores."""

    def __init__(
        self,
        kind: str,
        graph: torch.fx.GraphModule,
        parameters: tuple[int, ...],
        compiled: Callable[[list[Any]], Any],
        options: Mapping[str, Any],
        input_writes: Optional[InputWrites] = None,
    ) -> None:
        super().__init__()
        self._boxed_call = True  # an instance attribute: functools.wraps copies it
        self.kind = kind
        self.parameters = parameters
        self.input_writes = input_writes
        self.options = dict(options)
        self._graph: Optional[torch.fx.GraphModule] = graph
        self.compiled: Optional[Callable[[list[Any]], Any]] = compiled  # None in the pickled copy
        self._graph_bytes: Optional[bytes] = None

    def __call__(self, args: list[Any]) -> Any:
        return self.compiled(args)

    def prepare_for_serialization(self) -> None:
        """Runs on a shallow copy that PyTorch pickles: rebind, never mutate."""
        from tpu_inductor.torch_api import GraphPickler, GraphPicklerOptions

        try:
            # Every op the graph holds (ours included, e.g. operator.getitem);
            # node metadata without the module stacks, which hold live objects.
            self._graph_bytes = GraphPickler.dumps(self._graph, GraphPicklerOptions(ops_filter=None))
        except Exception as exc:
            raise BypassAOTAutogradCache(f"tpu_inductor: the {self.kind} ATen graph does not pickle: {exc}") from exc
        self._graph = None
        self.compiled = None

    def post_compile(self, example_inputs: Sequence[Any], constants: Any, graph_kwargs: Any) -> None:
        """On a cache hit: run the backend on the stored graph. Any exception
        here makes PyTorch bypass the entry and trace anew."""
        if self.compiled is not None:
            return
        from tpu_inductor.torch_api import GraphPickler, detect_fake_mode

        # Inside the backend, its context for this Dynamo graph; loaded by
        # PyTorch's precompile (TORCH_CACHING_PRECOMPILE), which skips Dynamo
        # and so the backend, one made from the options it was compiled with.
        compile_aten = _current_compile() or _standalone_compile(self.options)
        graph = GraphPickler.loads(self._graph_bytes, detect_fake_mode(example_inputs))
        graph.recompile()
        # Not example_inputs: for a backward PyTorch passes the forward's.
        inputs = [node.meta.get("val") for node in graph.graph.find_nodes(op="placeholder")]
        fresh = compile_aten(graph, inputs, self.kind, self.parameters, self.input_writes)
        self._graph, self.compiled = fresh._graph, fresh.compiled

    def set_triton_bundle(self, triton_bundle: Any) -> None:
        """No Triton kernels here."""


def _standalone_compile(options: Mapping[str, Any]) -> CompileAten:
    from tpu_inductor.backend import compile_without_dynamo

    return compile_without_dynamo(options)


def serializable(kind: str, compile_aten: Callable[..., CompiledAten]) -> SerializableAOTDispatchCompiler:
    """``compile_aten`` as an AOTAutograd compiler whose results the cache may store."""

    def compiler(gm: torch.fx.GraphModule, example_inputs: Sequence[Any]) -> CompiledAten:
        return compile_aten(gm, example_inputs, kind)

    return SerializableAOTDispatchCompiler(CompiledAten, compiler)


MIN_INFERENCE_NODES = 500
"""An inference graph smaller than this is traced again rather than looked
up. Measured on 2 cores (docs/cache.md): AOTAutograd traces an inference
graph at about 2 ms per Dynamo node; a lookup costs about 0.6 s once per
process (PyTorch's key imports Inductor's code generators) plus about 0.5 ms
per node. Training graphs (joint trace and partitioner) always gain."""


def pays(gm: torch.fx.GraphModule, needs_grad: bool) -> bool:
    """Whether the traced level is worth its lookup for this Dynamo graph."""
    if torch_api.dynamo_config.caching_precompile:
        # PyTorch's precompile stores exactly what AOTAutograd's cache holds.
        return True
    return needs_grad or len(gm.graph.nodes) >= MIN_INFERENCE_NODES


def _versions_tag() -> str:
    return f"tpu_inductor:{versions_digest()}"


def key_tag(decompositions: str) -> str:
    """What we add to AOTAutogradCache's key (through ``cache_key_tag``):
    our versions, and which of our decomposition sets traced the graph
    (backend.py: whether embedding bags were left whole for PyTorch's kernels)."""
    return f"{_versions_tag()}:{decompositions}"


_local = threading.local()


def _current_compile() -> Optional[CompileAten]:
    return getattr(_local, "compile_aten", None)


@contextlib.contextmanager
def traced_level(
    compile_aten: CompileAten,
    needs_grad: bool,
    gm: torch.fx.GraphModule,
    example_inputs: Sequence[Any],
    cache_dir: CacheDir,
    decompositions: str,
) -> Iterator[None]:
    """AOTAutograd runs inside: its cache on for our compilers, hits rebuilt
    with ``compile_aten``, and the lookup recorded in the report (a miss
    with its reason, from what ``cache_dir``'s index says this graph was
    traced with before).

    The backward compiles with the forward when the cache is on, as in
    PyTorch's own precompile: PyTorch saves the entry when the backward is
    compiled, and it must still see the bundled-entry setting then.
    """
    from tpu_inductor.torch_api import dynamo_counters as counters

    previous = _current_compile()
    _local.compile_aten = compile_aten
    user_tag = torch.compiler.config.cache_key_tag
    before = dict(counters["aot_autograd"])
    with contextlib.ExitStack() as stack:
        stack.enter_context(
            torch_api.functorch_config.patch(
                bundled_autograd_cache=True, force_non_lazy_backward_lowering=needs_grad
            )
        )
        stack.enter_context(torch.compiler.config.patch(cache_key_tag=f"{user_tag}|{key_tag(decompositions)}"))
        bypasses = stack.enter_context(_bypass_reasons())
        try:
            yield
        finally:
            _local.compile_aten = previous
            _record_lookup(before, dict(counters["aot_autograd"]), bypasses, _Traced.of(gm, example_inputs, cache_dir, decompositions))


_MISS_REASONS = {
    "versions": "version changed",
    "decompositions": "decompositions changed (platform or option eager_kernels)",
    "inputs": "input shapes or dtypes changed",
    "grad_mode": "grad mode changed",
    "threads": "thread count changed",
}
"""A part of what a graph was traced with -> the miss reason when it changed."""


@dataclasses.dataclass
class _Traced:
    """One Dynamo graph as the traced level saw it, against the index of
    what it saw before (``CacheDir.traced_index_file``)."""

    index: PersistedDict
    graph: str
    """A digest of the Dynamo graph's code: the same model gives the same code."""
    seen: dict[str, Any]

    @classmethod
    def of(
        cls, gm: torch.fx.GraphModule, example_inputs: Sequence[Any], cache_dir: CacheDir, decompositions: str
    ) -> "_Traced":
        seen = {
            "versions": f"{_versions_tag()} torch {torch.__version__}",
            "decompositions": decompositions,
            "inputs": [_describe(x) for x in example_inputs],
            "grad_mode": torch.is_grad_enabled(),
            "threads": torch.get_num_threads(),
        }
        graph = hashlib.sha256(gm.code.encode()).hexdigest()[:24]
        return cls(_index(cache_dir), graph, seen)

    def miss_reason(self) -> str:
        """What differs from the last time this graph was traced; "no entry"
        for a graph never seen (a new or changed model) or where only PyTorch's
        own settings, which its key also holds, can differ."""
        before = self.index.get(self.graph) or {}
        changed = [why for part, why in _MISS_REASONS.items() if part in before and before[part] != self.seen[part]]
        return changed[0] if changed else "no entry"

    def remember(self) -> None:
        self.index.put(self.graph, self.seen, replace=True)


def _describe(value: Any) -> str:
    if isinstance(value, torch.Tensor):
        grad = ",grad" if value.requires_grad else ""
        return f"{str(value.dtype).removeprefix('torch.')}[{','.join(map(str, value.shape))}]{grad}"
    return type(value).__name__


def _index(cache_dir: CacheDir) -> PersistedDict:
    indexes = STATE.traced_indexes
    path = cache_dir.traced_index_file
    if path not in indexes:
        indexes[path] = PersistedDict(path)
    return indexes[path]


def _record_lookup(before: dict[str, int], after: dict[str, int], bypasses: list[str], traced: _Traced) -> None:
    def grew(name: str) -> bool:
        return after.get(f"autograd_cache_{name}", 0) > before.get(f"autograd_cache_{name}", 0)

    if grew("hit"):
        event = report.CacheEvent(level="traced", key=traced.graph, hit=True)
    elif grew("guard_miss"):
        event = report.CacheEvent(level="traced", key=traced.graph, hit=False, reason="shape guards differ")
    elif grew("miss"):
        event = report.CacheEvent(level="traced", key=traced.graph, hit=False, reason=traced.miss_reason())
        traced.remember()
    elif grew("bypass"):
        why = bypasses[-1] if bypasses else "PyTorch bypassed its cache (TORCH_LOGS=+aot says why)"
        event = report.CacheEvent(level="traced", key=traced.graph, hit=False, reason=f"not cacheable: {why}")
    else:  # the cache is off (force_disable_caches, TORCHINDUCTOR_AUTOGRAD_CACHE=0)
        return
    report.record_cache_event(event)
    if event.hit:
        log.debug("tpu_inductor: traced graph from AOTAutograd's cache")
    else:
        log.info("tpu_inductor: traced cache miss: %s", event.reason)


class _BypassReasons(logging.Filter):
    """Collects AOTAutogradCache's "Bypassing autograd cache due to: ..." lines
    and passes on only the records its logger passed before we listened."""

    def __init__(self, threshold: int) -> None:
        super().__init__()
        self.threshold = threshold
        self.reasons: list[str] = []

    def filter(self, record: logging.LogRecord) -> bool:
        if isinstance(record.msg, str) and record.msg.startswith("Bypassing autograd cache") and record.args:
            self.reasons.append(str(record.args[0]).splitlines()[0])
        return record.levelno >= self.threshold


@contextlib.contextmanager
def _bypass_reasons() -> Iterator[list[str]]:
    """The reasons PyTorch logs (at INFO) for bypassing, without printing
    them: its logger is opened to INFO while we listen, and our filter drops
    what it would have dropped, so its handlers see what they saw before."""
    logger = logging.getLogger(_AOT_CACHE_LOGGER)
    saved_level = logger.level
    listener = _BypassReasons(logger.getEffectiveLevel())
    logger.addFilter(listener)
    logger.setLevel(min(logging.INFO, logger.getEffectiveLevel()))
    try:
        yield listener.reasons
    finally:
        logger.removeFilter(listener)
        logger.setLevel(saved_level)
