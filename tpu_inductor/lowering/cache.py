"""The graph level of the disk cache: ATen island -> StableHLO, skipping torch-mlir.

Why: on a warm start the executable cache alone still pays for torch-mlir's
import and pipelines (a third or more of a cold compile on CPU). Keyed on the
ATen graph itself (every node's op, arguments and result metadata, the
placeholders' shapes/dtypes/strides, the bytes of constant attributes) plus
the component versions, an entry hands back the StableHLO bytecode directly;
the executable level (:mod:`tpu_inductor.runtime.executable`) then maps that to
a compiled executable.

A static island's entry holds its StableHLO bytecode; a symbolic island's
(dynamic/graph.py) holds the text with dynamic dims that each bucket is
refined from, keyed also by the symbols' value ranges.

A graph we cannot fingerprint exactly (an argument whose ``repr`` is not its
value, a fake or meta constant) is lowered without this level: a missed hit
costs seconds, a wrong hit costs a wrong result.
"""

from __future__ import annotations

import dataclasses
import hashlib
import logging
import operator
import time
from typing import Any, Callable, Optional

import torch
import torch.fx

from tpu_inductor import torch_api
from tpu_inductor.lowering.pipelines import IslandLoweringError
from tpu_inductor.lowering.stablehlo import LoweredModule, graph_specs, lower_to_stablehlo
from tpu_inductor.lowering.symbolic import SymbolicModule, lower_symbolic, scalar_positions
from tpu_inductor.runtime.disk_cache import CacheKey, CacheDir
from tpu_inductor.runtime.executable import record_cache_event
from tpu_inductor.versions import key_versions

log = logging.getLogger(__name__)

MODULE_FILE = "module.mlirbc"
SYMBOLIC_MODULE_FILE = "module.mlir"
STATIC_ONLY = b""
"""The symbolic entry of an island torch-mlir refused with dynamic dims: it is
lowered per bucket at static sizes (dynamic/island.py, ``PerBucketIsland``)."""


@dataclasses.dataclass
class LowerStats:
    """What one :func:`lower_cached` call did, for the report."""

    source: str  # "torch-mlir" or "disk"
    seconds: float
    key: Optional[str]


class _NotFingerprintable(Exception):
    pass


def _tensor_digest(tensor: torch.Tensor) -> str:
    if tensor.is_meta or isinstance(tensor, torch_api.FakeTensor) or tensor.is_quantized:
        raise _NotFingerprintable(f"constant {type(tensor).__name__} has no bytes to hash")
    data = tensor.detach().cpu().contiguous().reshape(-1).view(torch.uint8)
    digest = hashlib.sha256(data.numpy().tobytes()).hexdigest()
    return f"tensor({aval_of(tensor)},{tensor.stride()},{digest})"


def aval_of(value: Any) -> str:
    if isinstance(value, torch.Tensor):
        return f"{str(value.dtype).removeprefix('torch.')}[{','.join(map(str, value.shape))}]"
    return repr(value)


def _meta(value: Any) -> str:
    """A node's result metadata: what torch-mlir reads to type the IR."""
    if isinstance(value, torch.Tensor):
        return f"{aval_of(value)}{tuple(value.stride())}@{value.storage_offset()}:{value.device.type}"
    if isinstance(value, (list, tuple)):
        return "(" + ",".join(_meta(v) for v in value) + ")"
    return repr(value)


def _argument(value: Any, positions: dict[torch.fx.Node, int]) -> str:
    if isinstance(value, torch.fx.Node):
        return f"%{positions[value]}"
    if isinstance(value, torch.Tensor):
        return _tensor_digest(value)
    if isinstance(value, (list, tuple)):
        inner = ",".join(_argument(v, positions) for v in value)
        return f"[{inner}]" if isinstance(value, list) else f"({inner})"
    if isinstance(value, dict):
        return "{" + ",".join(f"{k!r}:{_argument(v, positions)}" for k, v in value.items()) + "}"
    if isinstance(value, (bool, int, float, str, type(None), torch.dtype, torch.device,
                          torch.layout, torch.memory_format, slice)):
        return repr(value)
    # Anything else might print the same for different values (or an address).
    raise _NotFingerprintable(f"argument of type {type(value).__name__}")


def _target(node: torch.fx.Node) -> str:
    if node.op in ("call_function", "call_method"):
        return torch.fx.node._get_qualified_name(node.target) if callable(node.target) else str(node.target)
    return str(node.target)


def fingerprint(gm: torch.fx.GraphModule) -> str:
    """A digest of everything in ``gm`` that shapes its StableHLO.

    Nodes are named by position, not by name: the islands of a model's
    layers are the same graph under other names (``mul_12``, ``mul_31``), and
    one lowering serves them all. A model whose every layer is cut by an
    op in eager (MoE routers' ``topk``) has an island per layer: a tiny
    Mistral Large 4 lowered 144 islands through torch-mlir (9.6 s) for 7
    distinct modules. Source lines are not in the digest either (torch-mlir
    writes each node's into the module as its location): a model moved in
    its file, or defined elsewhere, still finds its entry, and the module
    then carries the lines of the graph that made it."""
    digest = hashlib.sha256()
    positions: dict[torch.fx.Node, int] = {}
    for node in gm.graph.nodes:
        positions[node] = len(positions)
        # An input is its position; a constant, its bytes (below), whatever attribute holds it.
        target = "" if node.op in ("placeholder", "get_attr") else _target(node)
        line = [node.op, target, _argument(node.args, positions), _argument(node.kwargs, positions)]
        line.append(_meta(node.meta.get("val")))
        if node.op == "get_attr":
            attribute = operator.attrgetter(str(node.target))(gm)  # targets may be dotted
            if isinstance(attribute, torch.fx.GraphModule):
                line.append(fingerprint(attribute))
            elif isinstance(attribute, torch.Tensor):
                line.append(_tensor_digest(attribute))
            else:
                raise _NotFingerprintable(f"attribute of type {type(attribute).__name__}")
        elif node.op == "call_module":
            raise _NotFingerprintable("call_module node")
        digest.update("\x1f".join(line).encode())
        digest.update(b"\n")
    return digest.hexdigest()


