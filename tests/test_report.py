"""Reports: graph breaks, fallbacks, recompiles, compile time; JSON, HTML, files, CLI.

The function under test has one of each thing a report exists to find, and
the expected source lines are computed from its ``co_firstlineno``, so
editing this file above it does not break the test.
"""

from __future__ import annotations

import html.parser
import json
import logging
import os
import shutil
import subprocess
import sys
from pathlib import Path

import jsonschema
import pytest
import torch

import tpu_inductor
import tpu_inductor.report as report
from tpu_inductor import torch_api
from tpu_inductor.placement import support
from tpu_inductor.process_state import STATE
from tpu_inductor.reporting import files, serialize

HERE = __file__


def program(x):
    y = x.sin() * 2
    print("a graph break")  # line +2
    if y.sum().item() > 0:  # line +3: a graph break on a tensor value
        y = y + 1
    z = torch.special.i0(y)  # line +5: no StableHLO lowering, runs eagerly
    return z.cos() + 1


FIRST = program.__code__.co_firstlineno
PRINT_LINE, ITEM_LINE, I0_LINE = FIRST + 2, FIRST + 3, FIRST + 5


@pytest.fixture(autouse=True)
def isolated(tmp_path, monkeypatch):
    """A cache of our own, no report directory from earlier tests, and XLA really compiles."""
    monkeypatch.setenv("TPU_INDUCTOR_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.delenv("TPU_INDUCTOR_REPORT_DIR", raising=False)
    monkeypatch.setattr(files, "_directories", {})
    STATE.executables.clear()


@pytest.fixture(scope="module")
def explained(tmp_path_factory):
    """One explain() run plus a call with a new shape, shared by the tests that read it."""
    root = tmp_path_factory.mktemp("explained")
    previous = dict(os.environ)
    os.environ["TPU_INDUCTOR_CACHE_DIR"] = str(root / "cache")
    os.environ["TPU_INDUCTOR_REPORT_DIR"] = str(root / "reports")
    saved_directories, files._directories = files._directories, {}
    try:
        torch._dynamo.reset()
        STATE.executables.clear()
        record = tpu_inductor.explain(program, torch.ones(4))
        compiled = torch.compile(program, backend="tpu")
        compiled(torch.ones(4))  # same shape: no new trace
        compiled(torch.ones(6))  # new shape: Dynamo recompiles
        (directory,) = files.active()
        directory.flush()
        yield record, directory
    finally:
        os.environ.clear()
        os.environ.update(previous)
        files._directories = saved_directories
        torch._dynamo.reset()


def at(line: int) -> str:
    return f"{HERE}:{line}"


def test_graph_breaks_have_reason_and_source_line(explained):
    record, _ = explained
    sources = {b.source: b for b in record.graph_breaks}
    assert at(PRINT_LINE) in sources and at(ITEM_LINE) in sources, sources
    assert "print" in sources[at(PRINT_LINE)].detail
    assert "item()" in sources[at(ITEM_LINE)].reason
    assert sources[at(PRINT_LINE)].frame.startswith(f"program ({at(FIRST)})")


def test_fallback_op_with_reason_and_source_line(explained):
    record, _ = explained
    i0 = [f for f in record.fallbacks() if f.op == "aten.i0.default"]
    assert i0 and {f.source for f in i0} == {at(I0_LINE)}
    assert "no StableHLO lowering" in i0[0].reason
    graph = next(g for g in record.graphs if any(f.op == "aten.i0.default" for f in g.fallbacks))
    lowered = {op for island in graph.islands for op in island.ops}
    assert "aten.cos.default" in lowered and "aten.i0.default" not in lowered


def test_recompile_names_guard_and_function(explained):
    record, _ = explained
    retraces = record.dynamo_recompiles()
    shape = [t for t in retraces if "size mismatch" in (t.reason or "") and t.frame.startswith("program")]
    assert shape, [t.reason for t in retraces]
    assert shape[0].frame == f"program ({at(FIRST)})"
    assert "expected 4, actual 6" in shape[0].reason
    assert shape[0].compile_id == "0/1"


def test_stage_times_executions_and_summary(explained):
    record, _ = explained
    seconds = serialize.to_dict(record)["stage_seconds"]
    for stage in ("dynamo", "aot_autograd", "passes", "torch-mlir", "xla"):
        assert seconds.get(stage, 0) > 0, (stage, seconds)
    ran = [g for g in record.graphs if g.executions]
    assert ran and all(i.executions == g.executions for g in ran for i in g.islands)
    assert max(g.executions for g in record.graphs) >= 2  # the first graph ran for both calls with 4
    text = str(record)
    for expected in (at(PRINT_LINE), at(ITEM_LINE), at(I0_LINE), "aten.i0.default", "size mismatch", "XLA"):
        assert expected in text, expected
    assert len(text.splitlines()) < 60


def test_json_round_trips_and_validates_against_its_schema(explained):
    record, _ = explained
    text = record.to_json()
    data = json.loads(text)
    assert data["schema_version"] == serialize.SCHEMA_VERSION
    jsonschema.Draft202012Validator.check_schema(serialize.load_schema())
    jsonschema.validate(data, serialize.load_schema())
    loaded = report.Report.from_json(text)
    assert loaded.to_json() == text
    assert loaded.graph_breaks == record.graph_breaks and loaded.graphs[0] == record.graphs[0]
    with pytest.raises(ValueError, match="schema_version"):
        report.Report.from_json(json.dumps({**data, "schema_version": 999}))


def test_report_directory_has_json_html_and_stablehlo(explained):
    _, directory = explained
    assert directory.path.name.startswith("tpu_inductor-") and directory.path.name.endswith(f"-{os.getpid()}")
    data = json.loads(directory.json_path.read_text())
    jsonschema.validate(data, serialize.load_schema())
    # Graphs with dynamic shapes specialise their module per bucket (tpu_inductor.dynamic).
    dynamic = {d["graph_id"] for d in data["dynamic_graphs"]}
    islands = [i for g in data["graphs"] if g["graph_id"] not in dynamic for i in g["islands"]]
    assert islands and all(i["stablehlo_file"] for i in islands)
    text = (directory.path / islands[0]["stablehlo_file"]).read_text()
    assert "func.func @main" in text and "stablehlo." in text
    page = directory.html_path.read_text()
    assert "<svg" in page and not any(s in page for s in ("<script", "<link", 'src="http', "@import"))


class _Dom(html.parser.HTMLParser):
    """Section ids with their heading, table row texts, and SVG bars."""

    def __init__(self) -> None:
        super().__init__()
        self.sections: dict[str, str] = {}
        self.rows: dict[str, list[str]] = {}
        self.bars = 0
        self._section = self._tag = None
        self._row: list[str] | None = None

    def handle_starttag(self, tag, attrs):
        attrs = dict(attrs)
        if tag == "section":
            self._section = attrs.get("id")
            self.sections[self._section] = ""
            self.rows[self._section] = []
        elif tag == "tr":
            self._row = []
        elif tag == "rect":
            self.bars += 1
        self._tag = tag

    def handle_endtag(self, tag):
        if tag == "tr" and self._row is not None and self._section:
            self.rows[self._section].append(" ".join(self._row))
            self._row = None

    def handle_data(self, data):
        if self._tag == "h2" and self._section:
            self.sections[self._section] += data
        if self._row is not None and data.strip():
            self._row.append(data.strip())


def test_html_page_renders_in_chromium(explained, tmp_path):
    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    if chromium is None:
        pytest.skip("chromium is not installed (.ci/run installs it with apt-get install chromium)")
    _, directory = explained
    dom = subprocess.run(
        [
            chromium, "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
            "--disable-background-networking", "--disable-component-update", "--disable-sync",
            f"--user-data-dir={tmp_path / 'chromium'}", "--dump-dom", directory.html_path.as_uri(),
        ],
        capture_output=True, text=True, timeout=60, check=True,
    ).stdout
    parsed = _Dom()
    parsed.feed(dom)
    expected = {"summary", "graph-breaks", "fallbacks", "recompiles", "compile-time", "graphs", "islands", "cache"}
    assert expected <= set(parsed.sections), parsed.sections
    assert "Graph breaks" in parsed.sections["graph-breaks"]
    assert any(at(PRINT_LINE) in row for row in parsed.rows["graph-breaks"])
    assert any("aten.i0.default" in row and at(I0_LINE) in row for row in parsed.rows["fallbacks"])
    assert any("size mismatch" in row for row in parsed.rows["recompiles"])
    assert parsed.bars >= 4  # one bar per compile stage


class _Collect(logging.Handler):
    def __init__(self) -> None:
        super().__init__(level=logging.DEBUG)
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)


