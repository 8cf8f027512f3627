"""The report as one self-contained HTML page.

Why: a page a person would rather look at than read logs. Everything is in
the one file (inline CSS, an inline SVG chart, no scripts, fonts or links to
other hosts), so it opens from a laptop, a CI artifact or an e-mail
attachment alike. Each section has a stable ``id`` (``summary``,
``graph-breaks``, ``fallbacks``, ``eager-kernels``, ``recompiles``, ``compile-time``,
``graphs``, ``islands``, ``cache``, ``repros``) for links and tests.
"""

from __future__ import annotations

import datetime
import html
from typing import Iterable, Optional, Sequence

from tpu_inductor import report as record
from tpu_inductor.reporting.summary import (
    STAGE_LABELS,
    fallback_rows,
    first_line,
    lowered_ops,
    ordered_stages,
    stage_seconds,
    trace_where,
)

_CSS = """
body{font:14px/1.45 system-ui,-apple-system,Segoe UI,sans-serif;margin:2em auto;max-width:72em;color:#1d2330;padding:0 1em}
h1{font-size:1.5em;margin-bottom:.2em} h2{font-size:1.15em;margin-top:2em;border-bottom:1px solid #d8dde6;padding-bottom:.2em}
.meta{color:#5b6475} .empty{color:#5b6475;font-style:italic}
table{border-collapse:collapse;width:100%;margin:.5em 0} th,td{text-align:left;padding:.3em .6em;border-bottom:1px solid #eceff4;vertical-align:top}
th{background:#f4f6fa;font-weight:600} td.num{text-align:right;font-variant-numeric:tabular-nums}
code{font:12px/1.3 ui-monospace,SFMono-Regular,Menlo,monospace;background:#f4f6fa;padding:.05em .3em;border-radius:3px;word-break:break-all}
.cards{display:flex;flex-wrap:wrap;gap:.6em} .card{border:1px solid #d8dde6;border-radius:6px;padding:.5em .9em;min-width:8em}
.card b{display:block;font-size:1.4em} .warn b{color:#b4441f} details{margin:.2em 0}
"""

_BAR_COLOURS = ("#3b6fd8", "#6a4fc9", "#2f9e8f", "#8c9bb0", "#d9822b", "#c2410c", "#5b6475")


def _e(value: object) -> str:
    return html.escape("" if value is None else str(value))


def _code(value: Optional[str]) -> str:
    return f"<code>{_e(value)}</code>" if value else '<span class="empty">unknown</span>'


def _table(headers: Sequence[str], rows: Iterable[Sequence[str]], numeric: Sequence[int] = ()) -> str:
    """``rows`` hold HTML already escaped by the caller."""
    rows = list(rows)
    head = "".join(f"<th>{_e(h)}</th>" for h in headers)
    if not rows:
        return f"<table><thead><tr>{head}</tr></thead></table><p class=\"empty\">none</p>"
    body = "".join(
        "<tr>" + "".join(
            f'<td class="num">{cell}</td>' if i in numeric else f"<td>{cell}</td>" for i, cell in enumerate(row)
        ) + "</tr>"
        for row in rows
    )
    return f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


def _section(anchor: str, title: str, content: str, intro: str = "") -> str:
    intro_html = f'<p class="meta">{intro}</p>' if intro else ""
    return f'<section id="{anchor}"><h2>{_e(title)}</h2>{intro_html}{content}</section>'


def _card(label: str, value: object, warn: bool = False) -> str:
    return f'<div class="card{" warn" if warn else ""}"><b>{_e(value)}</b>{_e(label)}</div>'


def _ops(ops: dict[str, int]) -> str:
    if not ops:
        return '<span class="empty">-</span>'
    return ", ".join(f"<code>{_e(op)}</code>&nbsp;x{n}" for op, n in sorted(ops.items(), key=lambda kv: -kv[1]))


