"""Sharding annotations on a StableHLO module, for XLA's SPMD partitioner.

Why: with a device mesh (``Config.mesh``) each island compiles once for all
its devices. XLA learns how each argument and result is laid out over the
devices from Shardy's annotations (an ``sdy.mesh`` and an ``sdy.sharding``
per argument and result of the entry function) and partitions the program,
inserting the collectives. torch-mlir writes none, so they are added here,
after the fix-ups. A result given no spec (None) is left open: XLA's
propagation picks its sharding (``allow_spmd_sharding_propagation_to_output``,
``executable.spmd_compile_options``), so a result computed split stays
split instead of being all-gathered. Shardy rather than GSPMD's ``mhlo.sharding`` strings:
XLA deprecates GSPMD's propagation (and warns on every compile).
"""

from __future__ import annotations

from typing import Optional, Sequence

from tpu_inductor.lowering.pipeline_worker import bytecode_of


def annotate_shardings(
    module: bytes,
    mesh_axes: Sequence[tuple[str, int]],
    argument_specs: Sequence[Sequence[Optional[str]]],
    result_specs: Sequence[Optional[Sequence[Optional[str]]]],
) -> bytes:
    """``module`` (StableHLO bytecode) with a mesh of ``mesh_axes`` and, per
    argument and result of ``main``, the mesh axis each dim is split over
    (a result's None: XLA chooses)."""
    from jaxlib.mlir import ir

    from tpu_inductor.runtime.jaxlib_api import mlir_context

    with mlir_context(), ir.Location.unknown():
        parsed = ir.Module.parse(module)
        main = next(
            op for op in parsed.body.operations
            if "sym_name" in op.attributes and ir.StringAttr(op.attributes["sym_name"]).value == "main"
        )
        signature = ir.FunctionType(ir.TypeAttr(main.attributes["function_type"]).value)
        for name, specs, types in (
            ("arg_attrs", argument_specs, signature.inputs),
            ("res_attrs", result_specs, signature.results),
        ):
            if len(specs) != len(types):
                raise ValueError(f"{len(specs)} shardings for the {len(types)} {name[:3]}s of main")
            old = list(ir.ArrayAttr(main.attributes[name])) if name in main.attributes else [None] * len(specs)
            main.attributes[name] = ir.ArrayAttr.get(
                [
                    _with(entry) if spec is None else _with(entry, "sdy.sharding", _sharding(spec, ir))
                    for entry, spec in zip(old, specs)
                ]
            )
        axes = ", ".join(f'"{axis}"={size}' for axis, size in mesh_axes)
        mesh = ir.Operation.parse(f"sdy.mesh @{_MESH} = <[{axes}]>")
        ir.InsertionPoint.at_block_begin(parsed.body).insert(mesh)
        return bytecode_of(parsed)


_MESH = "mesh"


def _sharding(spec: Sequence[Optional[str]], ir):
    dims = ", ".join(f'{{"{axis}"}}' if axis is not None else "{}" for axis in spec)
    return ir.Attribute.parse(f"#sdy.sharding<@{_MESH}, [{dims}]>")


def _with(entry, key: Optional[str] = None, value=None):
    """``entry`` (an argument's or result's attributes, or None) with ``key`` set."""
    from jaxlib.mlir import ir

    attributes = {a.name: a.attr for a in ir.DictAttr(entry)} if entry is not None else {}
    if key is not None:
        attributes[key] = value
    return ir.DictAttr.get(attributes)
