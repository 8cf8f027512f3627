"""What to do about Dynamo's recompile limit, said when it is met and in the summary.

Why: past ``torch._dynamo.config.recompile_limit`` traces of a function,
Dynamo runs each of its calls that no trace accepts in eager PyTorch without
calling the backend, so nothing of ours runs then, and Dynamo's warning names
the guard that failed but not a way out. In ``generate()`` that is every
batch-2 decode step of an encoder-decoder's default cache (120 of them in
benchmarks/generate.py's 8 calls). The ways out are Dynamo's: trace every
size symbolically from the first call (``torch.compile(..., dynamic=True)``),
raise the limit, or, in the next process, name what changed size here in
``TORCH_COMPILE_DYNAMIC_SOURCES`` (Dynamo's automatic-dynamic profile, which
its own PGO would carry across processes if it matched a function's closure
across them; docs/reports.md). That setting took T5's and BART's 120 steps
in eager to 0.

:func:`advice` writes them once, for the summary (summary.py) and for the
warning a filter on Dynamo's logger adds when a function the backend
compiled meets the limit (:func:`watch_dynamo`).
"""

from __future__ import annotations

import logging
from typing import Optional

from tpu_inductor import report as record, torch_api

log = logging.getLogger(__name__)

_DYNAMO_LOGGER = "torch._dynamo.convert_frame"
"""Where Dynamo warns that it hit its recompile limit."""


def advice(functions: list[str]) -> list[str]:
    """The ways out for ``functions`` (labels as the report writes them),
    one line each; the setting only where Dynamo learned something dynamic."""
    learned: list[str] = []
    for function in functions:
        learned += [source for source in torch_api.dynamic_sources_learned(function) if source not in learned]
    lines = [
        "Fewer traces: torch.compile(..., dynamic=True) (no static trace first); "
        "or raise torch._dynamo.config.recompile_limit."
    ]
    if learned:
        lines += [
            "Or, in the next process, trace what changed size here dynamic from its first call "
            "(torch.compiler.config.dynamic_sources):",
            f"TORCH_COMPILE_DYNAMIC_SOURCES=\"{torch_api.dynamic_sources_setting(learned)}\"",
        ]
    return lines


class _LimitWarning(logging.Filter):
    """Passes every record; on Dynamo's recompile-limit warning for a function
    the backend compiled, first warns what that means here and what to do."""

    def filter(self, dynamo_record: logging.LogRecord) -> bool:
        try:
            function = torch_api.recompile_limit_function(dynamo_record)
            if function is not None and any(trace.frame == function for trace in record.current().traces):
                log.warning(
                    "tpu_inductor: Dynamo will not trace %s again (its recompile limit): each of its calls that "
                    "no trace accepts now runs in eager PyTorch, not on the device. %s",
                    function, "\n  ".join(advice([function])),
                )
        except Exception as exc:  # runs inside Dynamo's call: advice never fails it
            log.debug("tpu_inductor: no advice for Dynamo's recompile limit: %r", exc)
        return True


_watching: Optional[_LimitWarning] = None


def watch_dynamo() -> None:
    """Add the warning to Dynamo's logger; once per process."""
    global _watching
    if _watching is None:
        _watching = _LimitWarning()
        logging.getLogger(_DYNAMO_LOGGER).addFilter(_watching)
