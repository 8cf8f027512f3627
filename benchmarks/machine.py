"""The CPU a benchmark ran on, in the words its results record.

Why: XLA:CPU and its YNNPACK library pick their kernels by the instruction
sets the CPU offers, and so do oneDNN and Inductor's generated C++. The same
commit gave different numbers on two machines of this workplace: the timm
sweep's hieradet_small training gradients were 52x past the bound on one
(2026-12-06, CPU not recorded) and within it on an AMD EPYC with AVX2 and no
AVX-512 (2026-12-07). A result names its CPU so that such a difference can be
told from a regression.
"""

from __future__ import annotations

from pathlib import Path
from typing import Optional

_VECTOR_SETS = ("avx512f", "avx512_bf16", "avx512_vnni", "amx_tile", "avx2", "fma")
"""The instruction sets XLA's, oneDNN's and Inductor's CPU kernels choose by, widest first."""


def cpu_description(cpuinfo: Optional[str] = None) -> str:
    """``"AMD EPYC (avx2, fma; no AVX-512)"``: the model name and the vector
    instruction sets of ``cpuinfo`` (``/proc/cpuinfo``'s text by default), or
    ``"unknown"`` where it cannot be read (not Linux)."""
    if cpuinfo is None:
        try:
            cpuinfo = Path("/proc/cpuinfo").read_text()
        except OSError:
            return "unknown"
    fields: dict[str, str] = {}
    for line in cpuinfo.splitlines():
        key, _, value = line.partition(":")
        fields.setdefault(key.strip(), value.strip())  # the first processor's
    model = fields.get("model name") or "unknown"  # an Arm /proc/cpuinfo names no model
    flags = set(fields.get("flags", "").split())
    present = [name for name in _VECTOR_SETS if name in flags]
    if "avx512f" not in flags:
        return f"{model} ({', '.join(present) or 'no AVX'}; no AVX-512)"
    return f"{model} ({', '.join(present)})"