def compile_time_chart(seconds: dict[str, float]) -> str:
    """A horizontal bar per stage, as inline SVG."""
    stages = [(name, value) for name, value in ordered_stages(seconds) if value > 0]
    if not stages:
        return '<p class="empty">nothing compiled</p>'
    total = sum(v for _, v in stages)
    width, label_width, bar_height, gap = 720, 170, 22, 8
    bar_space = width - label_width - 130
    height = len(stages) * (bar_height + gap) + gap
    parts = [
        f'<svg xmlns="http://www.w3.org/2000/svg" role="img" aria-label="compile time by stage" '
        f'width="{width}" height="{height}" viewBox="0 0 {width} {height}">'
    ]
    for row, (name, value) in enumerate(stages):
        y = gap + row * (bar_height + gap)
        bar = max(1.0, bar_space * value / total)
        colour = _BAR_COLOURS[row % len(_BAR_COLOURS)]
        parts.append(
            f'<text x="{label_width - 8}" y="{y + bar_height * 0.7:.1f}" text-anchor="end" '
            f'font-size="13">{_e(STAGE_LABELS.get(name, name))}</text>'
            f'<rect x="{label_width}" y="{y}" width="{bar:.1f}" height="{bar_height}" fill="{colour}" rx="3">'
            f"<title>{_e(name)}: {value:.3f} s</title></rect>"
            f'<text x="{label_width + bar + 6:.1f}" y="{y + bar_height * 0.7:.1f}" font-size="12">'
            f"{value:.3f} s ({100 * value / total:.0f}%)</text>"
        )
    parts.append("</svg>")
    return "".join(parts)


def _collectives(mesh: Optional[str], counts: Optional[dict[str, int]]) -> str:
    if mesh is None:
        return ""
    return f"{mesh}: " + (", ".join(f"{name} x{n}" for name, n in sorted((counts or {}).items())) or "none")


def _eager_nodes_table(rows) -> str:
    """Fallbacks or kernel choices: op, count, source line, reason, graph."""
    return _table(
        ["op", "count", "source", "reason", "graph"],
        (
            [_code(r.op), str(r.count), _code(r.source), _e(r.reason), f"#{r.graph_id} {_e(r.kind)}"]
            for r in rows
        ),
        numeric=(1,),
    )


