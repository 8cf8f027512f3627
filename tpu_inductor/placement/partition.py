"""Split an ATen graph into device islands and eager nodes.

Why: one op that cannot lower must not fail the model, and every PJRT call
costs a dispatch, so lowerable nodes are grouped into as few islands as
data dependencies allow: one per eager depth (how many times a path to a
node leaves the device for eager), independent nodes on both sides of an
eager node merged.
Which nodes may go to the device is decided before, per node, by
:func:`~tpu_inductor.placement.placement.place`; this module only groups them.

Before::

    a = aten.mm(x, w); b = aten.i0(a); c = aten.relu(b); d = aten.sin(x)

After (``island_0`` holds mm and sin, ``island_1`` holds relu)::

    a, d = island_0(x, w); b = aten.i0(a); (c,) = island_1(b)

An island made only of views, getitems, other non-compute ops and 0-d
scalar arithmetic is not worth a PJRT call; those nodes stay eager.
"""

from __future__ import annotations

import dataclasses
import operator
from typing import Any, Callable, Mapping

import torch
import torch.fx
from torch.fx.passes.infra.partitioner import Partition
from torch.fx.passes.utils.fuser_utils import fuse_as_graphmodule, topo_sort

from tpu_inductor.passes.eager_views_as_reshape import eager_views_as_reshape
from tpu_inductor.passes.input_writes_in_place import DEVICE_COPY, DEVICE_ONLY_RESULT
from tpu_inductor.placement.placement import Placement


ISLAND_PREFIX = "island_"

# Ops that move no data worth a device call on their own.
NON_COMPUTE_OPS = (
    "_operator.getitem",
    "torch.ops.aten.view.default",
    "torch.ops.aten._unsafe_view.default",
    "torch.ops.aten.reshape.default",
    "torch.ops.aten.expand.default",
    "torch.ops.aten.permute.default",
    "torch.ops.aten.t.default",
    "torch.ops.aten.transpose.int",
    "torch.ops.aten.squeeze.dim",
    "torch.ops.aten.squeeze.dims",
    "torch.ops.aten.unsqueeze.default",
    "torch.ops.aten.slice.Tensor",
    "torch.ops.aten.select.int",
    "torch.ops.aten.alias.default",
    "torch.ops.aten.detach.default",
    "torch.ops.aten.clone.default",
)


TRANSPOSE_OPS = frozenset({torch.ops.aten.t.default, torch.ops.aten.transpose.int, torch.ops.aten.permute.default})
"""Views that reorder dimensions: what a matmul can read in place."""


def is_compute(node: torch.fx.Node) -> bool:
    if node.target is operator.getitem:
        return False
    return torch.fx.node._get_qualified_name(node.target) not in NON_COMPUTE_OPS


def _worth_a_device_call(node: torch.fx.Node) -> bool:
    """A compute op that touches more than scalars: views and 0-d arithmetic
    (``loss_a + loss_b``) cost less in eager than a PJRT dispatch."""
    if not is_compute(node):
        return False
    values = [node.meta.get("val")] + [a.meta.get("val") for a in node.all_input_nodes]
    return any(isinstance(v, torch.Tensor) and v.dim() > 0 for v in values)


def produces_tensor(node: torch.fx.Node) -> bool:
    value = node.meta.get("val")
    if isinstance(value, (list, tuple)):
        return any(isinstance(v, torch.Tensor) for v in value)
    return isinstance(value, torch.Tensor)


@dataclasses.dataclass
class Island:
    """A lowerable group of nodes, extracted as its own graph module."""

    name: str
    nodes: list[torch.fx.Node]
    graph: torch.fx.GraphModule
    owner: torch.fx.GraphModule
    """The graph the nodes belong to (to cut smaller pieces out of it)."""
    inputs: tuple[torch.fx.Node, ...] = ()
    """The owner graph's nodes the island reads, in the order of its placeholders."""
    outputs: tuple[torch.fx.Node, ...] = ()
    """The owner graph's nodes the island returns, in the order of its results."""
    collective: bool = False
    """One functional collective, run in XLA over every rank (runtime/collectives.py)."""
    frozen: bool = False
    """Computes only from parameters (analysis/frozen_parameters.py): its
    results may be kept between calls."""
    executable: Any = None
    """Set once the island is compiled."""


