"""The calls compile stages make into the reporting views.

Why one module: the backend and ``compiled_graph`` each add a line or two
here instead of knowing about directories, HTML or the structured trace.
Every hook is cheap when no report directory or trace is active, and none
raises: a report must never fail a compile.
"""

from __future__ import annotations

import collections
import logging
from typing import Any, Optional, Union

from tpu_inductor import report as record
from tpu_inductor import torch_api

log = logging.getLogger(__name__)


def on_dynamo_graph(gm: Any, trace: Optional[record.TraceRecord], report_dir: Optional[str]) -> None:
    """A Dynamo graph reached the backend: note where it came from and why it ended."""
    from tpu_inductor.reporting import files, recompile_limit, trace as structured

    try:
        structured.register_logging()
        recompile_limit.watch_dynamo()
        files.attach(report_dir)
        frame, compile_id = torch_api.traced_frame_and_compile_id()
        if trace is not None:
            trace.frame, trace.compile_id = frame, compile_id
            trace.num_nodes = len(gm.graph.nodes)
        reason = getattr(gm, "compile_subgraph_reason", None)
        if reason is not None and getattr(reason, "graph_break", False):
            stack = list(getattr(reason, "user_stack", None) or [])
            source = f"{stack[-1].filename}:{stack[-1].lineno}" if stack else None
            detail = str(reason.reason)
            record.record_graph_break(
                record.GraphBreakRecord(
                    reason=detail.strip().splitlines()[0] if detail.strip() else "graph break",
                    source=source,
                    detail=detail,
                    frame=frame,
                    compile_id=compile_id,
                )
            )
            log.debug("tpu_inductor: Dynamo graph break at %s: %s", source, detail.splitlines()[0])
    except Exception as exc:  # pragma: no cover - private Dynamo structures
        log.debug("tpu_inductor: could not describe the Dynamo graph: %r", exc)


def on_graph_compiled() -> None:
    """An ATen graph was compiled: bring the report files and the trace up to date."""
    from tpu_inductor.reporting import files, trace as structured

    try:
        files.flush_all()
        structured.artifact("tpu_inductor_report", lambda: record.current().to_json(), "json")
    except Exception as exc:  # pragma: no cover - a report never fails a compile
        log.debug("tpu_inductor: could not write the report: %r", exc)


def on_island_compiled(
    graph: record.GraphRecord, island: record.IslandRecord, module: Union[bytes, str], *, check_tpu: bool = False
) -> None:
    """Keep the island's StableHLO where a person can read it; ``check_tpu``:
    read it for what a TPU could not run (lowering/tpu_readiness.py)."""
    from tpu_inductor.reporting import files, trace as structured

    try:
        directories = files.active()
        tracing = structured.tracing()
        if not directories and not tracing and not check_tpu:
            return
        text = files.stablehlo_text(module)
        if check_tpu:
            _check_tpu(island, text)
        for directory in directories:
            island.stablehlo_file = directory.write_stablehlo(graph.graph_id, island.name, text)
        structured.artifact(f"tpu_inductor_stablehlo_g{graph.graph_id}_{island.name}", lambda: text)
    except Exception as exc:
        log.debug("tpu_inductor: could not save the StableHLO of %s: %r", island.name, exc)


def _check_tpu(island: record.IslandRecord, text: str) -> None:
    import dataclasses

    from tpu_inductor.lowering.tpu_readiness import tpu_findings, violations

    found = tpu_findings(text)
    island.tpu_findings = [dataclasses.asdict(f) for f in found]
    for finding in violations(found):
        log.warning("tpu_inductor: a TPU could not run island %s as compiled: %s", island.name, finding)


def on_island_failed(
    island: Any, error: Exception, context: Any, graph: record.GraphRecord, after_compile: bool = False
) -> None:
    """torch-mlir or XLA rejected an island, or (``after_compile``) building it
    failed once XLA had compiled it: leave a reproducer bundle."""
    from tpu_inductor.reporting import repro

    try:
        repro.write_bundle(island, error, context, graph, after_compile)
    except Exception as exc:  # pragma: no cover - the fallback matters more
        log.debug("tpu_inductor: could not write a reproducer for %s: %r", island.name, exc, exc_info=True)


def op_counts(nodes: Any) -> dict[str, int]:
    """ATen op -> count over an island's compute nodes."""
    from tpu_inductor.errors import op_name

    counts = collections.Counter(op_name(n) for n in nodes if n.op == "call_function")
    return dict(counts)
