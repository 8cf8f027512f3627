"""Every ``arange`` of static length as a plain ``iota``, without float64 on the way.

Why: torch-mlir lowers ``aten.arange`` to a ``dynamic_iota`` whose length it
computes at run time as ``ceil((end - start) / step)`` in float64, even when
every number is a constant and the result type is static. XLA:CPU folds it
all, but the module then carries float64 and a dynamic-shape op, neither of
which a TPU has (lowering/tpu_readiness.py finds them in every graph with a
position, a mask or an ``arange``). A ``dynamic_iota`` whose result type is
static is replaced by an ``iota`` of that type (the type is what torch-mlir
computed the length to be), and the length computation, now unused, is
removed.

Before: ``%n = ... stablehlo.ceil %q : tensor<f64> ...;
%i = stablehlo.dynamic_iota %n, dim = 0 : (tensor<1xi64>) -> tensor<5xi64>``
After:  ``%i = stablehlo.iota dim = 0 : tensor<5xi64>``
"""

from __future__ import annotations

from typing import Any

from tpu_inductor.lowering.mlir_ops import erase_unused, ops_where


def static_iotas(module: Any) -> int:
    """Replace each static-typed ``dynamic_iota`` by an ``iota``; how many were replaced."""
    from torch_mlir import ir

    def static_dynamic_iota(op: Any) -> bool:
        return op.name == "stablehlo.dynamic_iota" and ir.RankedTensorType(op.results[0].type).has_static_shape

    iotas = ops_where(module, ir, static_dynamic_iota)
    with module.context, ir.Location.unknown():
        for dynamic in iotas:
            with ir.InsertionPoint(dynamic):
                iota = ir.Operation.create(
                    "stablehlo.iota",
                    results=[dynamic.results[0].type],
                    attributes={"iota_dimension": dynamic.attributes["iota_dimension"]},
                )
            dynamic.results[0].replace_all_uses_with(iota.results[0])
            dynamic.erase()
        if iotas:
            erase_unused(module, ir)
    return len(iotas)
