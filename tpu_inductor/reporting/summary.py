"""``str(report)``: the few lines that answer "what happened to my model".

Why: the first look at a report is a terminal. Counts first, then the
things a user acts on (graph breaks, fallbacks, recompiles), each with its
source line, then where compile time went; long lists are cut, the JSON and
the HTML page have everything. The table helpers here are shared with the
HTML page so both views agree.
"""

from __future__ import annotations

import dataclasses
from typing import Optional

from tpu_inductor import report as record
from tpu_inductor.reporting import recompile_limit

# The stages in pipeline order; anything else a stage recorder adds follows.
STAGE_ORDER = ("dynamo", "aot_autograd", "passes", "backend", "torch-mlir", "xla")
STAGE_LABELS = {
    "dynamo": "Dynamo",
    "aot_autograd": "AOTAutograd",
    "passes": "passes",
    "backend": "partitioning & cache",
    "torch-mlir": "torch-mlir",
    "xla": "XLA",
}
_MAX_LINES = 8


@dataclasses.dataclass
class FallbackRow:
    """Eager nodes of one op in one graph, for one reason at one source line."""

    graph_id: int
    kind: str
    op: str
    reason: str
    source: Optional[str]
    count: int


def fallback_rows(report: record.Report, kind: str = "fallbacks") -> list[FallbackRow]:
    """Eager nodes grouped by graph, op, reason and line; ``kind`` is
    ``fallbacks`` or ``eager_kernels`` (PyTorch's kernel chosen for speed)."""
    rows: dict[tuple, FallbackRow] = {}
    for graph in report.graphs:
        for fallback in getattr(graph, kind):
            key = (graph.graph_id, fallback.op, fallback.reason, fallback.source)
            if key in rows:
                rows[key].count += 1
            else:
                rows[key] = FallbackRow(graph.graph_id, graph.kind, *key[1:], count=1)
    return list(rows.values())


def lowered_ops(graph: record.GraphRecord) -> dict[str, int]:
    """ATen op -> nodes of it that run on the device, over the graph's islands."""
    counts: dict[str, int] = {}
    for island in graph.islands:
        for op, count in island.ops.items():
            counts[op] = counts.get(op, 0) + count
    return counts


def ordered_stages(stage_seconds: dict[str, float]) -> list[tuple[str, float]]:
    known = [(s, stage_seconds[s]) for s in STAGE_ORDER if s in stage_seconds]
    rest = sorted((s, v) for s, v in stage_seconds.items() if s not in STAGE_ORDER)
    return known + rest


def stage_seconds(report: record.Report) -> dict[str, float]:
    from tpu_inductor.reporting.serialize import _stage_seconds

    return _stage_seconds(report)


def trace_where(report: record.Report, trace_index: Optional[int]) -> str:
    if trace_index is None or not 0 <= trace_index < len(report.traces):
        return ""
    trace = report.traces[trace_index]
    return trace.frame or f"trace {trace.index}"


def _cut(lines: list[str]) -> list[str]:
    if len(lines) <= _MAX_LINES:
        return lines
    return lines[:_MAX_LINES] + [f"  ... {len(lines) - _MAX_LINES} more (see the JSON or HTML report)"]


def _section(lines: list[str], title: str, rows: list[str]) -> None:
    """Append ``title`` and its ``rows`` (cut at :data:`_MAX_LINES`); nothing without rows."""
    if rows:
        lines.append(title)
        lines += _cut(rows)


def first_line(text: Optional[str]) -> str:
    """Dynamo's reasons come with a user stack after the first line."""
    lines = (text or "").strip().splitlines()
    return " ".join(lines[0].split()) if lines else ""  # guards are padded with spaces


def _kept(graph: record.GraphRecord) -> str:
    """Frozen islands (``freeze_parameters``): how often their results were computed."""
    kept = [i for i in graph.islands if i.results_kept]
    if not kept:
        return ""
    return f", parameter-only work kept ({'/'.join(str(i.executions) for i in kept)} computations)"


def _collectives(graph: record.GraphRecord) -> str:
    """``, mesh data=4 (all-reduce x1)``: the mesh and the collectives XLA
    inserted; under torchrun, ``, across ranks (all-gather x1, all-reduce x1)``:
    the collectives the graph's programs run between the processes."""
    counts: dict[str, int] = {}
    for island in graph.islands:
        for name, count in (island.collectives or {}).items():
            counts[name] = counts.get(name, 0) + count
    inserted = ", ".join(f"{name} x{count}" for name, count in sorted(counts.items()))
    if graph.mesh is not None:
        return f", mesh {graph.mesh} ({inserted or 'no collectives'})"
    return f", across ranks ({inserted})" if inserted else ""


