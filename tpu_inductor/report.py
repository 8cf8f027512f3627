"""The structured record of what the backend did.

Every stage appends to one process-wide :class:`Report`: each compiled graph
with its islands and the nodes that ran eagerly (op, reason, user source
line), each executable compile with where it came from (XLA, memory or
the disk cache), and each disk-cache lookup with, for a miss, its reason.
Readers (tests, ``explain``, the CLI) read this record;
nothing else prints.

Dynamo graph breaks, each Dynamo trace (with its frame and, for a
recompile, the guard that failed), compile time per stage (see
:func:`stage`), execution counts and reproducer bundles are recorded here
too. The views of the record live in :mod:`tpu_inductor.reporting`: JSON
(:meth:`Report.to_json`, with a schema), the short text of ``str(report)``,
the HTML page and the report directory; this module stays a plain record so
that every stage can write to it cheaply.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import sys
import threading
import time
from typing import Any, Iterator, Optional


@dataclasses.dataclass
class FallbackRecord:
    """One ATen node that ran in eager PyTorch instead of on the device."""

    op: str
    reason: str
    source: Optional[str]
    why: str = "unsupported"
    """The placement's kind of decision (placement/placement.py: ``unsupported``,
    ``learned failure``, ``chosen by measurement``, ``result mismatch``, ...)."""


@dataclasses.dataclass
class IslandRecord:
    name: str
    num_nodes: int
    compile_source: str  # "xla", "memory" or "disk"
    lower_seconds: float
    compile_seconds: float
    cache_key: str
    lower_source: str = "torch-mlir"
    """``torch-mlir`` (lowered now), ``disk`` (StableHLO from the graph cache),
    ``refined`` (a dynamic-shape module specialised) or ``collective`` (a
    functional collective under torchrun, runtime/collectives.py)."""
    ops: dict[str, int] = dataclasses.field(default_factory=dict)
    """ATen op -> how many nodes of it the island runs on the device."""
    executions: int = 0
    """Calls of the island's executable."""
    stablehlo_file: Optional[str] = None
    """The island's StableHLO text, relative to the report directory (when one is set)."""
    results_kept: bool = False
    """Computes from parameters only; its results are reused while those are
    unchanged (``freeze_parameters``), so ``executions`` counts recomputations."""
    shardings: Optional[dict[str, list[str]]] = None
    """On a device mesh: the HLO sharding of each input and output
    (``{devices=[4,1]0,1,2,3}``, ``{replicated}``); None on one device."""
    collectives: Optional[dict[str, int]] = None
    """On a device mesh: the collectives XLA put in the compiled program
    (``all-reduce``, ``all-gather``, ...), counted from its HLO."""
    xla_schedule: Optional[str] = None
    """XLA:CPU's scheduler kept for this executable and the temporary memory
    each needed, when this process chose it (runtime/xla_schedule.py: once
    the executable is hot); None otherwise."""
    ynn_reductions_off: Optional[str] = None
    """The short reduction for which XLA:CPU ran this executable's reductions in
    its own loops, not YNNPACK's, when this process compiled it
    (runtime/ynn_reductions.py); None otherwise."""
    tpu_findings: Optional[list[dict]] = None
    """What a TPU could not run in the island's module (lowering/tpu_readiness.py:
    ``kind``, ``op``, ``detail``, ``explained``); None when not checked."""


@dataclasses.dataclass
class CacheEvent:
    """One lookup in the on-disk artifact cache."""

    level: str
    """``traced`` (Dynamo graph -> ATen graphs, skips AOTAutograd: aot_cache.py),
    ``graph`` (ATen graph -> StableHLO, skips torch-mlir) or ``executable``
    (StableHLO -> PJRT executable, skips XLA)."""
    key: str
    """The entry's directory name under ``<cache_dir>/graphs|executables/``;
    for ``traced``, a digest of the Dynamo graph's code."""
    hit: bool
    reason: Optional[str] = None
    """For a miss: ``no entry``, ``version changed``, ``options changed``,
    ``platform changed`` or ``corrupted`` (the entry was evicted); at the
    traced level also ``input shapes or dtypes changed``, ``grad mode
    changed``, ``thread count changed``, ``shape guards differ`` and
    ``not cacheable: <PyTorch's reason>``."""
    saves_seconds: float = 0.0
    """For a hit: the lowering or compile time the entry saved."""


