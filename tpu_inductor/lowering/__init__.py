"""ATen FX island -> StableHLO through torch-mlir; knows which ops lower.

Importing this package is cheap (no torch): torch-mlir's helper process
(pipelines.py) imports its MLIR-only modules without loading torch.
"""

from __future__ import annotations

__all__ = ["LoweredModule", "SupportTable", "lower_to_stablehlo"]


def __getattr__(name: str):
    if name in ("LoweredModule", "lower_to_stablehlo"):
        from tpu_inductor.lowering import stablehlo

        return getattr(stablehlo, name)
    if name == "SupportTable":
        from tpu_inductor.lowering.support import SupportTable

        return SupportTable
    raise AttributeError(f"module 'tpu_inductor.lowering' has no attribute {name!r}")
