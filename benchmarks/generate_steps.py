"""Which of a generator's steps ran in eager PyTorch (benchmarks/generate.py).

A step is one call of the compiled ``forward``; a ``generate()`` call's first
is its prefill, the others its decode steps, which the issue's bar is about.
Eager work is counted from the backend's record (dynamic graphs' eager calls,
nodes placed in eager) and from calls that reached none of the backend's
graphs: Dynamo ran them in eager past its recompile limit.
"""

from __future__ import annotations

import functools
from typing import Any, Optional

from tpu_inductor import report


def compiled_graph_calls() -> int:
    """Calls that reached a graph the tpu backend compiled (a dynamic graph's
    eager calls included: those are counted by the graph)."""
    current = report.current()
    return sum(g.executions for g in current.graphs) + sum(d.device_calls + d.eager_calls for d in current.dynamic_graphs)


class EagerSteps:
    """Counts the eager work of each call of a generate.py ``Generator``'s compiled
    ``forward`` (backend "tpu"), split into prefill (a ``generate`` call's
    first ``forward``) and decode (the others): calls of dynamic graphs that
    ran in eager, nodes placed in eager, and calls that reached none of the
    backend's graphs because Dynamo ran them in eager past its recompile
    limit. Dynamo's own count (``report.dynamo_recompile_limit_hits``) has the first
    of those only: from then on it runs every call of that code that no
    cached trace accepts in eager without counting it
    (``FrameAction.RUN_ONLY``). Wraps ``generator.forward`` (and
    ``model.forward``); the generator calls :meth:`new_call` as it starts."""

    def __init__(self, generator: Any) -> None:
        self.prefill = self.decode = 0
        self._forward_calls = 0
        compiled = generator.forward

        # wraps: transformers reads forward's signature to decide what to pass
        # (logits_to_keep, cache_position); a bare (*args, **kwargs) changes the graphs.
        @functools.wraps(compiled)
        def forward(*args, **kwargs):
            graph_calls, eager_work = compiled_graph_calls(), _eager_work(report.current())
            result = compiled(*args, **kwargs)
            steps = _eager_work(report.current()) - eager_work + (compiled_graph_calls() == graph_calls)
            if self._forward_calls == 0:
                self.prefill += steps
            else:
                self.decode += steps
            self._forward_calls += 1
            return result

        generator.forward = generator.model.forward = forward
        generator.steps = self

    def new_call(self) -> None:
        self._forward_calls = 0


def _eager_work(record: report.Report) -> int:
    """Calls of dynamic graphs that ran in eager, and nodes placed in eager."""
    return sum(d.eager_calls for d in record.dynamic_graphs) + len(record.fallbacks())


def eager_steps(record: report.Report, steps: Optional[EagerSteps]) -> tuple[int, int]:
    """(prefill, decode) eager work so far. Without ``steps`` (transformers
    compiles ``compile_config``'s decode step itself, not ``forward``), the
    eager work and the times Dynamo hit its limit all count as decode."""
    if steps is not None:
        return steps.prefill, steps.decode
    return 0, _eager_work(record) + report.dynamo_recompile_limit_hits()
