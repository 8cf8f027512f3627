"""What a TPU cannot run, or runs badly, in a StableHLO module: checked before a TPU is seen.

Why: the backend is developed and tested on XLA:CPU, which accepts things
a TPU does not: float64 (a TPU has none), shapes left dynamic (XLA:TPU
compiles static shapes only), host callbacks (a round trip to Python), and
custom calls only XLA:CPU implements (LAPACK, DUCC FFTs), and ops of
dialects other than StableHLO's (``arith.constant``: the CPU client compiles
them, while any PJRT plugin -- CUDA's, libtpu -- is sent versioned StableHLO
and refuses them, as the H200 did). With
``tpu_readiness`` on (or on the ``tpu`` platform), every newly compiled
module is read for them; each finding goes in the island's report entry,
and one nobody can explain is a warning naming the op. The test suite runs
with it on and fails a test on an unexplained finding (tests/conftest.py).

Explained findings: float64 where the graph's own inputs or outputs are
float64 (the user asked for it; a TPU cannot give it).
"""

from __future__ import annotations

import dataclasses
import re
from typing import Optional

_OP = re.compile(r'^\s*(?:%[\w:#, %]+=\s*)?"?([a-z_]+\.[a-z_0-9.]+)"?')
_FLOAT64 = re.compile(r"tensor<(?:[\d?]+x)*(?:f64|complex<f64>)>")
_DYNAMIC = re.compile(r"tensor<(?:\d+x)*\?")
_CUSTOM_CALL = re.compile(r"custom_call\s*@([\w.$-]+)|call_target_name\s*=\s*\"([\w.$-]+)\"")
_SIGNATURE = re.compile(r"func\.func\s+(?:public\s+)?@main\((.*)")

HOST_CALLBACKS = frozenset({
    "xla_python_cpu_callback", "xla_ffi_python_cpu_callback",
    "xla_python_gpu_callback", "xla_ffi_python_gpu_callback",
})
PORTABLE_CUSTOM_CALLS = frozenset({
    "Sharding", "SPMDFullToShardShape", "SPMDShardToFullShape", "annotate_device_placement",
    "MoveToHost", "MoveToDevice",
})
"""Custom calls XLA's compiler itself handles on every platform (sharding
annotations, host offloading); any other target is implemented per platform."""
STABLE_DIALECTS = frozenset({"stablehlo", "chlo", "func", "sdy"})
"""The dialects a PJRT plugin takes: it is sent the module as versioned
StableHLO, and serializing an op of any other dialect (``arith``, ``tensor``,
``shape``) fails. The CPU client compiles the MLIR as it is and would not tell."""


@dataclasses.dataclass(frozen=True)
class TpuFinding:
    kind: str
    """``float64``, ``dynamic shape``, ``host callback``, ``custom call`` or ``unstable dialect``."""
    op: str
    """The StableHLO op, e.g. ``stablehlo.divide``."""
    detail: str
    explained: Optional[str] = None
    """Why it is expected (then not a violation), or None."""

    def __str__(self) -> str:
        why = f" ({self.explained})" if self.explained else ""
        return f"{self.kind}: {self.op} {self.detail}{why}"


def tpu_findings(text: str) -> list[TpuFinding]:
    """The findings in a StableHLO module's text, one per (kind, op, detail)."""
    found: dict[tuple[str, str, str], TpuFinding] = {}
    signature_has_float64 = False
    for line in text.splitlines():
        signature = _SIGNATURE.search(line)
        if signature:
            signature_has_float64 = bool(_FLOAT64.search(signature.group(1)))
            continue
        match = _OP.match(line)
        if match is None:
            continue
        op = match.group(1)
        for kind, detail in _line_findings(line, op):
            key = (kind, op, detail)
            if key not in found:
                explained = "the graph's own inputs or outputs are float64" if (
                    kind == "float64" and signature_has_float64) else None
                found[key] = TpuFinding(kind, op, detail, explained)
    return list(found.values())


def _line_findings(line: str, op: str) -> list[tuple[str, str]]:
    findings = []
    if op.split(".", 1)[0] not in STABLE_DIALECTS:
        findings.append(("unstable dialect", "a PJRT plugin cannot be sent it"))
    float64 = _FLOAT64.search(line)
    if float64:
        findings.append(("float64", float64.group(0)))
    dynamic = _DYNAMIC.search(line)
    if dynamic or op.startswith(("stablehlo.dynamic_", "stablehlo.real_dynamic")):
        findings.append(("dynamic shape", dynamic.group(0) + "...>" if dynamic else op))
    target = _CUSTOM_CALL.search(line)
    if target:
        name = target.group(1) or target.group(2)
        if name in HOST_CALLBACKS:
            findings.append(("host callback", name))
        elif name not in PORTABLE_CUSTOM_CALLS:
            findings.append(("custom call", name))
    return findings


def violations(findings: list[TpuFinding]) -> list[TpuFinding]:
    return [f for f in findings if f.explained is None]