def test_reproducer_bundle_for_a_failed_lowering(tmp_path, monkeypatch):
    # Pretend the support table thinks i0 lowers, so torch-mlir gets to fail on it.
    monkeypatch.setattr(support, "KNOWN_UNSUPPORTED", support.KNOWN_UNSUPPORTED - {"aten.i0"})
    monkeypatch.setattr(STATE, "support_tables", {})

    def fn(a):
        return torch.special.i0(a.sin() * 2).cos()

    a = torch.randn(8)
    options = {"cache": False, "report_dir": str(tmp_path / "reports")}
    logs = _Collect()  # not caplog: the test command may run with -p no:logging
    logging.getLogger("tpu_inductor").addHandler(logs)
    try:
        torch.testing.assert_close(torch.compile(fn, backend="tpu", options=options)(a), fn(a))
    finally:
        logging.getLogger("tpu_inductor").removeHandler(logs)
    (repro,) = report.current().repros
    bundle = Path(repro.path)
    assert bundle.is_relative_to(tmp_path / "reports") and repro.stage.startswith("torch-mlir")
    assert {p.name for p in bundle.iterdir()} >= {
        "aten_graph.py", "whole_graph.py", "failed.mlir", "diagnostics.txt", "replay.sh", "replay.py", "README.txt"
    }
    assert "torch.ops.aten.i0" in (bundle / "aten_graph.py").read_text()
    assert "torch.aten.i0" in (bundle / "failed.mlir").read_text()
    pointers = [r for r in logs.records if str(bundle) in r.getMessage()]
    assert len(pointers) == 1 and pointers[0].levelno == logging.WARNING
    replay = subprocess.run(["sh", str(bundle / "replay.sh")], capture_output=True, text=True, timeout=60)
    assert "torch.aten.i0" in replay.stderr and "failed to legalize" in replay.stderr