def graph_key(
    gm: torch.fx.GraphModule, name: str = "main", for_cpu: bool = False, symbolic: bool = False
) -> Optional[CacheKey]:
    """The graph-level key of ``gm``, or None when it cannot be fingerprinted exactly.
    ``symbolic``: the entry holds the module with dynamic dims (lowering/symbolic.py)."""
    try:
        digest = fingerprint(gm)
    except _NotFingerprintable as exc:
        log.debug("tpu_inductor: lowering without the graph cache: %s", exc)
        return None
    except Exception as exc:  # an odd value must not fail the island (it would be "learned")
        log.debug("tpu_inductor: cannot fingerprint the graph (%r); lowering without the graph cache", exc)
        return None
    input_avals = [aval_of(n.meta.get("val")) for n in gm.graph.find_nodes(op="placeholder")]
    identity = {"aten_graph_sha256": digest, "input_avals": input_avals, "function": name, "for_cpu": for_cpu}
    if symbolic:
        identity["symbol_ranges"] = _symbol_ranges(gm)
    return CacheKey(identity=identity, environment={"versions": key_versions()})


def _symbol_ranges(gm: torch.fx.GraphModule) -> dict[str, str]:
    """The value range of each symbol in ``gm``'s placeholders: torch-mlir reads them."""
    from tpu_inductor.dynamic import SYMBOLIC_TYPES, shape_env_of

    values = [n.meta.get("val") for n in gm.graph.find_nodes(op="placeholder")]
    shape_env = shape_env_of(values)
    ranges = getattr(shape_env, "var_to_range", {})
    symbols = set()
    for value in values:
        sizes = value.shape if isinstance(value, torch.Tensor) else (value,)
        for size in sizes:
            if isinstance(size, SYMBOLIC_TYPES):
                symbols |= size.node.expr.free_symbols
    return {str(s): str(ranges.get(s)) for s in sorted(symbols, key=str)}


def _through_cache(
    disk_cache: Optional[CacheDir],
    key: Optional[CacheKey],
    file_name: str,
    lower: Callable[[], bytes],
) -> tuple[bytes, LowerStats]:
    """The bytes ``lower`` makes, from the graph cache when it holds them under ``key``."""
    started = time.perf_counter()
    if key is not None and disk_cache is not None:
        lookup = disk_cache.load("graphs", key, lambda files: files[file_name])
        record_cache_event("graph", key.digest, lookup)
        if lookup.hit:
            return lookup.value, LowerStats("disk", time.perf_counter() - started, key.digest)
    module = lower()
    seconds = time.perf_counter() - started
    if key is not None and disk_cache is not None:
        disk_cache.store(
            "graphs",
            key,
            {file_name: module},
            saves_seconds=seconds,
            extra={"stablehlo_sha256": hashlib.sha256(module).hexdigest()},
        )
    return module, LowerStats("torch-mlir", seconds, key.digest if key else None)


def lower_cached(
    gm: torch.fx.GraphModule,
    disk_cache: Optional[CacheDir],
    name: str = "main",
    *,
    for_cpu: bool = False,
    isolate: bool = True,
) -> tuple[LoweredModule, LowerStats]:
    """StableHLO for ``gm`` (see :func:`lower_to_stablehlo`): from the graph cache, or lowered now and stored."""
    key = graph_key(gm, name, for_cpu) if disk_cache is not None else None
    lowered: list[LoweredModule] = []

    def lower() -> bytes:
        lowered.append(lower_to_stablehlo(gm, name=name, for_cpu=for_cpu, isolate=isolate))
        return lowered[0].module

    module, stats = _through_cache(disk_cache, key, MODULE_FILE, lower)
    if lowered:
        return lowered[0], stats
    input_specs, output_specs = graph_specs(gm)
    return LoweredModule(module, input_specs, output_specs), stats


def lower_symbolic_cached(
    gm: torch.fx.GraphModule, disk_cache: Optional[CacheDir], name: str = "main", *, isolate: bool = True
) -> tuple[SymbolicModule, LowerStats]:
    """The module with dynamic dims for ``gm`` (see :func:`lower_symbolic`): from
    the graph cache, or lowered now and stored. Symbols keep their names across
    processes (Dynamo names them by source), so the fingerprint is stable."""
    key = graph_key(gm, name, symbolic=True) if disk_cache is not None else None
    lowered: list[SymbolicModule] = []
    refused: list[IslandLoweringError] = []

    def lower() -> bytes:
        try:
            lowered.append(lower_symbolic(gm, name, isolate=isolate))
        except IslandLoweringError as exc:
            refused.append(exc)
            return STATIC_ONLY
        return lowered[0].text.encode()

    text, stats = _through_cache(disk_cache, key, SYMBOLIC_MODULE_FILE, lower)
    if text == STATIC_ONLY:
        # Remembered, so that a restarted process goes straight to the static
        # lowerings (themselves in this cache) without failing torch-mlir again.
        raise refused[0] if refused else IslandLoweringError(
            "graph cache", ["torch-mlir refused this island with dynamic dims (remembered)"], ""
        )
    if lowered:
        return lowered[0], stats
    return SymbolicModule(text.decode(), scalar_positions(gm), stats.seconds), stats
