"""PyTorch's functional collectives as XLA programs over every rank's device.

Why: under ``torchrun`` a graph that DTensor, tensor parallelism or a user's
``funcol.all_reduce`` put collectives in should have XLA run them, over the
PJRT distributed runtime (runtime/distributed.py), rather than the process
group in eager. Each collective becomes one small program written in the
global view that XLA's SPMD partitioner understands, over the devices of the
collective's process group (every rank, or a subgroup such as one dim of a
``DeviceMesh`` makes): the group's tensors are the rows of one array split
over its ranks (``[ranks, *shape]``, one row per device, in group-rank
order), and the collective is what that array is turned into:

* ``all_reduce(x, op)``: the rows reduced with ``op``, replicated;
* ``all_gather_into_tensor(x)``: the rows concatenated along dim 0, replicated;
* ``reduce_scatter_tensor(x, op)``: the rows reduced, then split along dim 0
  over the ranks again;
* ``all_to_all_single(x)`` with equal splits: each row cut into one block per
  rank along dim 0, and row ``j`` of the result the ``j``-th blocks of every
  row, in rank order (a transpose of the blocks), split over the ranks.

The partitioner turns each into its collective (all-reduce, all-gather,
reduce-scatter, all-to-all), which runs over gloo between the processes. Each rank
passes its own row and gets its own part back; ranks outside the group take
no part. Before the first compile of each collective the group's ranks compare
what they compile through the store, so ranks that traced different graphs
get an error naming both ops instead of a hang.
"""

from __future__ import annotations

import collections
import dataclasses
import itertools
import logging
from typing import Any, Optional, Sequence

import torch
from torch.utils.dlpack import to_dlpack

from tpu_inductor.errors import LoweringError, RanksDisagreeError
from tpu_inductor.runtime import jaxlib_api, transfer
from tpu_inductor.runtime.distributed import DistributedRuntime, store
from tpu_inductor.lowering.sharding_annotations import annotate_shardings
from tpu_inductor.lowering.with_collectives import COLLECTIVES, ELEMENT_TYPES, REDUCTIONS, WAIT, tensor_type_of
from tpu_inductor.runtime.disk_cache import CacheDir
from tpu_inductor.runtime.executable import CompileStats, TensorSpec, compile_stablehlo
from tpu_inductor.runtime.mesh import Mesh, Spec
from tpu_inductor.runtime.sharded import collectives as count_collectives

log = logging.getLogger(__name__)

LOWERED = COLLECTIVES
_REDUCIBLE = frozenset(ELEMENT_TYPES) - {torch.bool, torch.uint8}
"""The dtypes a collective runs in XLA for."""
_compiles: dict[tuple[int, ...], itertools.count] = collections.defaultdict(itertools.count)
"""Per process group (its global ranks): how many collectives this rank compiled over it."""
_RANKS = "ranks"
"""The one mesh axis of a collective's program: the ranks of its process group."""


@dataclasses.dataclass(frozen=True)
class Collective:
    """One functional collective call: what is reduced or gathered, and over
    which ranks (its process group's global ranks, in group-rank order)."""

    kind: str
    shape: tuple[int, ...]
    dtype: torch.dtype
    reduce_op: Optional[str]
    ranks: tuple[int, ...]
    whole_job: bool

    @classmethod
    def of(cls, node: torch.fx.Node) -> "Collective":
        import torch.distributed as dist

        kind = LOWERED[node.target]
        value = node.args[0].meta["val"]
        reduce_op = node.args[1] if kind in ("all_reduce", "reduce_scatter_tensor") else None
        ranks = tuple(dist.get_process_group_ranks(_process_group(node)))
        return cls(kind, tuple(int(s) for s in value.shape), value.dtype, reduce_op, ranks,
                   len(ranks) == dist.get_world_size())

    def describe(self) -> str:
        dtype = str(self.dtype).removeprefix("torch.")
        details = [f"{dtype}[{','.join(map(str, self.shape))}]", *([self.reduce_op] if self.reduce_op else [])]
        if not self.whole_job:
            details.append(f"ranks {','.join(map(str, self.ranks))}")
        return f"{self.kind}({', '.join(details)})"


def _process_group(node: torch.fx.Node) -> Any:
    """The process group a functional collective's node names (its last argument)."""
    from torch.distributed.distributed_c10d import _resolve_process_group

    return _resolve_process_group(node.args[-1])


