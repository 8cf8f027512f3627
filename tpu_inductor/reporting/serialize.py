"""The report as stable, versioned JSON, and back.

Why: other tools (dashboards, CI checks, tlparse readers) parse the report,
so its form is a contract: keys are sorted, every record keeps its field
names, and ``schema_version`` changes when a field is renamed or removed
(adding a field does not change it). ``report_schema.json`` next to this
file documents every field and is checked by the tests.

``summary`` is derived (counts and totals for readers that want one number)
and is ignored when a report is loaded back; everything else round-trips.
"""

from __future__ import annotations

import dataclasses
import json
import typing
from pathlib import Path
from typing import Any, Optional, Union

from tpu_inductor import report as record

SCHEMA_VERSION = 1
SCHEMA_PATH = Path(__file__).with_name("report_schema.json")

# Top-level keys that are derived or descriptive, not fields of Report.
_DERIVED = ("schema_version", "tool", "version", "summary")


def summary_counts(report: record.Report, stage_seconds: dict[str, float]) -> dict[str, Any]:
    """The headline numbers of ``report``."""
    islands = report.islands()
    return {
        "dynamo_graphs": len(report.traces),
        "graph_breaks": len(report.graph_breaks),
        "dynamo_recompiles": len(report.dynamo_recompiles()),
        "shape_recompiles": len(report.recompiles),
        "aten_graphs": len(report.graphs),
        "islands": len(islands),
        "lowered_nodes": sum(sum(i.ops.values()) if i.ops else i.num_nodes for i in islands),
        "fallback_nodes": len(report.fallbacks()),
        "cache_hits": report.cache_hits(),
        "cache_misses": sum(report.cache_misses().values()),
        "xla_compiles": sum(i.compile_source == "xla" for i in islands),
        "repros": len(report.repros),
        "compile_seconds": sum(stage_seconds.values()),
        "graph_executions": sum(g.executions for g in report.graphs),
        "recompile_limit_hits": report.recompile_limit_hits,
    }


def _stage_seconds(report: record.Report) -> dict[str, float]:
    """``report``'s compile time per stage; a live record takes Dynamo's
    timers and recompile-limit count now (so call this before reading it)."""
    if report is record.current():
        record.sync_from_dynamo()
    return dict(report.stage_seconds)


def to_dict(report: record.Report) -> dict[str, Any]:
    from tpu_inductor import __version__

    stage_seconds = _stage_seconds(report)
    data = dataclasses.asdict(report)
    data["stage_seconds"] = stage_seconds
    data["schema_version"] = SCHEMA_VERSION
    data["tool"] = "tpu_inductor"
    data["version"] = __version__
    data["summary"] = summary_counts(report, data["stage_seconds"])
    # JSON has no tuples; lists now mean the loaded report serializes identically.
    return json.loads(json.dumps(data))


def to_json(report: record.Report, indent: Optional[int] = 1) -> str:
    return json.dumps(to_dict(report), indent=indent, sort_keys=True)


def from_dict(data: dict[str, Any]) -> record.Report:
    version = data.get("schema_version")
    if version != SCHEMA_VERSION:
        raise ValueError(f"report schema_version {version!r}; this tpu_inductor reads {SCHEMA_VERSION}")
    fields = {k: v for k, v in data.items() if k not in _DERIVED}
    return _load(record.Report, fields)


def from_json(text: str) -> record.Report:
    return from_dict(json.loads(text))


def _load(cls: type, data: dict[str, Any]) -> Any:
    """A dataclass from its ``asdict`` form, typed by its annotations."""
    hints = typing.get_type_hints(cls, vars(record))
    known = {f.name for f in dataclasses.fields(cls)}
    return cls(**{name: _convert(hints[name], value) for name, value in data.items() if name in known})


def _convert(hint: Any, value: Any) -> Any:
    if value is None:
        return None
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin is Union:
        inner = [a for a in args if a is not type(None)]
        return _convert(inner[0], value) if len(inner) == 1 else value
    if dataclasses.is_dataclass(hint):
        return _load(hint, value)
    if origin is list:
        return [_convert(args[0], v) for v in value]
    if origin is dict:
        return {k: _convert(args[1], v) for k, v in value.items()}
    if origin is tuple:
        return tuple(value)
    return value


def load_schema() -> dict[str, Any]:
    """The JSON Schema (draft 2020-12) that :func:`to_dict` output satisfies."""
    return json.loads(SCHEMA_PATH.read_text())
