"""ATen FX island -> StableHLO through torch-mlir, and the fix-ups after it.

Importing this package is cheap (no torch): torch-mlir's helper process
(pipelines.py) imports its MLIR-only modules without loading torch.
Which ops lower is placement's question (``tpu_inductor.placement``).
"""

from __future__ import annotations

__all__ = ["LoweredModule", "lower_to_stablehlo"]


def __getattr__(name: str):
    if name in ("LoweredModule", "lower_to_stablehlo"):
        from tpu_inductor.lowering import stablehlo

        return getattr(stablehlo, name)
    raise AttributeError(f"module 'tpu_inductor.lowering' has no attribute {name!r}")
