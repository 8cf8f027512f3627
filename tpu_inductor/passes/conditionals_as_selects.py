"""``torch.cond`` as both branches and a select of their results.

Why: ``torch.cond(pred, true_fn, false_fn, operands)`` (data-dependent
control flow that compiles without a graph break) reaches the ATen graph as
one higher-order op over two subgraphs, which no lowering knows: it ran in
eager PyTorch, branches and all, and split the islands around it. torch-mlir
imports no conditional, so the device cannot run one branch only; but a
branch is a pure function of its operands (``torch.cond`` forbids mutating
them), so running both and keeping one result per output with
``where(pred, true_result, false_result)`` gives exactly the taken branch's
values, whatever the other computed (a NaN or inf there is not selected).
Predication is how XLA programs often write a cheap conditional, with no
read of ``pred`` back to the host: the whole graph stays one island. The cost
is the untaken branch's work.

Left to eager (as before): a conditional whose branches draw random numbers
(the untaken branch would advance torch's generator where eager does not),
whose results are not tensors, or whose two branches' results differ in
shape or dtype (data-dependent sizes).

Before::

    cond = torch.ops.higher_order.cond(gt, true_graph_0, false_graph_0, (mm,))
    out = cond[0]

After::

    sin = sin(mm); mul = mul(sin, 2)          # true_graph_0's body
    cos = cos(mm); add = add(cos, 1)          # false_graph_0's body
    out = where(gt, mul, add)
"""

from __future__ import annotations

import logging
from typing import Any

import torch
import torch.fx

from tpu_inductor.passes.rewrite import GraphBuilder, drop_inlined_subgraphs, replace_by_outputs, splice

log = logging.getLogger(__name__)

COND = torch.ops.higher_order.cond

EAGER_REASON = "tpu_inductor_cond_eager_reason"
"""Node metadata: why a conditional stays eager, for placement's report."""


def conditionals_as_selects(gm: torch.fx.GraphModule) -> torch.fx.GraphModule:
    selected = 0
    # A branch may hold another conditional: select until none is left that can be.
    while conditionals := [n for n in gm.graph.nodes if n.op == "call_function" and n.target is COND
                           and EAGER_REASON not in n.meta]:
        for node in conditionals:
            reason = _eager_reason(gm, node)
            if reason is not None:
                node.meta[EAGER_REASON] = f"torch.cond stays eager: {reason}"
                continue
            _select(gm, node)
            selected += 1
    if selected:
        drop_inlined_subgraphs(gm)
        log.debug("torch.cond as selects: %d conditional(s)", selected)
    return gm


def _select(gm: torch.fx.GraphModule, node: torch.fx.Node) -> None:
    pred, true_branch, false_branch, operands = node.args
    true_results = _results(splice(gm, node, getattr(gm, true_branch.target), operands))
    false_results = _results(splice(gm, node, getattr(gm, false_branch.target), operands))
    with gm.graph.inserting_before(node):
        builder = GraphBuilder(gm.graph, node)
        chosen = [builder.call(torch.ops.aten.where.self, pred, if_true, if_false)
                  for if_true, if_false in zip(true_results, false_results)]
    replace_by_outputs(node, chosen)


def _results(outputs: Any) -> list[Any]:
    """A graph's results as a list: its output is one node, or a tuple or list."""
    return [outputs] if isinstance(outputs, torch.fx.Node) else list(outputs)


def _eager_reason(gm: torch.fx.GraphModule, node: torch.fx.Node) -> str | None:
    """Why this conditional stays eager, or None to select."""
    pred, true_branch, false_branch, _ = node.args
    if not isinstance(pred, torch.fx.Node) or not isinstance(pred.meta.get("val"), torch.Tensor):
        return "its predicate is not a tensor"
    branches = [getattr(gm, branch.target) for branch in (true_branch, false_branch)]
    if any(_draws_random_numbers(branch) for branch in branches):
        return "a branch draws random numbers"
    true_values, false_values = (_output_values(branch) for branch in branches)
    if len(true_values) != len(false_values):
        return "its branches return different numbers of results"
    for if_true, if_false in zip(true_values, false_values):
        if not (isinstance(if_true, torch.Tensor) and isinstance(if_false, torch.Tensor)):
            return "a branch returns something other than a tensor"
        if if_true.dtype != if_false.dtype or if_true.shape != if_false.shape:
            return "its branches' results differ in shape or dtype"
    return None


def _draws_random_numbers(graph_module: torch.fx.GraphModule) -> bool:
    """Whether an op of ``graph_module``, or of a subgraph it calls (a nested
    conditional's branches, which would run unconditionally once this one is
    selected), draws from torch's generator."""
    for node in graph_module.graph.nodes:
        if isinstance(node.target, torch._ops.OpOverload) and torch.Tag.nondeterministic_seeded in node.target.tags:
            return True
        if node.op == "get_attr":
            called = getattr(graph_module, node.target)
            if isinstance(called, torch.fx.GraphModule) and _draws_random_numbers(called):
                return True
    return False


def _output_values(branch: torch.fx.GraphModule) -> list[Any]:
    (output,) = branch.graph.find_nodes(op="output")
    return [r.meta.get("val") if isinstance(r, torch.fx.Node) else r for r in _results(output.args[0])]
