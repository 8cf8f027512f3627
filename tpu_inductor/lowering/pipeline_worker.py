"""torch-mlir's pass pipelines and our StableHLO fix-ups, in this process or
as the helper process of pipelines.py (``python -m tpu_inductor.lowering.pipeline_worker``),
which also compiles the CPU client's executables (runtime/isolated_compile.py).

The helper imports no torch: only torch-mlir's MLIR bindings and the
fix-up modules, which need nothing else (about 0.5 s), and jaxlib, loaded
while it waits for its first request. Messages on stdin and stdout are 8-byte
big-endian lengths and pickles:

* in: ``{"module": <MLIR bytecode>, "pipelines": [(pipeline, stage), ...],
  "fix_up": bool, "for_cpu": bool, "text": bool}``
* out: ``{"bytecode": <StableHLO bytecode>, "text": <its text, if asked>}``,
  or ``{"stage": ..., "diagnostics": [...], "ir": <the IR before that stage>}``;
* or in: ``{"kind": "compile", ...}``, out: ``{"executable": <serialized>}``
  or ``{"error": ...}`` (runtime/isolated_compile.py).

An abort inside MLIR (``LLVM ERROR: ...``) or XLA ends this process; the parent
sees its stdout close and reports the crash as a lowering failure.
``--background``: the helper for compiles that run beside the user's program
(pipelines.py), at a lower priority and without torch-mlir (~50 MB, 0.5 s).
"""

from __future__ import annotations

import io
import os
import pickle
import struct
import select
import sys
from typing import Any, BinaryIO, Optional

_LENGTH = struct.Struct(">Q")


def read_message(stream: BinaryIO) -> Optional[Any]:
    """The next message, or None when the other side closed the pipe."""
    header = stream.read(_LENGTH.size)
    if len(header) < _LENGTH.size:
        return None
    (size,) = _LENGTH.unpack(header)
    payload = stream.read(size)
    if len(payload) < size:
        return None
    return pickle.loads(payload)


def write_message(stream: BinaryIO, message: Any) -> None:
    payload = pickle.dumps(message, protocol=pickle.HIGHEST_PROTOCOL)
    stream.write(_LENGTH.pack(len(payload)) + payload)
    stream.flush()


def lower(module: Any, pipelines: list[tuple[str, str]], *, fix_up: bool, for_cpu: bool) -> Optional[dict]:
    """Run each pipeline on ``module`` in place, then (``fix_up``) fixups.py's
    rewrites; the failure message, or None."""
    from torch_mlir.passmanager import PassManager

    for pipeline, stage in pipelines:
        diagnostics: list[str] = []

        def collect(diagnostic: Any) -> bool:
            diagnostics.append(str(diagnostic.message))
            diagnostics.extend(str(note.message) for note in diagnostic.notes)
            return True  # handled: keep it off stderr

        ir_before = module.operation.get_asm(large_elements_limit=16)
        context = module.context
        handler = context.attach_diagnostic_handler(collect)
        try:
            with context:
                # Without this, some passes report errors but not failure (torch-mlir #3506).
                context.emit_error_diagnostics = True
                PassManager.parse(pipeline).run(module.operation)
        except Exception as exc:  # noqa: BLE001 - MLIR raises a plain Exception subclass
            return {"stage": stage, "diagnostics": diagnostics or [str(exc)], "ir": ir_before}
        finally:
            handler.detach()
    if fix_up:
        from tpu_inductor.lowering.fixups import apply_fixups

        apply_fixups(module, for_cpu=for_cpu)
    return None


def bytecode_of(module: Any) -> bytes:
    """An MLIR module (torch-mlir's or jaxlib's bindings) as bytecode."""
    bytecode = io.BytesIO()
    module.operation.write_bytecode(bytecode)
    return bytecode.getvalue()


def finished(module: Any, text: bool) -> dict:
    """The reply for a lowered ``module``: its bytecode, and its text if asked."""
    return {"bytecode": bytecode_of(module), "text": module.operation.get_asm() if text else None}


def serve(requests: BinaryIO, replies: BinaryIO, compiles_only: bool = False) -> None:
    from tpu_inductor.runtime import isolated_compile

    if not compiles_only:
        from torch_mlir import ir
        from torch_mlir.dialects import torch as torch_dialect

    # jaxlib next, if no lowering waits for us: the first compile follows the
    # first lowering at once. Not on a thread beside torch-mlir's import: both
    # set up absl's logging, and jaxlib's import fails when they overlap.
    if not select.select([requests], [], [], 0)[0]:
        isolated_compile.import_jaxlib()
    while (request := read_message(requests)) is not None:
        if request.get("kind") == "compile":
            write_message(replies, isolated_compile.serve_compile(request))
            continue
        context = ir.Context()
        torch_dialect.register_dialect(context)
        module = ir.Module.parse(request["module"], context)
        failure = lower(module, request["pipelines"], fix_up=request["fix_up"], for_cpu=request["for_cpu"])
        write_message(replies, failure if failure is not None else finished(module, request["text"]))


BACKGROUND_NICENESS = 10
"""The background helper's priority below its parent's: a compile beside the
user's program takes the cores their calls leave idle instead of slowing them."""


if __name__ == "__main__":
    background = sys.argv[1:] == ["--background"]
    if background:
        os.nice(BACKGROUND_NICENESS)
    serve(sys.stdin.buffer, sys.stdout.buffer, compiles_only=background)
