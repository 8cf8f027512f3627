"""Lower an ATen FX graph to StableHLO bytecode with torch-mlir.

The graph is imported with ``torch_mlir.fx.stateless_fx_import`` and then run
through torch-mlir's two pipelines (FX IR -> Torch backend IR -> StableHLO,
lowering/pipelines.py, in a helper process so that an MLIR abort is a failed
lowering, not a dead program). We run the pipelines ourselves rather than
let torch-mlir do it so that the MLIR diagnostics are captured (torch-mlir
prints them to the C++ stderr and writes a repro to a fixed name in /tmp); a
failure then names the ATen ops that did not legalize, which the
partitioner uses to shrink the island.
"""

from __future__ import annotations

import dataclasses

import torch
import torch.fx

from tpu_inductor import report
from tpu_inductor.errors import LoweringError
from tpu_inductor.lowering.constant_sizes import constant_sizes_as_ints
from tpu_inductor.lowering.half_floats_in_float32 import compute_half_floats_in_float32
from tpu_inductor.lowering.pipelines import IslandLoweringError, to_stablehlo
from tpu_inductor.runtime.executable import TensorSpec

__all__ = ["IslandLoweringError", "LoweredModule", "failure_reason", "lower_to_stablehlo"]


@dataclasses.dataclass
class LoweredModule:
    """StableHLO for one island plus what the runtime needs to call it."""

    module: bytes
    """MLIR bytecode: smaller and faster to parse than text, and what PJRT's
    ``compile_and_load`` takes as well as text."""
    input_specs: list[TensorSpec]
    output_specs: list[TensorSpec]


def _tensor_spec(value: object) -> TensorSpec:
    if not isinstance(value, torch.Tensor):
        raise LoweringError(f"island value {value!r} is not a tensor")
    return TensorSpec(tuple(int(s) for s in value.shape), value.dtype)


def graph_specs(gm: torch.fx.GraphModule) -> tuple[list[TensorSpec], list[TensorSpec]]:
    """Input and output shapes/dtypes of an island, from the FX metadata."""
    inputs = [_tensor_spec(n.meta.get("val")) for n in gm.graph.find_nodes(op="placeholder")]
    outputs = gm.graph.output_node().args[0]
    if isinstance(outputs, torch.fx.Node):
        outputs = (outputs,)
    return inputs, [_tensor_spec(node.meta.get("val")) for node in outputs]


def lower_to_stablehlo(
    gm: torch.fx.GraphModule, name: str = "main", *, for_cpu: bool = False, isolate: bool = True
) -> LoweredModule:
    """StableHLO bytecode for ``gm``, whose placeholders and outputs are tensors;
    ``for_cpu`` adds the operand layouts XLA:CPU's matmuls want (cpu_dot_operands.py);
    ``isolate`` runs torch-mlir's pipelines in the helper process (pipelines.py)."""
    with report.stage("torch-mlir"):  # the first import of torch-mlir is its cost too
        from torch_mlir import fx as torch_mlir_fx

        compute_half_floats_in_float32(gm)  # eager's one rounding per op
        # A size specialised mid-trace must read as one static dim everywhere
        # (constant_sizes.py), or torch-mlir types it ``?`` on one op and ``31`` on the next.
        with constant_sizes_as_ints(gm):
            module = torch_mlir_fx.stateless_fx_import(gm, output_type="raw", model_name=name)
        lowered = to_stablehlo(module, isolate=isolate, for_cpu=for_cpu)
        input_specs, output_specs = graph_specs(gm)
    return LoweredModule(lowered["bytecode"], input_specs, output_specs)


def failure_reason(error: Exception) -> str:
    """One line naming the component that refused an island and what it said."""
    if isinstance(error, IslandLoweringError):
        detail = error.diagnostics[0] if error.diagnostics else error.stage
        return f"torch-mlir: {detail.splitlines()[0]}"
    lines = str(error).strip().splitlines()
    return f"XLA: {lines[0] if lines else type(error).__name__}"