def device_copies_out(island: Island) -> frozenset[int]:
    """The island's results that only become device copies of written inputs
    (passes/input_writes_in_place.py): handed on as device buffers, not fetched.
    Such a result is read outside the island only by the write that keeps it
    (:data:`DEVICE_COPY`) or, in a padded graph, only returned for the
    dynamic-shape runtime to keep (:data:`DEVICE_ONLY_RESULT`)."""
    inside = set(island.nodes)

    def only_a_device_copy(node: torch.fx.Node) -> bool:
        readers = [user for user in node.users if user not in inside]
        if node.meta.get(DEVICE_ONLY_RESULT):
            return bool(readers) and all(r.op == "output" for r in readers)
        return bool(readers) and all(r.kwargs.get(DEVICE_COPY) is node and node not in r.args for r in readers)

    return frozenset(index for index, node in enumerate(island.outputs) if only_a_device_copy(node))


@dataclasses.dataclass
class PartitionPlan:
    """Islands to lower, from one :class:`~tpu_inductor.placement.placement.Placement`."""

    islands: list[Island]
    partitions: list[Partition]
    placement: Placement

    @property
    def in_islands(self) -> set[torch.fx.Node]:
        return {n for island in self.islands for n in island.nodes}


def propose_islands(gm: torch.fx.GraphModule, placement: Placement) -> PartitionPlan:
    """Largest cycle-free islands of ``placement``'s device nodes; leaves ``gm`` untouched.

    Parameter-only nodes (``freeze_parameters``) get islands of their own."""
    # A frozen island runs once, so even a lone transpose in it is worth its call.
    partitions: list[Partition] = [
        p
        for p in _partitions_by_eager_depth(gm, placement)
        if any(_worth_a_device_call(n) for n in p.nodes) or all(placement.frozen(n) for n in p.nodes)
    ]
    islands = []
    for index, partition in enumerate(partitions):
        nodes = topo_sort(list(partition.nodes))
        name = f"{ISLAND_PREFIX}{index}"
        sub_gm, inputs, outputs = fuse_as_graphmodule(gm, nodes, name, always_return_tuple=True)
        frozen = all(placement.frozen(n) for n in nodes)
        collective = any(placement.collective(n) for n in nodes)
        islands.append(
            Island(
                name=name, nodes=nodes, graph=sub_gm, owner=gm, inputs=inputs, outputs=tuple(outputs),
                frozen=frozen, collective=collective,
            )
        )
    return PartitionPlan(islands=islands, partitions=partitions, placement=placement)


def _partitions_by_eager_depth(gm: torch.fx.GraphModule, placement: Placement) -> list[Partition]:
    """One island per depth: how many times a path to the node goes from the device to eager.

    ``level`` is, for a supported node, the island it joins: the deepest of
    its inputs', where an eager input counts one more than the deepest
    supported node behind it (none behind it: 0, so work that only follows
    an eager op on graph inputs shares the first island). A path that leaves
    an island through an eager node reaches only deeper islands, so no island
    waits on itself; every island boundary is one a path forces, so no split
    has fewer islands. Linear in the graph, where PyTorch's
    ``CapabilityBasedPartitioner`` keeps every node's downstream set
    (quadratic: a 72-layer MoE graph of 27,000 nodes took minutes and
    gigabytes before any lowering).

    A node whose every user is a ``getitem`` (a tuple output) takes those
    getitems with it, to an island or to eager.

    Parameter-only nodes of a level form an island of their own, ahead of the
    level's other island: they read nothing that island computes.
    """
    level: dict[torch.fx.Node, int] = {}
    group: dict[torch.fx.Node, tuple[int, bool]] = {}  # supported node -> its island: (level, not frozen)
    collectives: list[torch.fx.Node] = []

    def after(node: torch.fx.Node) -> int:
        """The first island that may run after ``node``."""
        return level[node] + 1 if node in group else level[node]

    for node in gm.graph.nodes:
        if node.op != "call_function":
            level[node] = 0
            continue
        producer = node.args[0] if node.target is operator.getitem else None
        if isinstance(producer, torch.fx.Node) and _only_getitem_users(producer):
            level[node] = level[producer]
            if producer in group:
                group[node] = group[producer]
            continue
        if placement.collective(node):
            # An island of its own, which the levels see as an eager node: what
            # it reads and what reads it are in different islands.
            level[node] = max((after(m) for m in node.all_input_nodes), default=0)
            collectives.append(node)
        elif placement.on_device(node):
            inputs = node.all_input_nodes
            level[node] = max((level[m] if m in group else after(m) for m in inputs), default=0)
            group[node] = (level[node], not placement.frozen(node))
        else:
            level[node] = max((after(m) for m in node.all_input_nodes), default=0)
    _sink_input_only_work(gm, group)
    by_island: dict[tuple[int, bool], list[torch.fx.Node]] = {}
    for node, island in group.items():
        by_island.setdefault(island, []).append(node)
    partitions = [Partition(id=index, nodes=by_island[island]) for index, island in enumerate(sorted(by_island))]
    return partitions + [Partition(id=len(partitions) + i, nodes=[node]) for i, node in enumerate(collectives)]


