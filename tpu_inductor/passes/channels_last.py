"""Run eager 2-D convolutions channels-last, and keep their neighbours in that layout.

Why: a convolution chosen for PyTorch's kernel (placement/kernel_choice.py) runs
on oneDNN, which reorders an NCHW input to its NHWC form on every call, into
a buffer it allocates per call. On the CNN of ``benchmarks/perf.py`` (one
thread) the NHWC kernels were faster by themselves (stem 0.42 -> 0.34 ms,
1x1 stride-2 0.34 -> 0.21 ms, 32-channel 3x3 2.9 -> 2.65 ms, allocator tuned
so no call page-faults), and with glibc's defaults the per-call reorder
buffers page-fault (stem 2.2 ms NCHW). Handing oneDNN [N, H, W, C] tensors
removes the reorder, but then every island between two convolutions would
transpose its input to NCHW and its output back, and XLA's CPU transposes
cost about what was saved. So the layout is propagated: the pointwise ops
after a convolution (BatchNorm's affine, ReLU, residual adds) are computed
on the [N, H, W, C] tensors, and NCHW is materialised only where something
that is not pointwise reads the value (a pooling, a graph output).

Before::

    y = convolution(x, w1, ...); z = relu(y * scale + shift)
    out = convolution(z, w2, ...)

After::

    y_nhwc = convolution_channels_last(permute(x, [0, 2, 3, 1]), w1, ...)     # eager
    z_nhwc = relu(y_nhwc * permute(scale_4d, [0, 2, 3, 1]) + ...)            # island
    out_nhwc = convolution_channels_last(z_nhwc, w2, ...)                       # eager
    out = clone(permute(out_nhwc, [0, 3, 1, 2]), contiguous)                    # island
"""

from __future__ import annotations

from typing import Optional

import torch
import torch.fx

from tpu_inductor.passes.rewrite import GraphBuilder
from tpu_inductor.runtime.threads import carry_thread_choice

aten = torch.ops.aten

TO_CHANNELS_LAST = (0, 2, 3, 1)
FROM_CHANNELS_LAST = (0, 3, 1, 2)

def convolution_channels_last(input: torch.Tensor, weight: torch.Tensor, *args: object) -> torch.Tensor:
    """``aten.convolution`` (same arguments after the input) of an input stored
    [N, H, W, C]; the result comes back stored [N, H', W', C'].

    Permuted back, the input is an NCHW tensor with channels-last strides:
    oneDNN then runs its NHWC kernel with no reorder of the activations, and
    its output is channels-last, so the result's permute is a view."""
    output = aten.convolution.default(input.contiguous().permute(FROM_CHANNELS_LAST), weight, *args)
    return output.permute(TO_CHANNELS_LAST)


def runs_channels_last(node: torch.fx.Node) -> bool:
    """A 2-D convolution: the one rank oneDNN's channels-last format covers here."""
    return node.target is aten.convolution.default and node.meta["val"].dim() == 4


def run_channels_last(gm: torch.fx.GraphModule, chosen: dict[torch.fx.Node, str]) -> dict[torch.fx.Node, str]:
    """Rewrite the chosen 2-D convolutions to take and give [N, H, W, C]
    tensors and propagate that layout through the pointwise ops around them.
    Returns the choices keyed by the nodes that now run in eager."""
    result: dict[torch.fx.Node, str] = {}
    nhwc: dict[torch.fx.Node, torch.fx.Node] = {}  # NCHW value -> the same value stored NHWC
    conv_inputs: dict[torch.fx.Node, torch.fx.Node] = {}  # one transpose per convolution input
    for node, reason in chosen.items():
        if not runs_channels_last(node):
            result[node] = reason
            continue
        conv = _rewrite_convolution(gm.graph, node, nhwc, conv_inputs)
        carry_thread_choice(node, conv)
        result[conv] = f"{reason}; channels-last"
    if nhwc:
        _propagate(gm.graph, nhwc)
        gm.graph.eliminate_dead_code()
        gm.recompile()
    return result


def _rewrite_convolution(
    graph: torch.fx.Graph,
    node: torch.fx.Node,
    nhwc: dict[torch.fx.Node, torch.fx.Node],
    conv_inputs: dict[torch.fx.Node, torch.fx.Node],
) -> torch.fx.Node:
    """``y = convolution(x, ...)`` -> ``y = clone(permute(convolution_channels_last(x_nhwc, ...)))``;
    the clone gives ``y`` eager's NCHW storage where it is materialised in
    eager (strided reads such as as_strided, graph outputs rely on it)."""
    source, *rest = node.args
    with graph.inserting_before(node):
        source_nhwc = nhwc.get(source) or conv_inputs.get(source)
        if source_nhwc is None:
            # Replaced by the producer's NHWC twin if _propagate finds one.
            source_nhwc = conv_inputs[source] = GraphBuilder(graph, source).call(
                aten.permute.default, source, list(TO_CHANNELS_LAST)
            )
        conv = GraphBuilder(graph, node).call(convolution_channels_last, source_nhwc, *rest)
        output = _nchw_of(graph, conv, node)
    node.replace_all_uses_with(output)
    graph.erase_node(node)
    nhwc[output] = conv
    return conv


