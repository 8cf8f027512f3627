"""Lower an island that holds functional collectives: one program per rank.

Why: under ``torchrun`` a tensor-parallel layer is compute, a collective,
more compute (a rowwise Linear's matmul, the ``all_reduce`` of its partial
sums, the bias). Run as separate executables, the collective's program
stands between two PJRT calls and XLA sees neither side of it. Here the
whole island becomes one program, written as each rank's own computation
(XLA's replica form: every rank runs the same program on its own data), with
the collectives as StableHLO's ``all_reduce``, ``all_gather``,
``reduce_scatter`` and ``all_to_all`` over the ranks of their process group.
runtime/collectives.py compiles it with one replica per rank of that group.

torch-mlir does not know ``_c10d_functional``, so the island is cut at its
collectives: the compute between them is lowered by torch-mlir as usual
(lowering/stablehlo.py, through the graph level of the disk cache), one
private function per segment, and ``main``
calls the segments and the collectives in graph order. XLA inlines the
calls, so it fuses and schedules across them as in any other island.
``wait_tensor`` is the identity here: the collective's value is ready where
the program reads it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Optional, Sequence

import torch
import torch.fx
from torch.fx.passes.utils.fuser_utils import fuse_as_graphmodule

from tpu_inductor.errors import LoweringError
from tpu_inductor.lowering.pipeline_worker import bytecode_of
from tpu_inductor.lowering.stablehlo import LoweredModule, graph_specs

if TYPE_CHECKING:
    from tpu_inductor.runtime.disk_cache import CacheDir

c10d = torch.ops._c10d_functional
COLLECTIVES = {
    c10d.all_reduce.default: "all_reduce",
    c10d.all_gather_into_tensor.default: "all_gather_into_tensor",
    c10d.reduce_scatter_tensor.default: "reduce_scatter_tensor",
    c10d.all_to_all_single.default: "all_to_all_single",
}
"""The functional collectives that run in XLA; others stay with the process group."""
WAIT = c10d.wait_tensor.default
REDUCTIONS = {"sum": "add", "avg": "add", "max": "maximum", "min": "minimum", "product": "multiply"}
"""A functional collective's reduce op -> the StableHLO op that combines two values."""
ELEMENT_TYPES = {
    torch.float32: "f32", torch.float16: "f16", torch.bfloat16: "bf16", torch.float64: "f64",
    torch.int32: "i32", torch.int64: "i64", torch.int16: "i16", torch.int8: "i8",
    torch.uint8: "ui8", torch.bool: "i1",
}
"""torch dtype -> the element type torch-mlir gives it in StableHLO."""


def tensor_type(value: torch.Tensor) -> str:
    """``tensor<4x8xf32>``: the MLIR type of a static-shaped tensor."""
    if value.dtype not in ELEMENT_TYPES:
        raise LoweringError(f"a collective island passes a {value.dtype} value, which it has no MLIR type for")
    return tensor_type_of(value.shape, value.dtype)


def tensor_type_of(shape: Sequence[int], dtype: torch.dtype) -> str:
    """``tensor<4x8xf32>`` for ``shape`` and ``dtype`` (one of :data:`ELEMENT_TYPES`)."""
    return f"tensor<{''.join(f'{int(size)}x' for size in shape)}{ELEMENT_TYPES[dtype]}>"


def lower_with_collectives(
    gm: torch.fx.GraphModule,
    group_size: int,
    *,
    for_cpu: bool,
    isolate: bool,
    disk_cache: Optional[CacheDir] = None,
) -> tuple[LoweredModule, str]:
    """One rank's program for ``gm``, whose collectives all run over one
    process group of ``group_size`` ranks (replica ``i`` is group rank ``i``),
    and where it came from: ``torch-mlir``, or ``disk`` when every segment
    came from the graph level of ``disk_cache`` (a restarted job's ranks
    skip torch-mlir)."""
    from jaxlib.mlir import ir

    from tpu_inductor.lowering.cache import lower_cached
    from tpu_inductor.runtime.jaxlib_api import mlir_context

    segments, depth = _segments(gm)
    with mlir_context():
        functions, signatures, sources = [], [], set()
        for index, nodes in enumerate(segments):
            if not nodes:
                signatures.append(None)
                continue
            sub_gm, inputs, outputs = fuse_as_graphmodule(gm, nodes, f"segment_{index}", always_return_tuple=True)
            lowered, stats = lower_cached(sub_gm, disk_cache, for_cpu=for_cpu, isolate=isolate)
            sources.add(stats.source)
            text, arguments, results = _as_private_function(ir.Module.parse(lowered.module), f"segment_{index}")
            functions.append(text)
            signatures.append((inputs, outputs, arguments, results))
        main = _main(gm, depth, signatures, group_size)
        module = ir.Module.parse("module @island {\n" + "\n".join(functions) + "\n" + main + "\n}")
        if not module.operation.verify():
            raise LoweringError("the stitched collective island does not verify")
        bytecode = bytecode_of(module)
    input_specs, output_specs = graph_specs(gm)
    return LoweredModule(bytecode, input_specs, output_specs), "disk" if sources == {"disk"} else "torch-mlir"


def _segments(gm: torch.fx.GraphModule) -> tuple[list[list[torch.fx.Node]], dict[torch.fx.Node, int]]:
    """The compute nodes by how many collectives lie on their longest path from
    the inputs (their depth, returned too: a compute node's segment): segment
    ``k`` runs after the collectives that ``k`` of them follow, so the segments
    and collectives form a chain without cycles."""
    depth: dict[torch.fx.Node, int] = {}
    segments: list[list[torch.fx.Node]] = [[]]
    for node in gm.graph.nodes:
        if node.op != "call_function":
            depth[node] = 0
            continue
        here = max((depth[m] + (m.target in COLLECTIVES) for m in node.all_input_nodes), default=0)
        depth[node] = here
        if node.target in COLLECTIVES or node.target is WAIT:
            continue
        while len(segments) <= here:
            segments.append([])
        segments[here].append(node)
    return segments, depth