def _sink_input_only_work(gm: torch.fx.GraphModule, group: dict[torch.fx.Node, tuple[int, bool]]) -> None:
    """Move what is computed from graph inputs alone into the one island that reads it.

    Such a node depends on nothing computed, so it lands in the first island,
    which then writes it out as a new buffer on every call for a later
    island to read. In the reader's island XLA folds it into its use: a
    view of a parameter (``t(weight)`` for a matmul) becomes the dot's
    dimension numbers, BatchNorm's ``weight * rsqrt(var + eps)`` fuses into
    the normalisation. transformers' ResNet-18 at batch 8, 64x64: its first
    island wrote 8.4M transposed weights a call, 38.5 ms; a MobileNet-style
    model whose first convolution runs on oneDNN had 139 BatchNorm scale
    ops before it, each a new tensor for the main island to import a call.
    Frozen nodes stay where they are (their island's results are kept).
    """
    input_only: dict[torch.fx.Node, None] = {}  # in graph order; a set's lookups keep this linear
    for node in gm.graph.nodes:
        if (
            node in group
            and group[node][1]
            and node.target is not operator.getitem
            and not _only_getitem_users(node)
            and all(m.op in ("placeholder", "get_attr") or m in input_only for m in node.all_input_nodes)
        ):
            input_only[node] = None
    for node in reversed(input_only):  # readers first: a chain moves whole
        readers = {group.get(user) for user in node.users}
        if len(readers) == 1 and None not in readers:  # not read by eager code, the output or two islands
            reader = readers.pop()
            if reader[1]:
                group[node] = reader


def _only_getitem_users(node: torch.fx.Node) -> bool:
    return bool(node.users) and all(u.op == "call_function" and u.target is operator.getitem for u in node.users)


def fuse_islands(
    gm: torch.fx.GraphModule,
    plan: PartitionPlan,
    run_island: Mapping[str, Callable[..., Any]],
    release_eager_workers: bool = False,
) -> torch.fx.GraphModule:
    """Rewrite ``gm`` so each island is one call of ``run_island[island name]``.

    The islands are called as plain functions rather than submodules: a
    ``call_module`` node pays ``nn.Module.__call__`` (hook dispatch) on every
    call, about 2.5 us per island, for hooks nothing here installs.
    ``release_eager_workers``: an island that follows eager compute that may
    have started OpenMP's workers first stops them, as they spin on the cores
    it shares (runtime/threads.py). Eager kernels chosen for the calling
    thread run there alone.
    """
    from torch.fx.passes.utils.fuser_utils import fuse_by_partitions

    from tpu_inductor.runtime.threads import (
        ON_CALLING_THREAD,
        after_releasing_eager_workers,
        on_calling_thread,
        starts_workers,
    )
    from tpu_inductor.torch_api import LazyGraphModule

    fused = fuse_by_partitions(
        gm,
        [p.nodes for p in plan.partitions],
        prefix=ISLAND_PREFIX,
        always_return_tuple=True,
    )
    eager_since_island = False
    for node in fused.graph.nodes:
        if node.op == "call_module":
            node.op, node.target = "call_function", run_island[node.target]
            if release_eager_workers and eager_since_island:
                node.target = after_releasing_eager_workers(node.target)
            eager_since_island = False
        elif node.op == "call_function" and is_compute(node):
            if node.meta.get(ON_CALLING_THREAD):
                node.target = on_calling_thread(node.target)
            eager_since_island = eager_since_island or starts_workers(node)
    fused = eager_views_as_reshape(fused)
    fused.delete_all_unused_submodules()
    fused.recompile()
    # Generate forward now: a lazy GraphModule's placeholder forward re-enters
    # nn.Module.__call__, and callers here call forward directly.
    LazyGraphModule.force_recompile(fused)
    return fused
