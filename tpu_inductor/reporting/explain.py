"""``tpu_inductor.explain(fn, *args, **kwargs)``: compile, run once, report.

Why: ``torch._dynamo.explain`` shows Dynamo's graph breaks, but not what our
backend then did with each graph (islands, fallbacks, compile time, cache).
This runs ``fn`` under ``torch.compile(backend="tpu")`` with a fresh Dynamo
and a fresh record, and returns that record: print it for a summary,
``to_json()`` for tools. Like ``torch._dynamo.explain`` it resets Dynamo
first, so what was compiled before is compiled again and shows up; and it
forgets what this process holds between compiles (:mod:`tpu_inductor.process_state`),
so the report shows what a new process would do with the same cache directory.

The returned report stays the process's current record: calls made after
``explain`` (say, the same function with another shape) keep adding to it.
"""

from __future__ import annotations

import collections
from typing import Any, Callable

from tpu_inductor import report as record
from tpu_inductor.process_state import STATE


def explain(fn: Callable[..., Any], *args: Any, **kwargs: Any) -> record.Report:
    """Compile ``fn`` (a function or ``nn.Module``) with the tpu backend, call it
    once with ``args``/``kwargs``, and return the report of what happened.

    Backend options come from the ``TPU_INDUCTOR_*`` environment variables.
    """
    import torch

    from tpu_inductor.torch_api import dynamo_counters as counters

    torch.compiler.reset()
    STATE.reset()
    report = record.reset()
    before = collections.Counter(counters["graph_break"])
    torch.compile(fn, backend="tpu")(*args, **kwargs)
    _breaks_without_a_graph(report, collections.Counter(counters["graph_break"]) - before)
    record.sync_from_dynamo()
    return report


def _breaks_without_a_graph(report: record.Report, breaks: collections.Counter) -> None:
    """Graph breaks that ended no graph (nothing was traced before them) never
    reach the backend; Dynamo only counts them, so they come without a source line."""
    seen = collections.Counter(b.detail for b in report.graph_breaks)
    for reason, count in breaks.items():
        for _ in range(count - seen.get(reason, 0)):
            text = str(reason).strip()
            record.record_graph_break(
                record.GraphBreakRecord(
                    reason=text.splitlines()[0] if text else "graph break", source=None, detail=str(reason)
                )
            )