@dataclasses.dataclass
class GraphRecord:
    """One ATen graph (forward, backward or inference) handed to the backend."""

    graph_id: int
    kind: str
    num_nodes: int
    input_shapes: list[tuple[int, ...]]
    islands: list[IslandRecord] = dataclasses.field(default_factory=list)
    fallbacks: list[FallbackRecord] = dataclasses.field(default_factory=list)
    eager_kernels: list[FallbackRecord] = dataclasses.field(default_factory=list)
    """Nodes that lower but run on PyTorch's kernel because it measured faster
    (placement/kernel_choice.py); a choice, not a fallback."""
    lowering_retries: int = 0
    mesh: Optional[str] = None
    """The device mesh its islands are partitioned over (``data=2,model=2``); None: one device."""
    trace_index: Optional[int] = None
    """The :class:`TraceRecord` (Dynamo graph) this ATen graph came from."""
    executions: int = 0
    """Calls of the compiled graph."""
    inputs_written_in_place: int = 0
    """Graph inputs written in place instead of copied back whole after the call:
    a static KV cache with the rows the device computed (passes/input_writes_in_place.py),
    or, where the client keeps device copies, an input whose whole new value an
    island computed, written by the island's call (placement/results_into_inputs.py)."""
    caches_kept_on_device: int = 0
    """Inputs the graph returns grown by ``cat`` (a dynamic KV cache) whose new
    padded value stays on the device for the next call, where the client keeps
    device copies: only the new rows come down (passes/grown_caches.py)."""


@dataclasses.dataclass
class GraphBreakRecord:
    """One Dynamo graph break: why Dynamo ended a graph and where in user code."""

    reason: str
    """The first line of Dynamo's reason (``Failed to trace builtin operator``)."""
    source: Optional[str]
    """``file:line`` of the user code that broke the graph (innermost frame)."""
    detail: str = ""
    """Dynamo's whole explanation, hints included."""
    frame: Optional[str] = None
    """The function Dynamo was tracing: ``name (file:first line)``."""
    compile_id: Optional[str] = None
    """Dynamo's ``frame/recompile`` id of the trace that broke."""


@dataclasses.dataclass
class ReproRecord:
    """A reproducer bundle written for a failed lowering or XLA compile."""

    graph_id: int
    island: str
    stage: str
    """``torch-mlir: <pipeline stage>``, ``XLA``, or ``tpu_inductor (after the XLA
    compile)`` (the island compiled and building its runner failed: our bug)."""
    error: str
    """The first line of what the failing component said."""
    path: Optional[str]
    """The bundle's directory (None when there was nowhere to write it)."""