def _recompile_limit_lines(report: record.Report) -> list[str]:
    """What Dynamo's recompile limit sent to eager: calls that never reached
    the backend, so nothing else in the report counts them."""
    if not report.recompile_limit_hits:
        return []
    functions = report.functions_at_recompile_limit()
    return [
        f"Dynamo hit its recompile limit ({report.recompile_limit}) {_plural(report.recompile_limit_hits, 'time')}: "
        "it traces such a function no more, and each of its calls that no trace accepts runs in eager "
        "PyTorch, not on the device, and is not counted here (Dynamo's warning names the guard that "
        "failed; TORCH_LOGS=recompiles lists every one):"
    ] + [f"  {frame}: {traces} traces" for frame, traces in functions] + [
        f"  {line}" for line in recompile_limit.advice([frame for frame, _ in functions])
    ]


def _plural(count: int, word: str) -> str:
    return f"{count} {word}{'' if count == 1 else 's'}"


def _stage_times(seconds: dict[str, float]) -> str:
    """``Dynamo 0.11 s, AOTAutograd 0.29 s, ...`` in pipeline order."""
    return ", ".join(f"{STAGE_LABELS.get(stage, stage)} {value:.2f} s" for stage, value in ordered_stages(seconds))


def summarize(report: record.Report) -> str:
    seconds = stage_seconds(report)
    fallbacks = report.fallbacks()
    misses = report.cache_misses()
    recompiles = len(report.dynamo_recompiles()) + len(report.recompiles)
    lines = [
        f"tpu_inductor report: {_plural(len(report.traces), 'Dynamo graph')}, "
        f"{_plural(len(report.graph_breaks), 'graph break')}, {_plural(recompiles, 'recompile')}; "
        f"{_plural(len(report.graphs), 'ATen graph')}, {_plural(len(report.islands()), 'device island')}, "
        f"{_plural(len(fallbacks), 'node')} in eager; cache {report.cache_hits()} hit(s), "
        f"{sum(misses.values())} miss(es); compile {sum(seconds.values()):.2f} s"
    ]
    _section(lines, "Graph breaks:", [f"  {b.source or '?'}: {b.reason}" for b in report.graph_breaks])
    lines += _recompile_limit_lines(report)
    _section(
        lines,
        "Ran in eager PyTorch (op x count, source, reason):",
        [f"  {r.op} x{r.count} at {r.source or '?'} (graph {r.graph_id}): {r.reason}" for r in fallback_rows(report)],
    )
    _section(
        lines,
        "Recompiles:",
        [
            f"  {t.frame or 'trace ' + str(t.index)} [{t.compile_id}]: {first_line(t.reason)}"
            for t in report.dynamo_recompiles()
        ]
        + [f"  graph {r.graph_id} ({r.kind}): {r.cause} -> {r.outcome}" for r in report.recompiles],
    )
    if misses:
        lines.append("Cache misses: " + ", ".join(f"{reason} x{n}" for reason, n in misses.items()))
    if seconds:
        lines.append("Compile time: " + _stage_times(seconds))
    if report.background_seconds:
        lines.append(
            "Compiled beside the program, no call waiting (XLA:CPU's schedule choice): "
            + _stage_times(report.background_seconds)
        )
    _section(
        lines,
        "Graphs:",
        [
            f"  #{g.graph_id} {g.kind}: {g.num_nodes} nodes, {_plural(len(g.islands), 'island')}, "
            f"{len(g.fallbacks)} eager"
            + (f" + {len(g.eager_kernels)} on PyTorch kernels by choice" if g.eager_kernels else "")
            + _kept(g)
            + (f", {_plural(g.inputs_written_in_place, 'input')} written in place" if g.inputs_written_in_place else "")
            + (f", {_plural(g.caches_kept_on_device, 'grown cache')} kept on the device" if g.caches_kept_on_device else "")
            + _collectives(g)
            + f", run {g.executions}x"
            for g in report.graphs
        ],
    )
    _section(
        lines,
        "Dynamic graphs (calls on the device / in eager, padded dims):",
        [
            f"  #{d.graph_id} {d.kind}: {d.device_calls} / {d.eager_calls}, "
            f"padded {', '.join(d.padded.values()) or 'none'}"
            + (f"; exact {', '.join(d.exact)}" if d.exact else "")
            for d in report.dynamic_graphs
        ],
    )
    checked = [i for i in report.islands() if i.tpu_findings is not None]
    if checked:
        unexplained = [(i.name, f) for i in checked for f in i.tpu_findings if f["explained"] is None]
        verdict = f"{_plural(len(unexplained), 'finding')} a TPU could not run" if unexplained else "nothing found"
        lines.append(f"TPU readiness ({_plural(len(checked), 'island')} checked): {verdict}")
        lines += _cut([f"  {name}: {f['kind']} in {f['op']} ({f['detail']})" for name, f in unexplained])
    _section(
        lines,
        "Reproducers:",
        [
            f"  {r.stage} failed for graph {r.graph_id} {r.island}: {r.error}"
            + (f" (reproducer: {r.path})" if r.path else "")
            for r in report.repros
        ],
    )
    return "\n".join(lines)