def test_reproducer_goes_under_the_cache_dir_without_a_report_dir(tmp_path, monkeypatch):
    monkeypatch.setattr(support, "KNOWN_UNSUPPORTED", support.KNOWN_UNSUPPORTED - {"aten.i0"})
    monkeypatch.setattr(STATE, "support_tables", {})
    torch.compile(lambda a: torch.special.i0(a.cos()) + 1, backend="tpu")(torch.randn(8))
    (repro,) = report.current().repros
    assert Path(repro.path).parent == tmp_path / "cache" / "repro"
    assert Path(repro.path).name.startswith(f"{os.getpid()}-")


def test_structured_trace_and_torch_logs(monkeypatch):
    from torch._logging._internal import log_registry, trace_log

    artifacts: list[str] = []

    class Collect(logging.Handler):
        def emit(self, record):
            metadata = getattr(record, "metadata", {})
            if "artifact" in metadata:
                artifacts.append(metadata["artifact"]["name"])

    handler = Collect(level=logging.DEBUG)
    trace_log.addHandler(handler)
    try:
        torch.compile(lambda a: a.sin() + 1, backend="tpu")(torch.randn(4))
    finally:
        trace_log.removeHandler(handler)
    assert "tpu_inductor_report" in artifacts
    assert any(name.startswith("tpu_inductor_stablehlo_g0_island_0") for name in artifacts)
    assert log_registry.is_log("tpu_inductor")