@dataclasses.dataclass
class Report:
    graphs: list[GraphRecord] = dataclasses.field(default_factory=list)
    cache_events: list[CacheEvent] = dataclasses.field(default_factory=list)
    traces: list[TraceRecord] = dataclasses.field(default_factory=list)
    dynamic_graphs: list[DynamicGraphRecord] = dataclasses.field(default_factory=list)
    recompiles: list[RecompileRecord] = dataclasses.field(default_factory=list)
    graph_breaks: list[GraphBreakRecord] = dataclasses.field(default_factory=list)
    stage_seconds: dict[str, float] = dataclasses.field(default_factory=dict)
    """Compile time per stage (self time: a nested stage's time is not counted
    in its parent); ``dynamo`` is filled in from Dynamo's own timers."""
    background_seconds: dict[str, float] = dataclasses.field(default_factory=dict)
    """Compile time per stage that ran beside the program, which no call waited
    for (``xla``: XLA:CPU's schedule choice, runtime/xla_schedule.py); not in
    ``stage_seconds`` nor in the compile total."""
    repros: list[ReproRecord] = dataclasses.field(default_factory=list)
    recompile_limit_hits: int = 0
    """Times Dynamo met ``torch._dynamo.config.recompile_limit`` since the
    record started: it traces that function no more, and runs each later call
    that none of its traces accepts in eager PyTorch without reaching the
    backend (Dynamo counts only the first such call; see
    :meth:`functions_at_recompile_limit`)."""
    recompile_limit: Optional[int] = None
    """``torch._dynamo.config.recompile_limit`` when the record was last read."""
    pid: int = dataclasses.field(default_factory=os.getpid)
    started: float = dataclasses.field(default_factory=time.time)
    """Unix time the record was started (process start or :func:`reset`)."""

    def to_dict(self) -> dict[str, Any]:
        """The JSON-ready form, with ``schema_version`` (see reporting/report_schema.json)."""
        from tpu_inductor.reporting.serialize import to_dict

        return to_dict(self)

    def to_json(self, indent: Optional[int] = 1) -> str:
        """Stable JSON: keys sorted, versioned by ``schema_version``."""
        from tpu_inductor.reporting.serialize import to_json

        return to_json(self, indent=indent)

    @classmethod
    def from_json(cls, text: str) -> "Report":
        from tpu_inductor.reporting.serialize import from_json

        return from_json(text)

    def __str__(self) -> str:
        from tpu_inductor.reporting.summary import summarize

        return summarize(self)

    def dynamo_recompiles(self) -> list[TraceRecord]:
        """Traces Dynamo made because a guard failed (the reason names it)."""
        return [t for t in self.traces if t.reason]

    def functions_at_recompile_limit(self) -> list[tuple[str, int]]:
        """(function, traces) for each function Dynamo traced as often as
        :attr:`recompile_limit` allows (traces counted by Dynamo's
        ``frame/recompile`` ids, so a graph break's pieces count once)."""
        if not self.recompile_limit:
            return []
        compiles: dict[tuple[str, str], set[str]] = {}
        for trace in self.traces:
            if trace.compile_id and trace.frame:
                frame_id = trace.compile_id.rsplit("/", 1)[0]  # "0/3": frame 0's third recompile
                compiles.setdefault((frame_id, trace.frame), set()).add(trace.compile_id)
        return [
            (frame, len(ids)) for (_, frame), ids in compiles.items() if len(ids) >= self.recompile_limit
        ]

    def fallbacks(self) -> list[FallbackRecord]:
        return [f for g in self.graphs for f in g.fallbacks]

    def islands(self) -> list[IslandRecord]:
        return [i for g in self.graphs for i in g.islands]

    def cache_hits(self) -> int:
        return sum(e.hit for e in self.cache_events)

    def cache_misses(self) -> dict[str, int]:
        """Miss counts by reason."""
        counts: dict[str, int] = {}
        for event in self.cache_events:
            if not event.hit:
                counts[str(event.reason)] = counts.get(str(event.reason), 0) + 1
        return counts


_lock = threading.Lock()
_current = Report()


def current() -> Report:
    """The record of this process since start or the last :func:`reset`."""
    return _current


def reset() -> Report:
    global _current
    with _lock:
        _current = Report()
        _mark_dynamo_baseline()
    return _current


def new_graph_record(kind: str, num_nodes: int, input_shapes: list[tuple[int, ...]]) -> GraphRecord:
    with _lock:
        record = GraphRecord(
            graph_id=len(_current.graphs), kind=kind, num_nodes=num_nodes, input_shapes=input_shapes
        )
        trace = getattr(_local, "trace", None)
        record.trace_index = trace.index if trace is not None else None
        _current.graphs.append(record)
    return record


# --- graph breaks, stage timings, reproducers ---

_local = threading.local()


def _append(field: str, record: Any) -> None:
    """Add ``record`` to the current report's list ``field``, under the report's lock."""
    with _lock:
        getattr(_current, field).append(record)


def record_graph_break(record: GraphBreakRecord) -> None:
    _append("graph_breaks", record)


def record_repro(record: ReproRecord) -> None:
    _append("repros", record)