def _propagate(graph: torch.fx.Graph, nhwc: dict[torch.fx.Node, torch.fx.Node]) -> None:
    """Compute every pointwise op that reads an NHWC-available value on the
    NHWC values, in graph order; the NCHW originals die unless something
    else reads them, and then read one permute of the NHWC result."""
    for node in list(graph.nodes):
        if node in nhwc or not _is_layout_free(node):
            continue
        tensor_inputs = [a for a in node.all_input_nodes if isinstance(a.meta.get("val"), torch.Tensor)]
        if not any(a in nhwc for a in tensor_inputs):
            continue
        if any(a not in nhwc and not _permutes_alongside(a) for a in tensor_inputs):
            continue
        with graph.inserting_before(node):
            args = torch.fx.node.map_arg(node.args, lambda a: _nhwc_of(graph, a, nhwc))
            kwargs = torch.fx.node.map_arg(node.kwargs, lambda a: _nhwc_of(graph, a, nhwc))
            twin = GraphBuilder(graph, node).call(node.target, *args, **kwargs)
        nhwc[node] = twin
    for value, twin in list(nhwc.items()):
        _read_nhwc_where_possible(graph, value, twin, nhwc)


def _read_nhwc_where_possible(
    graph: torch.fx.Graph, value: torch.fx.Node, twin: torch.fx.Node, nhwc: dict[torch.fx.Node, torch.fx.Node]
) -> None:
    """Point ``value``'s remaining readers at ``twin``: a permute to NHWC is
    the twin itself; anything else reads one NCHW copy of it."""
    # A convolution's own output is already the NCHW copy of its twin.
    nchw: Optional[torch.fx.Node] = value if _is_nchw_copy_of(value, twin) else None
    for user in list(value.users):
        if user in nhwc:
            continue  # computed on the twin instead: dead once its readers move
        if user.target is aten.permute.default and tuple(user.args[1]) == TO_CHANNELS_LAST:
            user.replace_all_uses_with(twin)
            continue
        if nchw is None:
            with graph.inserting_before(twin.next):  # a fixed anchor keeps the new nodes in order
                nchw = _nchw_of(graph, twin, value)
        if nchw is not value:
            user.replace_input_with(value, nchw)


def _is_nchw_copy_of(value: torch.fx.Node, twin: torch.fx.Node) -> bool:
    return (
        value.target is aten.clone.default
        and value.args[0].target is aten.permute.default
        and value.args[0].args[0] is twin
    )


def _is_layout_free(node: torch.fx.Node) -> bool:
    """Pointwise ops compute each element from the same element of their
    inputs, whatever the order of the elements in memory; seeded random ops
    would draw their numbers in a different order."""
    if node.op != "call_function" or not isinstance(node.target, torch._ops.OpOverload):
        return False
    tags = node.target.tags
    value = node.meta.get("val")
    return (
        torch.Tag.pointwise in tags
        and torch.Tag.nondeterministic_seeded not in tags
        and isinstance(value, torch.Tensor)
        and value.dim() == 4
    )


def _permutes_alongside(node: torch.fx.Node) -> bool:
    """A value whose permute broadcasts against NHWC as it did against NCHW:
    any 4-D value (a residual read from a graph input), or one constant over
    height and width (a scalar, a [C, 1, 1] BatchNorm scale, an [N, C, 1, 1]
    squeeze-excitation gate)."""
    shape = node.meta["val"].shape
    if len(shape) > 4:
        return False
    padded = (1,) * (4 - len(shape)) + tuple(shape)
    return len(shape) == 4 or (padded[2] == 1 and padded[3] == 1)


def _nhwc_of(graph: torch.fx.Graph, arg: object, nhwc: dict[torch.fx.Node, torch.fx.Node]) -> object:
    """An argument of a pointwise op computed NHWC: its twin, or the same
    values permuted to NHWC broadcasting position."""
    if not isinstance(arg, torch.fx.Node) or not isinstance(arg.meta.get("val"), torch.Tensor):
        return arg
    if arg in nhwc:
        return nhwc[arg]
    builder = GraphBuilder(graph, arg)
    value = arg
    while value.meta["val"].dim() < 4:
        value = builder.call(aten.unsqueeze.default, value, 0)
    return builder.call(aten.permute.default, value, list(TO_CHANNELS_LAST))


def _nchw_of(graph: torch.fx.Graph, twin: torch.fx.Node, like: torch.fx.Node) -> torch.fx.Node:
    builder = GraphBuilder(graph, like)
    permuted = builder.call(aten.permute.default, twin, list(FROM_CHANNELS_LAST))
    return builder.call(aten.clone.default, permuted, memory_format=torch.contiguous_format)
