"""Find the computation an inference graph does on its parameters alone.

Why: an inference graph recomputes, on every call, values that depend only on
parameters and buffers: BatchNorm's per-channel scale and shift, convolution
weights with BatchNorm folded in (passes/conv_epilogue.py), casts of weights
under autocast. Under the ``freeze_parameters`` option the partitioner puts
these nodes in islands of their own, whose results are kept and reused while
their inputs are the same, unchanged tensors (compiled_graph.ReusedResults).
On the CNN of ``benchmarks/perf.py`` (eval, one thread) that island took about
1 ms of every call.

A node qualifies when every input is a parameter/buffer placeholder or
another qualifying node, and it is a deterministic, non-mutating ATen op.
Two kinds are left out on purpose:

- views and layout ops reading a parameter directly (``t(weight)`` before a
  matmul): cached, they would be a second copy of the weight, and the dot
  reads the weight in place (on the CPU client too: lowering/cpu_dot_operands.py
  lays the product out so XLA:CPU need not repack the weight);
- values that reach the graph's output (directly or through views): the
  caller could write into the kept tensor.

Before (``freeze_parameters``)::

    y = island_0(x, w, bn_mean, bn_var, ...)     # folds BatchNorm every call

After::

    w_folded = island_0(w, bn_mean, bn_var, ...)  # reused while unchanged
    y = island_1(x, w_folded)
"""

from __future__ import annotations

from typing import Collection

import torch
import torch.fx

from tpu_inductor.placement.partition import is_compute


def parameter_only_nodes(
    gm: torch.fx.GraphModule, parameters: Collection[torch.fx.Node]
) -> set[torch.fx.Node]:
    """The nodes of ``gm`` whose values depend only on ``parameters``
    (placeholders) through real computation and are worth keeping between calls.

    A view of a parameter that such a node reads is part of that work too; when
    other nodes read the view as well it is copied for the kept work, since one
    node can only be on one side and, on the other, XLA folds the view into its
    reader. Edits ``gm`` for that (and recompiles it)."""
    derived: set[torch.fx.Node] = set(parameters)  # depends on parameters only
    computed: set[torch.fx.Node] = set()  # ... through at least one compute op
    for node in gm.graph.nodes:
        inputs = node.all_input_nodes
        if node.op != "call_function" or not inputs or not all(i in derived for i in inputs):
            continue
        if not _pure(node):
            continue
        derived.add(node)
        if _computes(node) or any(i in computed for i in inputs):
            computed.add(node)
    kept = computed - _reaching_output(gm)
    views = _copy_views_for(gm, kept, derived - computed - set(parameters))
    return kept | views


def _computes(node: torch.fx.Node) -> bool:
    """Writes new values (a view or a layout op of a parameter does not)."""
    target = node.target
    return is_compute(node) and not (isinstance(target, torch._ops.OpOverload) and target.is_view)


def _copy_views_for(
    gm: torch.fx.GraphModule, kept: set[torch.fx.Node], views: set[torch.fx.Node]
) -> set[torch.fx.Node]:
    """Point the kept nodes at copies of the parameter views they read; returns the copies."""
    copies: dict[torch.fx.Node, torch.fx.Node] = {}

    def copy_of(view: torch.fx.Node) -> torch.fx.Node:
        if view not in copies:
            for source in view.all_input_nodes:
                if source in views:
                    copy_of(source)
            with gm.graph.inserting_after(view):
                copies[view] = gm.graph.node_copy(view, lambda n: copies.get(n, n))
        return copies[view]

    for node in list(gm.graph.nodes):
        if node in kept:
            node.args, node.kwargs = torch.fx.node.map_arg(
                (node.args, node.kwargs), lambda n: copy_of(n) if n in views else n
            )
    if copies:
        gm.graph.eliminate_dead_code()
        gm.recompile()
    return {copy for copy in copies.values() if copy in gm.graph.nodes}


def _pure(node: torch.fx.Node) -> bool:
    """Same inputs, same result, nothing written: safe to compute once."""
    import operator

    if node.target is operator.getitem:
        return True
    target = node.target
    if not isinstance(target, torch._ops.OpOverload):
        return False
    return torch.Tag.nondeterministic_seeded not in target.tags and not target._schema.is_mutable


def _reaching_output(gm: torch.fx.GraphModule) -> set[torch.fx.Node]:
    """Nodes the graph returns, directly or as views (what the caller may write to)."""
    reached: set[torch.fx.Node] = set()
    pending = list(gm.graph.output_node().all_input_nodes)
    while pending:
        node = pending.pop()
        if node in reached:
            continue
        reached.add(node)
        if node.op == "call_function" and not is_compute(node):
            pending.extend(node.all_input_nodes)
    return reached
