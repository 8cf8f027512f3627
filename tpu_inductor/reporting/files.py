"""The report directory: ``report_dir`` / ``TPU_INDUCTOR_REPORT_DIR``.

Why: a report that appears only when the program asks for it misses the run
that crashed or was killed, and logs are not something people read. With a
report directory set, every process writes its report as it goes: after
each compiled graph and at exit, so the files are current even when the
process dies later.

Each process gets its own subdirectory, ``tpu_inductor-<YYYYmmdd-HHMMSS>-<pid>``,
so processes (ranks, workers, reruns) sharing a directory never clash::

    report.json        the record (schema: reporting/report_schema.json)
    report.html        the page to open
    stablehlo/         g<graph>-<island>.mlir: the StableHLO of each island
    repro/<n>-.../     reproducer bundles of failed lowerings and compiles

Files are replaced atomically (write a temporary, rename), so a reader never
sees half a report. A directory that cannot be written gives one warning;
compiling goes on.
"""

from __future__ import annotations

import atexit
import logging
import os
import threading
import time
from pathlib import Path
from typing import Optional, Union

from tpu_inductor import report as record

log = logging.getLogger(__name__)

JSON_NAME = "report.json"
HTML_NAME = "report.html"


class ReportDirectory:
    """One process's subdirectory of a report directory."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.pid = os.getpid()
        stamp = time.strftime("%Y%m%d-%H%M%S")
        self.path = root / f"tpu_inductor-{stamp}-{self.pid}"
        self._repros = 0
        self._warned = False
        self._lock = threading.Lock()

    @property
    def json_path(self) -> Path:
        return self.path / JSON_NAME

    @property
    def html_path(self) -> Path:
        return self.path / HTML_NAME

    def _write(self, relative: str, data: Union[str, bytes]) -> Optional[Path]:
        target = self.path / relative
        try:
            target.parent.mkdir(parents=True, exist_ok=True)
            temporary = target.with_name(f".{target.name}.tmp")
            if isinstance(data, str):
                temporary.write_text(data, encoding="utf-8")
            else:
                temporary.write_bytes(data)
            os.replace(temporary, target)
            return target
        except OSError as exc:
            if not self._warned:
                self._warned = True
                log.warning("tpu_inductor: cannot write the report to %s: %s", self.path, exc)
            return None

    def write_stablehlo(self, graph_id: int, island: str, text: str) -> Optional[str]:
        """Save an island's StableHLO; returns its path relative to this directory."""
        relative = f"stablehlo/g{graph_id}-{island}.mlir"
        return relative if self._write(relative, text) else None

    def new_repro_dir(self, label: str) -> Path:
        with self._lock:
            self._repros += 1
            return self.path / "repro" / f"{self._repros}-{label}"

    def flush(self, report: Optional[record.Report] = None) -> None:
        """Write the JSON and HTML of ``report`` (default: this process's record)."""
        from tpu_inductor.reporting.html import render

        report = report or record.current()
        with self._lock:
            self._write(JSON_NAME, report.to_json())
            self._write(HTML_NAME, render(report, title=f"tpu_inductor report: process {self.pid}"))


_directories: dict[tuple[str, int], ReportDirectory] = {}
_lock = threading.Lock()
_exit_hook = False


def directory_for(root: Union[str, Path]) -> ReportDirectory:
    """This process's subdirectory of ``root``, made on first use."""
    global _exit_hook
    key = (str(Path(root).resolve()), os.getpid())  # a forked child gets its own
    with _lock:
        directory = _directories.get(key)
        if directory is None:
            directory = _directories[key] = ReportDirectory(Path(key[0]))
            log.info("tpu_inductor: writing the report to %s", directory.path)
        if not _exit_hook:
            _exit_hook = True
            atexit.register(flush_all)
    return directory


def attach(report_dir: Optional[str]) -> Optional[ReportDirectory]:
    """Start writing this process's report under ``report_dir`` (None: do nothing)."""
    return directory_for(report_dir) if report_dir else None


def active() -> list[ReportDirectory]:
    """This process's report directories."""
    pid = os.getpid()
    return [d for (_, owner), d in list(_directories.items()) if owner == pid]


def flush_all() -> None:
    for directory in active():
        directory.flush()


def stablehlo_text(module: Union[bytes, str]) -> str:
    """StableHLO bytecode as text (what a person reads and ``stablehlo-opt`` takes)."""
    if isinstance(module, str):
        return module
    from torch_mlir import ir

    with ir.Context() as context:
        try:
            from torch_mlir._mlir_libs import _stablehlo

            _stablehlo.register_dialect(context)
        except ImportError:  # an older torch-mlir: print the generic form
            context.allow_unregistered_dialects = True
        return str(ir.Module.parse(module))
