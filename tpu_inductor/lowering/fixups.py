"""The rewrites every StableHLO module gets after torch-mlir, in one list.

Why one list: static islands are fixed up right after torch-mlir's
pipelines (pipeline_worker.py, in the helper process), symbolic ones after
refinement to a bucket's shapes (refine.py); both must get the same ones.
Each works on the MLIR module in place and imports only torch-mlir's
bindings, so the helper process stays free of torch.
"""

from __future__ import annotations

from typing import Any


def apply_fixups(module: Any, *, for_cpu: bool) -> None:
    from tpu_inductor.lowering.compare_types import fix_unsigned_compares
    from tpu_inductor.lowering.float64_constants import fold_float64_constants
    from tpu_inductor.lowering.stable_constants import stable_constants
    from tpu_inductor.lowering.static_iota import static_iotas

    fix_unsigned_compares(module)  # unsigned compares and max/min identities (a wrong-value fix)
    fold_float64_constants(module)  # no float64 scalars (TPU readiness)
    static_iotas(module)  # no float64 arange lengths, no dynamic_iota (TPU readiness)
    stable_constants(module)  # only stable dialects: a PJRT plugin is sent versioned StableHLO
    if for_cpu:
        from tpu_inductor.lowering.cpu_dot_operands import arrange_dot_operands

        arrange_dot_operands(module)  # XLA:CPU's preferred matmul operand layouts
    else:
        from tpu_inductor.lowering.narrow_dot_operands import narrow_dot_operands

        narrow_dot_operands(module)  # half operands for matmul units, float32 results