def render(report: record.Report, title: str = "tpu_inductor report") -> str:
    seconds = stage_seconds(report)
    fallbacks = fallback_rows(report)
    started = datetime.datetime.fromtimestamp(report.started).isoformat(timespec="seconds")
    recompile_count = len(report.dynamo_recompiles()) + len(report.recompiles)
    misses = sum(report.cache_misses().values())

    cards = "".join(
        [
            _card("Dynamo graphs", len(report.traces)),
            _card("graph breaks", len(report.graph_breaks), warn=bool(report.graph_breaks)),
            _card("recompiles", recompile_count, warn=bool(recompile_count)),
            _card("recompile limit hits", report.recompile_limit_hits, warn=True) if report.recompile_limit_hits else "",
            _card("ATen graphs", len(report.graphs)),
            _card("device islands", len(report.islands())),
            _card("nodes in eager", len(report.fallbacks()), warn=bool(fallbacks)),
            _card("cache hits / misses", f"{report.cache_hits()} / {misses}"),
            _card("compile time", f"{sum(seconds.values()):.2f} s"),
            _card("compiled beside the program", f"{sum(report.background_seconds.values()):.2f} s")
            if report.background_seconds else "",
        ]
    )
    sections = [
        _section("summary", "Summary", f'<div class="cards">{cards}</div>'),
        _section(
            "graph-breaks",
            "Graph breaks",
            _table(
                ["source", "reason", "function", "compile id", "details"],
                (
                    [
                        _code(b.source),
                        _e(b.reason),
                        _e(b.frame),
                        _e(b.compile_id),
                        f"<details><summary>Dynamo says</summary><pre>{_e(b.detail)}</pre></details>"
                        if b.detail
                        else "",
                    ]
                    for b in report.graph_breaks
                ),
            ),
            "Where Dynamo stopped a graph: the code around a break runs in Python, between compiled graphs.",
        ),
        _section(
            "fallbacks",
            "Ops in eager PyTorch (fallbacks)",
            _eager_nodes_table(fallbacks),
            "Nodes that did not run on the device; each costs a device round trip.",
        ),
        _section(
            "eager-kernels",
            "PyTorch kernels by choice",
            _eager_nodes_table(fallback_rows(report, "eager_kernels")),
            "Nodes that lower but ran on PyTorch's own kernel because it measured faster "
            "(option eager_kernels).",
        ),
        _section(
            "recompiles",
            "Recompiles",
            _table(
                ["what", "where", "cause", "outcome"],
                [
                    [
                        "Dynamo retrace",
                        _e(f"{t.frame or ''} [{t.compile_id}]"),
                        f"<details><summary>{_e(first_line(t.reason))}</summary><pre>{_e(t.reason)}</pre></details>",
                        "traced",
                    ]
                    for t in report.dynamo_recompiles()
                ]
                + [
                    ["new shape bucket", f"graph #{r.graph_id} {_e(r.kind)}", _e(r.cause), _e(r.outcome)]
                    for r in report.recompiles
                ]
                + [
                    [
                        "Dynamo recompile limit",
                        _e(frame),
                        _e(f"{traces} traces (limit {report.recompile_limit})"),
                        "traced no more: a call no trace accepts runs in eager PyTorch",
                    ]
                    for frame, traces in report.functions_at_recompile_limit()
                ],
            ),
            "Dynamo retraces when a guard fails (the guard is the cause); a graph with dynamic "
            "shapes compiles one executable per shape bucket.",
        ),
        _section(
            "compile-time",
            "Where compile time went",
            compile_time_chart(seconds),
            "Self time per stage: a stage nested in another is not counted twice.",
        ),
        _section(
            "graphs",
            "Graphs",
            _table(
                ["#", "kind", "Dynamo graph", "nodes", "islands", "ops on the device", "eager", "retries", "runs"],
                (
                    [
                        str(g.graph_id),
                        _e(g.kind),
                        _e(trace_where(report, g.trace_index)),
                        str(g.num_nodes),
                        str(len(g.islands)),
                        _ops(lowered_ops(g)),
                        str(len(g.fallbacks)),
                        str(g.lowering_retries),
                        str(g.executions),
                    ]
                    for g in report.graphs
                ),
                numeric=(0, 3, 4, 6, 7, 8),
            ),
        ),
        _section(
            "islands",
            "Device islands",
            _table(
                [
                    "graph", "island", "nodes", "StableHLO from", "executable from", "lower s", "compile s", "runs",
                    "mesh: collectives", "StableHLO",
                ],
                (
                    [
                        str(g.graph_id),
                        _e(i.name),
                        str(i.num_nodes),
                        _e(i.lower_source),
                        _e(i.compile_source),
                        f"{i.lower_seconds:.3f}",
                        f"{i.compile_seconds:.3f}",
                        f"{i.executions} (results kept)" if i.results_kept else str(i.executions),
                        _e(_collectives(g.mesh, i.collectives)),
                        f'<a href="{_e(i.stablehlo_file)}">{_e(i.stablehlo_file)}</a>' if i.stablehlo_file else "",
                    ]
                    for g in report.graphs
                    for i in g.islands
                ),
                numeric=(0, 2, 5, 6, 7),
            ),
        ),
        _section(
            "cache",
            "Cache lookups",
            _table(
                ["level", "hit", "reason", "saves s", "key"],
                (
                    [_e(c.level), "hit" if c.hit else "miss", _e(c.reason or ""), f"{c.saves_seconds:.3f}", _code(c.key)]
                    for c in report.cache_events
                ),
                numeric=(3,),
            ),
        ),
        _section(
            "repros",
            "Reproducers",
            _table(
                ["graph", "island", "stage", "error", "bundle"],
                ([str(r.graph_id), _e(r.island), _e(r.stage), _e(r.error), _code(r.path)] for r in report.repros),
            ),
            "A lowering or XLA compile that failed (the island was retried without the failing op).",
        ),
    ]
    return (
        "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">"
        f"<title>{_e(title)}</title><style>{_CSS}</style></head><body>"
        f"<h1>{_e(title)}</h1><p class=\"meta\">process {report.pid}, started {_e(started)}</p>"
        + "".join(sections)
        + "</body></html>\n"
    )
