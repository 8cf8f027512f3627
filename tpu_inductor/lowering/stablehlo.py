"""Lower an ATen FX graph to StableHLO bytecode with torch-mlir.

The graph is imported with ``torch_mlir.fx.stateless_fx_import`` and then run
through torch-mlir's two pipelines (FX IR -> Torch backend IR -> StableHLO).
We run the pipelines ourselves rather than let torch-mlir do it so that the
MLIR diagnostics are captured (torch-mlir prints them to the C++ stderr and
writes a repro to a fixed name in /tmp); a failure then names the ATen ops
that did not legalize, which the partitioner uses to shrink the island.
"""

from __future__ import annotations

import dataclasses
import io
import re

import torch
import torch.fx

from tpu_inductor import report
from tpu_inductor.errors import LoweringError
from tpu_inductor.lowering.compare_types import fix_unsigned_compares
from tpu_inductor.lowering.cpu_dot_operands import arrange_dot_operands
from tpu_inductor.runtime.executable import TensorSpec

_TORCH_TO_BACKEND = (
    "builtin.module(func.func(torch-match-quantized-custom-ops),"
    " torchdynamo-export-to-torch-backend-pipeline{ extra-library=})"
)
_BACKEND_TO_STABLEHLO = (
    "builtin.module(torch-backend-to-stablehlo-backend-pipeline{allow-non-finites=True})"
)
# Both spellings torch-mlir uses for an op it could not convert:
#   "torch.operator"(...) <{name = "torch.aten._fft_r2c"}>  and  'torch.aten.i0'
_OP_IN_DIAGNOSTIC = re.compile(r"""name = "torch\.(aten\.[\w.]+)"|'torch\.(aten\.[\w.]+)'""")


@dataclasses.dataclass
class LoweredModule:
    """StableHLO for one island plus what the runtime needs to call it."""

    module: bytes
    """MLIR bytecode: smaller and faster to parse than text, and what PJRT's
    ``compile_and_load`` takes as well as text."""
    input_specs: list[TensorSpec]
    output_specs: list[TensorSpec]


class IslandLoweringError(LoweringError):
    """torch-mlir failed; ``failed_ops`` are the ATen op names it blamed."""

    def __init__(self, stage: str, diagnostics: list[str], ir: str) -> None:
        self.stage = stage
        self.diagnostics = diagnostics
        self.ir = ir
        self.failed_ops = sorted(
            {a or b for d in diagnostics for a, b in _OP_IN_DIAGNOSTIC.findall(d)}
        )
        summary = "\n".join(diagnostics[:5]) or "(no diagnostics)"
        super().__init__(f"torch-mlir failed at {stage}:\n{summary}")


def _run_pipeline(module, pipeline: str, stage: str) -> None:
    from torch_mlir.passmanager import PassManager

    diagnostics: list[str] = []

    def collect(diagnostic) -> bool:
        diagnostics.append(str(diagnostic.message))
        diagnostics.extend(str(note.message) for note in diagnostic.notes)
        return True  # handled: keep it off stderr

    ir_before = module.operation.get_asm(large_elements_limit=16)
    context = module.context
    handler = context.attach_diagnostic_handler(collect)
    try:
        with context:
            # Without this, some passes report errors but not failure (torch-mlir #3506).
            context.emit_error_diagnostics = True
            PassManager.parse(pipeline).run(module.operation)
    except Exception as exc:
        diagnostics = diagnostics or [str(exc)]
        raise IslandLoweringError(stage, diagnostics, ir_before) from None
    finally:
        handler.detach()


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


def lower_to_stablehlo(gm: torch.fx.GraphModule, name: str = "main", *, for_cpu: bool = False) -> LoweredModule:
    """StableHLO bytecode for ``gm``, whose placeholders and outputs are tensors;
    ``for_cpu`` adds the operand layouts XLA:CPU's matmuls want (cpu_dot_operands.py)."""
    with report.stage("torch-mlir"):  # the first import of torch-mlir is its cost too
        from torch_mlir import fx as torch_mlir_fx

        module = torch_mlir_fx.stateless_fx_import(gm, output_type="raw", model_name=name)
        _run_pipeline(module, _TORCH_TO_BACKEND, "FX -> Torch backend IR")
        _run_pipeline(module, _BACKEND_TO_STABLEHLO, "Torch backend IR -> StableHLO")
        fix_unsigned_compares(module)
        if for_cpu:
            arrange_dot_operands(module)
        input_specs, output_specs = graph_specs(gm)
        bytecode = io.BytesIO()
        module.operation.write_bytecode(bytecode)
    return LoweredModule(bytecode.getvalue(), input_specs, output_specs)


def failure_reason(error: Exception) -> str:
    """One line naming the component that refused an island and what it said."""
    if isinstance(error, IslandLoweringError):
        detail = error.diagnostics[0] if error.diagnostics else error.stage
        return f"torch-mlir: {detail.splitlines()[0]}"
    lines = str(error).strip().splitlines()
    return f"XLA: {lines[0] if lines else type(error).__name__}"
