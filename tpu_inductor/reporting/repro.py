"""Reproducer bundles for a lowering or XLA compile that failed.

Why: when torch-mlir or XLA rejects an island the user's call still
succeeds (the island is retried without the failing op), but the failure is
a bug in one of those components or in our support table, and it should be
something a user can hand to someone else: the ATen graph as code, the MLIR
that failed, the diagnostics, and the command that replays it. When the
island lowers and compiles and building its runner failed after that
(placement/culprits.py: no op is to blame, the island runs in eager), the
bug is ours: the bundle says so (stage :data:`AFTER_COMPILE`), holds the
traceback, and its replay shows that the compile itself succeeds.

Where: under the report directory when one is set
(``<report_dir>/tpu_inductor-<stamp>-<pid>/repro/<n>-g<graph>-<island>/``);
else under the cache directory (``<cache_dir>/repro/<pid>-<stamp>-<n>/``),
because a failure is learned (remembered in the cache directory) and so
happens once per environment, and the cache directory is the one place we
already own (``tpu-inductor cache clear`` removes it); with neither (cache
off and no report directory) nothing is written and the failure is only
logged. Never ``/tmp``: names there clash between processes and users.
Each bundle is announced by one warning that names its directory.
"""

from __future__ import annotations

import logging
import os
import shlex
import sys
import time
import traceback
from pathlib import Path
from typing import Any, Optional

from tpu_inductor import report as record
from tpu_inductor.runtime.disk_cache import CacheDir

log = logging.getLogger(__name__)

_count = 0


def _torch_mlir_opt() -> str:
    """The ``torch-mlir-opt`` binary shipped inside the torch_mlir wheel."""
    try:
        from torch_mlir import _mlir_libs  # torch_mlir itself is a namespace package

        candidate = Path(_mlir_libs.__file__).parent / "torch-mlir-opt"
        if candidate.exists():
            return str(candidate)
    except ImportError:  # pragma: no cover - torch_mlir is a dependency
        pass
    return "torch-mlir-opt"


def bundle_dir(config: Any, graph_id: int, island: str) -> Optional[Path]:
    """Where the next bundle goes, or None when there is nowhere to write it."""
    global _count
    from tpu_inductor.reporting import files

    directories = files.active()
    if directories:
        return directories[0].new_repro_dir(f"g{graph_id}-{island}")
    if config.cache:
        _count += 1
        stamp = time.strftime("%Y%m%d-%H%M%S")
        return CacheDir.of(config).repro_dir / f"{os.getpid()}-{stamp}-{_count}"
    return None


_LOWERING_REPLAY = '''"""Replay the torch-mlir pipeline that failed: python replay.py"""
from pathlib import Path

import torch_mlir  # registers torch-mlir's passes
from torch_mlir import ir
from torch_mlir.dialects import torch as torch_d
from torch_mlir.passmanager import PassManager

PIPELINE = {pipeline!r}

with ir.Context() as context:
    torch_d.register_dialect(context)
    module = ir.Module.parse((Path(__file__).parent / "failed.mlir").read_text())
    PassManager.parse(PIPELINE).run(module.operation)  # raises with the diagnostics
    print(module)
'''

AFTER_COMPILE = "tpu_inductor (after the XLA compile)"
"""The stage of a failure in building an island's runner once XLA compiled it."""

_XLA_REPLAY = '''"""Replay the XLA compile that failed: python replay.py"""
from pathlib import Path

from tpu_inductor.runtime import compile_stablehlo, get_platform

module = (Path(__file__).parent / "failed.mlir").read_text()
compile_stablehlo(module, get_platform({platform!r}), None)  # raises XLA's error
print("compiled")
'''


def _lowering_pipeline(stage: str) -> Optional[str]:
    from tpu_inductor.lowering import pipelines

    return {
        "FX -> Torch backend IR": pipelines.TORCH_TO_BACKEND,
        "Torch backend IR -> StableHLO": pipelines.BACKEND_TO_STABLEHLO,
    }.get(stage)


def _graph_code(gm: Any) -> str:
    try:
        return gm.print_readable(print_output=False)
    except Exception:  # an odd graph must not stop the bundle
        return str(getattr(gm, "code", gm))