@contextlib.contextmanager
def within_trace(trace: Optional["TraceRecord"]) -> Iterator[None]:
    """Graph records made inside belong to ``trace`` (backward graphs compile
    later, outside Dynamo, so the trace is passed along rather than looked up)."""
    previous = getattr(_local, "trace", None)
    _local.trace = trace
    try:
        yield
    finally:
        _local.trace = previous


def _add_seconds(name: str, seconds: float) -> None:
    with _lock:
        _current.stage_seconds[name] = _current.stage_seconds.get(name, 0.0) + seconds


def add_background_seconds(into: Report, name: str, seconds: float) -> None:
    """Count ``seconds`` of compile stage ``name`` that ran beside the program
    in ``into``: the record current when that work began, which a
    :func:`reset` since does not change."""
    with _lock:
        into.background_seconds[name] = into.background_seconds.get(name, 0.0) + seconds


@contextlib.contextmanager
def stage(name: str) -> Iterator[None]:
    """Time a compile stage. Stages nest and each counts only its own time
    (torch-mlir inside the backend's glue is torch-mlir's), so the stages add
    up to the whole compile time without double counting."""
    stack = getattr(_local, "stages", None)
    if stack is None:
        stack = _local.stages = []
    now = time.perf_counter()
    if stack:
        _add_seconds(stack[-1][0], now - stack[-1][1])
    entry = [name, now]
    stack.append(entry)
    try:
        yield
    finally:
        end = time.perf_counter()
        stack.pop()
        _add_seconds(name, end - entry[1])
        if stack:
            stack[-1][1] = end


# Dynamo keeps its own timers and counters; the report counts what they
# gained since it started. {timer name: entries already there, _LIMIT_HITS: hits}.
_DYNAMO_TOTAL = "_compile.compile_inner"
_DYNAMO_BACKEND = "OutputGraph.call_user_compiler"
_LIMIT_HITS = "recompile limit hits"
_dynamo_baseline: dict[str, int] = {}


def _dynamo_timers() -> dict[str, list[float]]:
    utils = sys.modules.get("torch._dynamo.utils")  # not imported: nothing compiled yet
    return getattr(utils, "compilation_time_metrics", {}) if utils is not None else {}


def _mark_dynamo_baseline() -> None:
    global _dynamo_baseline
    timers = _dynamo_timers()
    _dynamo_baseline = {name: len(timers.get(name, ())) for name in (_DYNAMO_TOTAL, _DYNAMO_BACKEND)}
    _dynamo_baseline[_LIMIT_HITS] = dynamo_recompile_limit_hits()


def dynamo_seconds() -> float:
    """Dynamo's own compile time since the record started: its frame compile
    time less the time it spent calling backends (which the other stages count)."""
    timers = _dynamo_timers()

    def since_baseline(name: str) -> float:
        values = timers.get(name, [])
        start = _dynamo_baseline.get(name, 0)
        return sum(values[start:] if len(values) >= start else values)  # shorter: Dynamo was reset

    return max(0.0, since_baseline(_DYNAMO_TOTAL) - since_baseline(_DYNAMO_BACKEND))


def dynamo_recompile_limit_hits() -> int:
    """Times Dynamo met its recompile limit in this process, by its own count
    (an ``unimplemented`` counter keyed by the message; 0 before Dynamo is
    imported). It counts a function's first call past the limit only."""
    utils = sys.modules.get("torch._dynamo.utils")
    counters = getattr(utils, "counters", {}).get("unimplemented", {}) if utils is not None else {}
    return sum(count for why, count in counters.items() if "recompile limit" in why)


def _recompile_limit() -> Optional[int]:
    config = sys.modules.get("torch._dynamo.config")
    return getattr(config, "recompile_limit", None) if config is not None else None