def test_cli_report_runs_a_script_and_doctor_describes_the_machine(tmp_path, capsys):
    from tpu_inductor import cli

    script = tmp_path / "script.py"
    script.write_text(
        "import sys, torch\n"
        "f = torch.compile(lambda a: torch.special.i0(a) + 1, backend='tpu')\n"
        "f(torch.randn(int(sys.argv[1])))\n"
    )
    assert cli.main(["report", "--report-dir", str(tmp_path / "out"), str(script), "5"]) == 0
    out = capsys.readouterr().out
    assert "aten.i0.default" in out and f"{script}:2" in out
    (html_path,) = (tmp_path / "out").glob("tpu_inductor-*/report.html")
    assert f"report: {html_path}" in out

    assert cli.main(["doctor", "--json"]) == 0
    info = json.loads(capsys.readouterr().out)
    assert info["platforms"]["cpu"]["available"] and info["platforms"]["cpu"]["devices"]
    assert info["platforms"]["cpu"]["plugin"].startswith("jaxlib ")
    for missing in (p for p in info["platforms"].values() if p.get("why") == "plugin not installed"):
        assert missing["install"].startswith("pip install")  # what to do about it
    # doctor prints the components every cache key holds: one list.
    from tpu_inductor import versions

    assert list(info["versions"]) == list(versions.COMPONENTS)
    assert set(versions.key_versions()) == set(versions.COMPONENTS) | {"tpu_inductor source"}
    assert info["cache"]["location"] == str(tmp_path / "cache")
    assert info["notes"] == []  # constraints.txt pins ml_dtypes below 0.7


def test_doctor_names_a_slow_ml_dtypes(monkeypatch):
    from tpu_inductor import cli

    monkeypatch.setattr(cli, "installed", lambda dist: "0.7.0" if dist == "ml_dtypes" else None)
    (note,) = cli._startup_notes()
    assert "ml_dtypes 0.7.0" in note and "pip install 'ml_dtypes<0.7'" in note
    monkeypatch.setattr(cli, "installed", lambda dist: "0.6.0")
    assert cli._startup_notes() == []


def test_cli_starts_without_importing_torch():
    code = "import sys, tpu_inductor.cli; print('torch' in sys.modules, 'jaxlib' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.split() == ["False", "False"]


def test_past_the_recompile_limit_the_summary_names_what_changed_size(caplog):
    """Past Dynamo's recompile limit the summary, and a warning at that moment,
    give the setting that, in the next process, traces dynamic from the first
    call what Dynamo learned here to be dynamic one recompile at a time, in
    Dynamo's own names; Dynamo accepts it and then needs one trace where it
    needed two."""

    def doubled(x):
        return x * 2

    def traces(sizes) -> int:
        torch._dynamo.reset()
        report.reset()
        compiled = torch.compile(doubled, backend="tpu")
        for size in sizes:
            compiled(torch.ones(size))
        return report.compile_counts()["dynamo_traces"]

    with torch._dynamo.config.patch(recompile_limit=2):
        assert traces((3, 4)) == 2  # static, then x's size dynamic
        with caplog.at_level(logging.WARNING, logger="tpu_inductor"):
            torch.compile(doubled, backend="tpu")(torch.ones(5, dtype=torch.float64))  # a third: eager
        summary = str(report.current())
    setting = "TORCH_COMPILE_DYNAMIC_SOURCES=\"L['x']\""
    assert "Dynamo hit its recompile limit (2) 1 time" in summary and setting in summary
    [warned] = [r.getMessage() for r in caplog.records if r.name.startswith("tpu_inductor")]
    assert f"Dynamo will not trace doubled ({HERE}:" in warned and "not on the device" in warned
    assert setting in warned
    with torch.compiler.config.patch(dynamic_sources="L['x']"):
        assert traces((3, 4, 5)) == 1
    torch._dynamo.reset()


def test_the_dynamic_sources_setting_names_each_source_as_dynamo_reads_it():
    """Dynamo deletes the setting's spaces, splits it at commas and tries each
    entry as a regex too: a source with a comma, a space and parentheses (T5's
    encoder outputs under ``generate()``) still names itself, and no entry
    names another source."""
    builder = pytest.importorskip("torch._dynamo.variables.builder")
    if not hasattr(builder, "is_dynamic_source"):
        pytest.skip("this torch reads the setting elsewhere")
    encoder_outputs = "dict.__getitem__(L['kwargs']['encoder_outputs'], list(dict.keys(L['kwargs']['encoder_outputs']))[0])"
    sources = ["L['x']", encoder_outputs, "L['cache'].layers[0].keys"]
    with torch.compiler.config.patch(dynamic_sources=torch_api.dynamic_sources_setting(sources)):
        assert all(builder.is_dynamic_source(source) for source in sources)
        assert not any(builder.is_dynamic_source(other) for other in ("L['y']", "L['cache'].layers[1].keys"))