def write_bundle(
    island: Any, error: Exception, context: Any, graph: record.GraphRecord, after_compile: bool = False
) -> Optional[Path]:
    """Write the bundle for ``island``'s failure, record it and log one line.
    ``after_compile``: the island lowered and compiled, and building it failed after that.

    Never raises: the bundle is a courtesy, the fallback is what the user needs.
    """
    from tpu_inductor.lowering.pipelines import IslandLoweringError
    from tpu_inductor.reporting import trace

    lowering = isinstance(error, IslandLoweringError) and not after_compile
    stage = f"torch-mlir: {error.stage}" if lowering else AFTER_COMPILE if after_compile else "XLA"
    message = (error.diagnostics[0] if lowering and error.diagnostics else str(error)).strip()
    first_line = message.splitlines()[0] if message else type(error).__name__
    if lowering:
        diagnostics = "\n".join(error.diagnostics)
    elif after_compile:  # our code failed: where is what a fix needs
        diagnostics = "".join(traceback.format_exception(error))
    else:
        diagnostics = str(error)
    files: dict[str, str] = {
        "aten_graph.py": _graph_code(island.graph),
        "whole_graph.py": _graph_code(island.owner),
        "diagnostics.txt": diagnostics,
    }
    if lowering:
        pipeline = _lowering_pipeline(error.stage) or ""
        files["failed.mlir"] = error.ir
        files["replay.py"] = _LOWERING_REPLAY.format(pipeline=pipeline)
        files["replay.sh"] = (
            "#!/bin/sh\n# Replays the torch-mlir pipeline that failed; prints the same diagnostics.\n"
            f'cd "$(dirname "$0")" && {shlex.quote(_torch_mlir_opt())} '
            f"--pass-pipeline={shlex.quote(pipeline)} failed.mlir\n"
        )
    else:
        try:
            from tpu_inductor.lowering.stablehlo import lower_to_stablehlo
            from tpu_inductor.reporting.files import stablehlo_text

            files["failed.mlir"] = stablehlo_text(lower_to_stablehlo(island.graph).module)
        except Exception as exc:  # lowering worked a moment ago; say so if not now
            files["failed.mlir"] = f"// could not lower the island again: {exc}\n"
        files["replay.py"] = _XLA_REPLAY.format(platform=context.platform.name)
        replayed = "the XLA compile (it succeeds: the failure came after it)" if after_compile else (
            "the XLA compile that failed"
        )
        files["replay.sh"] = (
            f"#!/bin/sh\n# Replays {replayed}.\n"
            f'cd "$(dirname "$0")" && {shlex.quote(sys.executable)} replay.py\n'
        )
    files["README.txt"] = _readme(stage, first_line, island.name, graph, after_compile)
    trace.artifact("tpu_inductor_repro", lambda: "\n\n".join(f"# {k}\n{v}" for k, v in files.items()))

    path = None
    try:
        path = bundle_dir(context.config, graph.graph_id, island.name)
        if path is not None:
            path.mkdir(parents=True, exist_ok=True)
            for name, text in files.items():
                (path / name).write_text(text, encoding="utf-8")
            (path / "replay.sh").chmod(0o755)
    except OSError as exc:
        log.info("tpu_inductor: cannot write the reproducer for %s: %s", island.name, exc)
        path = None
    record.record_repro(record.ReproRecord(graph.graph_id, island.name, stage, first_line, str(path) if path else None))
    if path is not None:
        log.warning(
            "tpu_inductor: %s failed for %s of graph %d (%s); reproducer: %s",
            stage, island.name, graph.graph_id, "ran it in eager" if after_compile else "retried without the failing op",
            path,
        )
    else:
        log.info("tpu_inductor: %s failed for %s of graph %d: %s", stage, island.name, graph.graph_id, first_line)
    return path


def _readme(stage: str, first_line: str, island: str, graph: record.GraphRecord, after_compile: bool) -> str:
    if after_compile:
        what_happened = (
            "The island lowered and XLA compiled it; building its runner failed after that,\n"
            "in tpu_inductor's code. No op is to blame: the whole island ran in eager PyTorch\n"
            "in this graph. Please report this with this directory.\n\n"
        )
        mlir = "failed.mlir      the StableHLO that XLA compiled\n"
        replay = "replay.sh        compiles failed.mlir, showing that the compile succeeds\n"
        diagnostics = "diagnostics.txt  the traceback of the failure\n"
    else:
        what_happened = (
            "The call did not fail: tpu_inductor retried the island without the failing op(s),\n"
            "which ran in eager PyTorch.\n\n"
        )
        mlir = "failed.mlir      the MLIR handed to the stage that failed\n"
        replay = "replay.sh        replays the failure (replay.py does the same from Python)\n"
        diagnostics = "diagnostics.txt  what the stage said\n"
    return (
        f"{stage} failed for island {island} of ATen graph {graph.graph_id} ({graph.kind}).\n"
        f"{first_line}\n\n{what_happened}"
        "aten_graph.py    the island as an ATen FX graph (the part that was lowered)\n"
        "whole_graph.py   the ATen graph the island was cut from\n"
        f"{mlir}{diagnostics}{replay}"
    )