def sync_from_dynamo() -> None:
    """Copy what Dynamo itself counts into the current record: its compile
    time (``stage_seconds["dynamo"]``) and its recompile-limit hits. Dynamo
    books a frame's time when the frame is done, after our backend returned,
    and meets its limit without calling the backend at all, so readers call
    this when they look (serializing a live record does)."""
    seconds = dynamo_seconds()
    hits, before = dynamo_recompile_limit_hits(), _dynamo_baseline.get(_LIMIT_HITS, 0)
    hits = hits - before if hits >= before else hits  # fewer: Dynamo's counters were cleared
    with _lock:
        if seconds > 0 or "dynamo" in _current.stage_seconds:
            _current.stage_seconds["dynamo"] = seconds
        _current.recompile_limit_hits = hits
        _current.recompile_limit = _recompile_limit()


def record_cache_event(event: CacheEvent) -> None:
    with _lock:
        _current.cache_events.append(event)


# --- dynamic shapes: Dynamo traces, padding decisions, shape specialisations ---


@dataclasses.dataclass
class TraceRecord:
    """One graph Dynamo traced and handed to the backend."""

    index: int
    dynamic_dims: dict[str, str]
    """Symbol -> where it comes from (``L['x'].size()[0]``); empty for a static graph."""
    reason: Optional[str] = None
    """Dynamo's recompilation reason (the guard that failed), when it gives one."""
    compile_id: Optional[str] = None
    """Dynamo's ``frame/recompile`` id, e.g. ``0/1`` for frame 0's first recompile."""
    frame: Optional[str] = None
    """The function Dynamo traced: ``name (file:first line)``."""
    num_nodes: int = 0
    """Nodes in the Dynamo (Torch IR) graph."""


@dataclasses.dataclass
class DynamicGraphRecord:
    """A graph with symbolic shapes: lowered once, specialised per bucket."""

    graph_id: int
    kind: str
    padded: dict[str, str]
    """Symbol -> source, for dims padded up to buckets (proven padding-safe)."""
    exact: dict[str, str]
    """Symbol -> why it compiles at exact size (the op that mixes positions)."""
    lowerings: int = 0
    """torch-mlir lowerings of this graph's islands (symbolic, so once each)."""
    device_calls: int = 0
    """Calls that ran on the device (their bucket's executables)."""
    eager_calls: int = 0
    """Calls that ran in eager PyTorch (past the recompile budget, or a bucket XLA refused)."""


@dataclasses.dataclass
class RecompileRecord:
    """One new shape specialisation of a dynamic graph, and the shape that caused it."""

    graph_id: int
    kind: str
    cause: str
    """e.g. ``s0 (L['x'].size()[0]) = 37 -> bucket 64: no executable for s0=64 yet``."""
    sizes: dict[str, int]
    """The call's symbol values."""
    bucket: dict[str, int]
    """The symbol values compiled for (padded where safe)."""
    outcome: str
    """``compiled``, or ``eager: ...`` once the recompile budget is spent."""


def record_trace(dynamic_dims: dict[str, str], reason: Optional[str]) -> TraceRecord:
    with _lock:
        record = TraceRecord(len(_current.traces), dynamic_dims, reason)
        _current.traces.append(record)
    return record


def record_dynamic_graph(record: DynamicGraphRecord) -> None:
    _append("dynamic_graphs", record)


def record_recompile(record: RecompileRecord) -> None:
    _append("recompiles", record)


def compile_counts(report: Optional[Report] = None) -> dict[str, int]:
    """Dynamo traces, torch-mlir lowerings and XLA compiles in ``report``.

    A static graph's island is lowered once per build (unless its StableHLO
    came from the disk cache); a dynamic graph's islands are lowered once,
    and each bucket executable is refined from that module, not lowered.
    """
    report = report or _current
    dynamic_ids = {d.graph_id for d in report.dynamic_graphs}
    static_lowerings = sum(
        island.lower_source == "torch-mlir"
        for graph in report.graphs
        if graph.graph_id not in dynamic_ids
        for island in graph.islands
    )
    return {
        "dynamo_traces": len(report.traces),
        "torch_mlir_lowerings": static_lowerings + sum(d.lowerings for d in report.dynamic_graphs),
        "xla_compiles": sum(i.compile_source == "xla" for i in report.islands()),
    }
