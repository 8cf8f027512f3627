"""The structured record of what the backend did.

Every stage appends to one process-wide :class:`Report`: each compiled graph
with its islands and the nodes that ran eagerly (op, reason, user source
line), and each executable compile with where it came from (XLA, memory or
the disk cache). Readers (tests, ``explain``, the CLI) read this record;
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

    def fallbacks(self) -> list[FallbackRecord]:
        return [f for g in self.graphs for f in g.fallbacks]

    def islands(self) -> list[IslandRecord]:
        return [i for g in self.graphs for i in g.islands]


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