def why_not_lowered(node: torch.fx.Node) -> Optional[str]:
    """None when this collective can run in XLA over its group's ranks; else why not."""
    import torch.distributed as dist

    value = node.args[0].meta.get("val") if isinstance(node.args[0], torch.fx.Node) else None
    if not isinstance(value, torch.Tensor) or value.dtype not in _REDUCIBLE or value.dim() == 0:
        return "a collective of this value runs through the process group"
    kind = LOWERED[node.target]
    group = _process_group(node)
    world = dist.get_world_size(group)
    if kind == "all_to_all_single":
        even = [value.shape[0] // world] * world
        if value.shape[0] % world or any(list(sizes) != even for sizes in node.args[1:3]):
            return "an all_to_all_single with uneven splits runs through the process group"
    elif kind != "all_gather_into_tensor":
        reduce_op = node.args[1]
        if reduce_op not in REDUCTIONS or (reduce_op == "avg" and not value.dtype.is_floating_point):
            return f"reduce op {reduce_op!r} of {value.dtype} runs through the process group"
    return None


def _program(collective: Collective, world: int) -> tuple[str, Spec, tuple[int, ...]]:
    """The StableHLO text of ``collective`` in the global view (its input is
    the ranks' rows, split over the ``ranks`` axis), the result's spec, and
    the shape of the part of the result each rank gets."""
    element = ELEMENT_TYPES[collective.dtype]
    shape = collective.shape

    def tensor(dims: tuple[int, ...]) -> str:
        return tensor_type_of(dims, collective.dtype)

    rows = tensor((world, *shape))
    if collective.kind == "all_to_all_single":
        # [sender, receiver, block] -> [receiver, sender, block]: row j, the blocks sent to rank j.
        blocks = tensor((world, world, shape[0] // world, *shape[1:]))
        order = ", ".join(map(str, [1, 0, *range(2, len(shape) + 2)]))
        out_shape = (world * shape[0], *shape[1:])
        body = (
            f"%b = stablehlo.reshape %x : ({rows}) -> {blocks}\n"
            f"    %t = stablehlo.transpose %b, dims = [{order}] : ({blocks}) -> {blocks}\n"
            f"    %r = stablehlo.reshape %t : ({blocks}) -> {tensor(out_shape)}"
        )
        result, local = (_RANKS,) + (None,) * (len(shape) - 1), shape
    elif collective.kind == "all_gather_into_tensor":
        out_shape = (world * shape[0], *shape[1:])
        body = f"%r = stablehlo.reshape %x : ({rows}) -> {tensor(out_shape)}"
        result, local = (None,) * len(out_shape), out_shape
    else:
        op, out_shape = REDUCTIONS[collective.reduce_op], shape
        body = (
            f"%init = stablehlo.constant dense<{_identity(op, collective.dtype)}> : tensor<{element}>\n"
            f"    %r = stablehlo.reduce(%x init: %init) applies stablehlo.{op} across dimensions = [0]"
            f" : ({rows}, tensor<{element}>) -> {tensor(shape)}"
        )
        if collective.reduce_op == "avg":
            body += (
                f"\n    %n = stablehlo.constant dense<{float(world)}> : {tensor(shape)}"
                f"\n    %mean = stablehlo.divide %r, %n : {tensor(shape)}"
            )
        if collective.kind == "reduce_scatter_tensor":
            if shape[0] % world:
                raise LoweringError(f"{collective.describe()}: dim 0 is not a multiple of the {world} ranks")
            result, local = (_RANKS,) + (None,) * (len(shape) - 1), (shape[0] // world, *shape[1:])
        else:
            result, local = (None,) * len(shape), shape
    returned = "%mean" if collective.reduce_op == "avg" else "%r"
    text = f"""module @collective {{
  func.func public @main(%x: {rows}) -> {tensor(out_shape)} {{
    {body}
    return {returned} : {tensor(out_shape)}
  }}
}}
"""
    return text, result, local


# -inf and +inf as each float type's bits (MLIR's dense literals take hex for them).
_INFINITIES = {
    torch.float32: ("0xFF800000", "0x7F800000"),
    torch.float16: ("0xFC00", "0x7C00"),
    torch.bfloat16: ("0xFF80", "0x7F80"),
    torch.float64: ("0xFFF0000000000000", "0x7FF0000000000000"),
}


def _identity(op: str, dtype: torch.dtype) -> str:
    """The value ``op`` starts its reduction from."""
    if op in ("add", "multiply"):
        one = "1" if op == "multiply" else "0"
        return f"{one}.0" if dtype.is_floating_point else one
    if dtype.is_floating_point:
        return _INFINITIES[dtype][0 if op == "maximum" else 1]
    info = torch.iinfo(dtype)
    return str(info.min if op == "maximum" else info.max)


class CollectiveExecutable:
    """One compiled collective: this rank's tensor in, this rank's result out."""

    def __init__(
        self, collective: Collective, runtime: DistributedRuntime, name: str, disk_cache: Optional[CacheDir] = None
    ) -> None:
        self.collective = collective
        self.name = name
        world = len(collective.ranks)
        agree_across_ranks(collective.ranks, collective.describe(), runtime)
        text, result, local_out = _program(collective, world)
        mesh = Mesh(((_RANKS, world),), tuple(runtime.devices[rank] for rank in collective.ranks))
        rows: Spec = (_RANKS,) + (None,) * len(collective.shape)
        module = annotate_shardings(text.encode(), mesh.axes, [rows], [result])
        devices = jaxlib_api.DeviceList(mesh.devices)
        # Through the executable cache like every island: a restarted job loads it.
        self.loaded, stats = compile_stablehlo(module, runtime.platform, disk_cache, mesh=mesh)
        self.compile_source = stats.source
        self.collectives = count_collectives(self.loaded)
        self._device = runtime.local_device
        self._aval = jaxlib_api.shaped_array((world, *collective.shape), transfer.numpy_dtype(collective.dtype))
        self._sharding = jaxlib_api.hlo_sharding(devices, mesh.hlo_sharding(rows))
        self.input_specs = (TensorSpec(collective.shape, collective.dtype),)
        self.output_specs = (TensorSpec(local_out, collective.dtype),)

    def run(self, tensor: torch.Tensor) -> list[torch.Tensor]:
        row = tensor.detach().contiguous().unsqueeze(0)
        local = jaxlib_api.buffer_from_dlpack(to_dlpack(row), self._device, None)
        argument = jaxlib_api.ArrayImpl(self._aval, self._sharding, [local], True, _skip_checks=True)
        # Each rank addresses its one device: one array of the result is its part.
        ((mine,),) = self.loaded.execute_sharded([argument]).disassemble_into_single_device_arrays()
        return [transfer.host_tensor(mine)]

    __call__ = run


def agree_across_ranks(ranks: tuple[int, ...], description: str, runtime: DistributedRuntime) -> None:
    """Every rank of the group (``ranks``) compiles the same collectives
    (``description``) as its n-th program over that group, or all get an
    error naming what each compiles."""
    import datetime

    shared = store()
    group = ",".join(map(str, ranks))
    number = next(_compiles[ranks])
    key = f"tpu_inductor/collective/{group}/{number}"
    shared.set(f"{key}/{runtime.rank}", description)
    keys = [f"{key}/{rank}" for rank in ranks]
    try:
        shared.wait(keys, datetime.timedelta(seconds=60))
    except Exception:
        raise RanksDisagreeError(
            f"tpu_inductor: rank {runtime.rank} compiles {description} as its collective #{number}, "
            f"and not every rank of its group reached a collective #{number} within 60 s: "
            "the ranks traced different graphs"
        ) from None
    seen = {rank: shared.get(k).decode() for rank, k in zip(ranks, keys)}
    if len(set(seen.values())) > 1:
        which = "; ".join(f"rank {rank}: {what}" for rank, what in seen.items())
        raise RanksDisagreeError(
            f"tpu_inductor: the ranks traced different graphs: their collective #{number} differs ({which}). "
            "Every rank must run the same compiled collectives in the same order."
        )


def compile_for_group(
    module: bytes,
    ranks: tuple[int, ...],
    runtime: DistributedRuntime,
    disk_cache: Optional[CacheDir] = None,
    input_specs: Sequence[TensorSpec] = (),
) -> tuple[Any, CompileStats]:
    """``module``, one rank's program whose collectives run over ``ranks``
    (lowering/with_collectives.py), compiled with one replica per rank of the
    group, replica ``i`` on group rank ``i``'s device; through both levels of
    the executable cache (memory, ``disk_cache``), as every island is, so a
    restarted job loads it instead of compiling. Returns the executable and
    the compile stats."""
    devices = [runtime.devices[rank] for rank in ranks]
    return compile_stablehlo(module, runtime.platform, disk_cache, input_specs=input_specs, replicas=devices)