def _as_private_function(module: Any, name: str) -> tuple[str, list[str], list[str]]:
    """torch-mlir's ``main`` renamed to ``name`` and made private (its other
    functions renamed after it), as text, with its argument and result types."""
    from jaxlib.mlir import ir

    body = module.body
    for op in body.operations:
        old = ir.StringAttr(op.attributes["sym_name"]).value
        new = name if old == "main" else f"{name}_{old}"
        ir.SymbolTable.replace_all_symbol_uses(old, new, module.operation)
        op.attributes["sym_name"] = ir.StringAttr.get(new)
        op.attributes["sym_visibility"] = ir.StringAttr.get("private")
    (main,) = [op for op in body.operations if ir.StringAttr(op.attributes["sym_name"]).value == name]
    function_type = ir.FunctionType(ir.TypeAttr(main.attributes["function_type"]).value)
    text = "\n".join(str(op) for op in body.operations)
    return text, [str(t) for t in function_type.inputs], [str(t) for t in function_type.results]


def _main(
    gm: torch.fx.GraphModule,
    segment_of: dict[torch.fx.Node, int],
    signatures: Sequence[Any],
    group_size: int,
) -> str:
    """``main``: the island's placeholders in, each segment called and each
    collective applied in dependency order, the island's outputs returned."""
    values: dict[torch.fx.Node, tuple[str, str]] = {}  # node -> (SSA name, type)
    placeholders = list(gm.graph.find_nodes(op="placeholder"))
    for index, node in enumerate(placeholders):
        values[node] = (f"%arg{index}", tensor_type(node.meta["val"]))
    lines: list[str] = []
    emitted = [False] * len(signatures)

    def emit_segment(index: int) -> None:
        if emitted[index] or signatures[index] is None:
            return
        emitted[index] = True
        inputs, outputs, arguments, results = signatures[index]
        for node in inputs:
            ensure(node)
        operands = ", ".join(values[node][0] for node in inputs)
        lines.append(
            f"%s{index}:{len(results)} = func.call @segment_{index}({operands}) : "
            f"({', '.join(arguments)}) -> ({', '.join(results)})"
        )
        for position, (node, result_type) in enumerate(zip(outputs, results)):
            values[node] = (f"%s{index}#{position}", result_type)

    def ensure(node: torch.fx.Node) -> None:
        if node in values:
            return
        if node.target in COLLECTIVES:
            ensure(node.args[0])
            lines.append(_collective(node, values, group_size, len(lines)))
        elif node.target is WAIT:
            ensure(node.args[0])
            values[node] = values[node.args[0]]
        else:
            emit_segment(segment_of[node])
        if node not in values:
            raise LoweringError(f"{node.format_node()}: no value in the collective island's program")

    outputs = gm.graph.output_node().args[0]
    outputs = list(outputs) if isinstance(outputs, (list, tuple)) else [outputs]
    for node in outputs:
        ensure(node)
    arguments = ", ".join(f"{name}: {type_}" for name, type_ in (values[p] for p in placeholders))
    returned = [values[node] for node in outputs]
    return (
        f"func.func public @main({arguments}) -> ({', '.join(t for _, t in returned)}) {{\n  "
        + "\n  ".join(lines)
        + f"\n  return {', '.join(name for name, _ in returned)} : {', '.join(t for _, t in returned)}\n}}"
    )


def _collective(node: torch.fx.Node, values: dict, group_size: int, number: int) -> str:
    """One collective as its StableHLO op over replicas ``0..group_size-1``."""
    operand, operand_type = values[node.args[0]]
    value = node.meta["val"]
    result_type = tensor_type(value)
    name = f"%c{number}"
    groups = f"replica_groups = dense<[[{', '.join(map(str, range(group_size)))}]]> : tensor<1x{group_size}xi64>"
    if node.target is c10d.all_gather_into_tensor.default:
        line = (f'{name} = "stablehlo.all_gather"({operand}) {{all_gather_dim = 0 : i64, {groups}}} '
                f": ({operand_type}) -> {result_type}")
    elif node.target is c10d.all_to_all_single.default:
        line = (f'{name} = "stablehlo.all_to_all"({operand}) {{split_dimension = 0 : i64, '
                f"concat_dimension = 0 : i64, split_count = {group_size} : i64, {groups}}} "
                f": ({operand_type}) -> {result_type}")
    else:
        reduce_op = node.args[1]
        op = "stablehlo.all_reduce" if node.target is c10d.all_reduce.default else "stablehlo.reduce_scatter"
        scatter = "scatter_dimension = 0 : i64, " if op == "stablehlo.reduce_scatter" else ""
        scalar = f"tensor<{ELEMENT_TYPES[value.dtype]}>"
        line = (f'{name} = "{op}"({operand}) ({{\n    ^bb0(%lhs: {scalar}, %rhs: {scalar}):\n'
                f"      %r = stablehlo.{REDUCTIONS[reduce_op]} %lhs, %rhs : {scalar}\n"
                f"      stablehlo.return %r : {scalar}\n  }}) {{{scatter}{groups}}} "
                f": ({operand_type}) -> {result_type}")
        if reduce_op == "avg":
            line += (f"\n  {name}_n = stablehlo.constant dense<{float(group_size)}> : {result_type}"
                     f"\n  {name}_mean = stablehlo.divide {name}, {name}_n : {result_type}")
            name = f"{name}_mean"
    values[node] = (name, result_type)
    return line
