"""FX edits the rewrite passes share: swap a node for another call, or build
new calls with FakeTensor metadata in its place."""

from __future__ import annotations

import operator
from typing import Any, Callable, Sequence

import torch
import torch.fx
from tpu_inductor.torch_api import detect_fake_mode
from torch.fx.experimental.proxy_tensor import make_fx


def replace_with_call(
    gm: torch.fx.GraphModule, node: torch.fx.Node, target: Any, args: tuple, kwargs: dict
) -> torch.fx.Node:
    """Put ``target(*args, **kwargs)`` where ``node`` was, keeping its metadata
    (FakeTensor value, user stack trace) so lowering and reports still see them."""
    with gm.graph.inserting_before(node):
        replacement = gm.graph.call_function(target, args, kwargs)
    replacement.meta = dict(node.meta)
    node.replace_all_uses_with(replacement)
    gm.graph.erase_node(node)
    return replacement


_FACTORIES = frozenset({
    torch.ops.aten.full.default, torch.ops.aten.arange.default, torch.ops.aten.arange.start,
    torch.ops.aten.arange.start_step, torch.ops.aten.zeros.default, torch.ops.aten.ones.default,
    torch.ops.aten.scalar_tensor.default,
})
"""Ops that make a tensor from no tensor: without a ``device`` they make a CPU
one, which a graph traced on CUDA cannot mix with its own (FakeTensor refuses
``where(cpu_mask, cuda_scores, ...)``, as the H200 run found)."""


def _device_of(value: Any) -> Any:
    first = value[0] if isinstance(value, (tuple, list)) and value else value
    return first.device if isinstance(first, torch.Tensor) else None


class GraphBuilder:
    """Inserts calls before ``anchor``'s place with FakeTensor values and its stack
    trace, so later passes, lowering and reports see them like traced nodes.
    A tensor it makes from nothing (:data:`_FACTORIES`) is made on the anchor's
    device. Use inside ``graph.inserting_before(anchor)``."""

    def __init__(self, graph: torch.fx.Graph, anchor: torch.fx.Node) -> None:
        self.graph = graph
        self.anchor = anchor
        self.fake_mode = detect_fake_mode([anchor.meta.get("val")])
        self.device = _device_of(anchor.meta.get("val"))

    def call(self, target: Any, *args: Any, **kwargs: Any) -> torch.fx.Node:
        if target in _FACTORIES and "device" not in kwargs and self.device is not None:
            kwargs["device"] = self.device
        node = self.graph.call_function(target, args, kwargs)
        fake_args, fake_kwargs = torch.fx.node.map_arg((args, kwargs), lambda n: n.meta["val"])
        with self.fake_mode:
            node.meta["val"] = target(*fake_args, **fake_kwargs)
        node.meta["stack_trace"] = self.anchor.meta.get("stack_trace") or ""
        return node

    def arange(self, extent: int) -> torch.fx.Node:
        return self.call(torch.ops.aten.arange.default, extent, dtype=torch.int64)

    def replace_anchor(self, result: torch.fx.Node) -> None:
        """Let ``result`` stand where the anchor was, and drop the anchor."""
        self.anchor.replace_all_uses_with(result)
        self.graph.erase_node(self.anchor)


def trace_replacement(fn: Callable, fake_args: Sequence[Any]) -> torch.fx.GraphModule:
    """``fn`` as an ATen graph over ``fake_args``, symbolic sizes kept as sym_size nodes,
    through the same rewrites as the graph it is spliced into (it is traced
    after them)."""
    from tpu_inductor.passes import run_passes
    from tpu_inductor.decompositions.table import decomposition_table

    fake_mode = next(a.fake_mode for a in fake_args if hasattr(a, "fake_mode"))
    with fake_mode:
        return run_passes(make_fx(fn, decomposition_table=decomposition_table())(*fake_args))


def inline_replacement(
    gm: torch.fx.GraphModule,
    node: torch.fx.Node,
    replacement: torch.fx.GraphModule,
    args: Sequence[Any],
) -> None:
    """Splice ``replacement`` in place of ``node``: a node with one output,
    or one whose users are getitems of its outputs."""
    replace_by_outputs(node, splice(gm, node, replacement, args))


def splice(gm: torch.fx.GraphModule, node: torch.fx.Node, replacement: torch.fx.GraphModule, args: Sequence[Any]) -> Any:
    """Copy ``replacement``'s nodes into ``gm`` before ``node``, its inputs
    bound to ``args``; its outputs in ``gm`` (a node, or a tuple or list of them)."""
    graph = gm.graph
    env: dict[torch.fx.Node, Any] = {}
    placeholders = [n for n in replacement.graph.nodes if n.op == "placeholder"]
    env.update(zip(placeholders, args))
    outputs: Any = ()
    with graph.inserting_before(node):
        for sub in replacement.graph.nodes:
            if sub.op == "placeholder":
                continue
            if sub.op == "output":
                outputs = torch.fx.map_arg(sub.args[0], lambda x: env[x])
                break
            if sub.op == "get_attr":
                env[sub] = graph.get_attr(_attach_constant(gm, getattr(replacement, sub.target), sub.target))
                env[sub].meta = dict(sub.meta)
                continue
            copied = graph.node_copy(sub, lambda x: env[x])
            # Where the replacement's nodes have no source of their own (a
            # make_fx trace), they take the replaced node's.
            for key in ("stack_trace", "nn_module_stack", "source_fn_stack"):
                if key in node.meta and not copied.meta.get(key):
                    copied.meta[key] = node.meta[key]
            env[sub] = copied
    return outputs


def replace_by_outputs(node: torch.fx.Node, outputs: Any) -> None:
    """Let ``outputs`` stand where ``node`` was (its getitem users take the
    item they read), and drop ``node``."""
    graph = node.graph
    if isinstance(outputs, torch.fx.Node):
        node.replace_all_uses_with(outputs)
    for user in list(node.users):
        if user.target is operator.getitem:
            user.replace_all_uses_with(outputs[user.args[1]])
            graph.erase_node(user)
    graph.erase_node(node)


def drop_inlined_subgraphs(gm: torch.fx.GraphModule) -> None:
    """After calls of subgraphs were inlined: drop what no node reads any
    more (the get_attr of each subgraph, and the subgraph modules), and
    regenerate the code."""
    gm.graph.eliminate_dead_code()
    gm.delete_all_unused_submodules()
    gm.recompile()


def _attach_constant(gm: torch.fx.GraphModule, value: Any, name: str) -> str:
    """Attach a traced replacement's constant to ``gm`` under a name no other
    attribute has (replacements each number theirs from 0), as a buffer, the
    way GraphModule itself keeps the tensors its graph reads."""
    unique, count = f"_inlined_{name}", 0
    while hasattr(gm, unique):
        count += 1
        unique = f"_inlined_{name}_{count}"
    if isinstance(value, torch.Tensor) and not isinstance(value, torch.nn.Parameter):
        gm.register_buffer(unique, value)
    else:
        setattr(gm, unique, value)
    return unique


def runnable_copy(gm: torch.fx.GraphModule) -> torch.fx.GraphModule:
    """A runnable copy of ``gm`` that later passes on ``gm`` cannot touch."""
    graph = torch.fx.Graph()
    output = graph.graph_copy(gm.graph, {})
    graph.output(output)
    return torch.fx.GraphModule(gm, graph)
