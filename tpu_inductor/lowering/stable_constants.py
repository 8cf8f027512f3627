"""Tensor constants as ``stablehlo.constant``, not ``arith.constant``.

Why: torch-mlir imports a Python number in a graph (``x * 2``, ``addmm``'s
``beta``) as an ``arith.constant`` tensor. The CPU client compiles the MLIR
module as it is and does not mind, but a PJRT plugin (jax's CUDA plugin,
libtpu) is handed the module serialized as versioned StableHLO, which only
the stable dialects may be in: the first such module ended on the H200 with
"Failed to serialize StableHLO with mixed dialects ... found unstable op:
arith.constant", and every island with a Python number failed. The value
attribute is the same in both ops, so the rewrite is exact.

Before: ``%c = arith.constant dense<2> : tensor<1xi64>``
After:  ``%c = stablehlo.constant dense<2> : tensor<1xi64>``
"""

from __future__ import annotations

from typing import Any

from tpu_inductor.lowering.mlir_ops import ops_where


def stable_constants(module: Any) -> int:
    """Rewrite each ranked-tensor ``arith.constant`` as ``stablehlo.constant``; how many were rewritten."""
    from torch_mlir import ir

    def tensor_constant(op: Any) -> bool:
        return op.name == "arith.constant" and str(op.results[0].type).startswith("tensor<")

    constants = ops_where(module, ir, tensor_constant)
    with module.context, ir.Location.unknown():
        for constant in constants:
            with ir.InsertionPoint(constant):
                stable = ir.Operation.create("stablehlo.constant", results=[constant.results[0].type],
                                             attributes={"value": constant.attributes["value"]})
            constant.results[0].replace_all_uses_with(stable.results[0])
            constant.erase()
    return len(constants)
