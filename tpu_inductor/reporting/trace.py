"""Our stages next to Dynamo's in PyTorch's own tools.

Why: users already turn on ``TORCH_LOGS`` and ``TORCH_TRACE`` (read by
tlparse) to see Dynamo and AOTAutograd; our logs and artifacts should show
up in the same places, not in a tool of our own.

- ``TORCH_LOGS="+tpu_inductor"`` (debug) or ``"tpu_inductor"`` (info): the
  ``tpu_inductor`` logger is registered as a torch log, so it gets torch's
  handler, format and levels. (A name in TORCH_LOGS that is not registered
  when torch starts is treated as a module name and works too; registering
  makes ``torch._logging.set_logs`` and the help text know it.)
- ``TORCH_TRACE=<dir>``: the report (``tpu_inductor_report``, JSON), each
  island's StableHLO (``tpu_inductor_stablehlo_g<graph>_<island>``) and each
  reproducer (``tpu_inductor_repro``) go into the structured trace as
  artifacts. Payloads are built only when a trace is being written.
"""

from __future__ import annotations

from typing import Callable

_registered = False


def register_logging() -> None:
    """Make ``tpu_inductor`` a TORCH_LOGS name; a dict insert, once."""
    global _registered
    if _registered:
        return
    _registered = True
    from tpu_inductor import torch_api

    torch_api.register_log("tpu_inductor")


def tracing() -> bool:
    """Whether a structured trace is being written (TORCH_TRACE)."""
    from tpu_inductor import torch_api

    return torch_api.structured_trace_enabled()


def artifact(name: str, payload: Callable[[], str], encoding: str = "string") -> None:
    """One structured-trace artifact; ``payload`` runs only when tracing."""
    if not tracing():
        return
    from tpu_inductor import torch_api

    torch_api.trace_structured(
        "artifact",
        metadata_fn=lambda: {"name": name, "encoding": encoding},
        payload_fn=payload,
        expect_trace_id=False,  # backward graphs compile outside a Dynamo trace
    )
