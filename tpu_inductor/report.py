"""The structured record of what the backend did.

Every stage appends to one process-wide :class:`Report`: each compiled graph
with its islands and the nodes that ran eagerly (op, reason, user source
line), each executable compile with where it came from (XLA, memory or
the disk cache), and each disk-cache lookup with, for a miss, its reason.
Readers (tests, ``explain``, the CLI) read this record;
nothing else prints.
"""

from __future__ import annotations

import dataclasses
import threading
from typing import Optional


@dataclasses.dataclass
class FallbackRecord:
    """One ATen node that ran in eager PyTorch instead of on the device."""

    op: str
    reason: str
    source: Optional[str]


@dataclasses.dataclass
class IslandRecord:
    name: str
    num_nodes: int
    compile_source: str  # "xla", "memory" or "disk"
    lower_seconds: float
    compile_seconds: float
    cache_key: str
    lower_source: str = "torch-mlir"
    """``torch-mlir`` (lowered now) or ``disk`` (StableHLO from the graph cache)."""


@dataclasses.dataclass
class CacheEvent:
    """One lookup in the on-disk artifact cache."""

    level: str
    """``graph`` (ATen graph -> StableHLO, skips torch-mlir) or ``executable``
    (StableHLO -> PJRT executable, skips XLA)."""
    key: str
    """The entry's directory name under ``<cache_dir>/graphs|executables/``."""
    hit: bool
    reason: Optional[str] = None
    """For a miss: ``no entry``, ``version changed``, ``options changed``,
    ``platform changed`` or ``corrupted`` (the entry was evicted)."""
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
    lowering_retries: int = 0


@dataclasses.dataclass
class Report:
    graphs: list[GraphRecord] = dataclasses.field(default_factory=list)
    cache_events: list[CacheEvent] = dataclasses.field(default_factory=list)
    traces: list[TraceRecord] = dataclasses.field(default_factory=list)
    dynamic_graphs: list[DynamicGraphRecord] = dataclasses.field(default_factory=list)
    recompiles: list[RecompileRecord] = dataclasses.field(default_factory=list)

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
    return _current


def new_graph_record(kind: str, num_nodes: int, input_shapes: list[tuple[int, ...]]) -> GraphRecord:
    with _lock:
        record = GraphRecord(
            graph_id=len(_current.graphs), kind=kind, num_nodes=num_nodes, input_shapes=input_shapes
        )
        _current.graphs.append(record)
    return record


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
    with _lock:
        _current.dynamic_graphs.append(record)


def record_recompile(record: RecompileRecord) -> None:
    with _lock:
        _current.recompiles.append(record)


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
