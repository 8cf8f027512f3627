"""Fold what follows an eager convolution into oneDNN's fused convolution.

Why: a convolution that runs on PyTorch's kernel (placement/kernel_choice.py,
channels-last by passes/channels_last.py) is followed in a CNN by
BatchNorm's affine, a ReLU, often a residual add. Left in an island, each of
those reads and writes the whole activation between two eager convolutions:
on the CNN of ``benchmarks/perf.py`` (eval, one thread) the islands between
the convolutions took 3.1 ms of a 19 ms call (1.2 ms when timed back to back:
in place, their fresh output buffers page-fault and the activations are out
of cache). oneDNN applies a bias, one binary add and one eltwise op as
post-ops while the convolution's output is still in registers, which is what
``mkldnn._convolution_pointwise`` (the kernel Inductor's CPU fusion uses)
exposes. So:

- ``conv(x, W) * s + t`` with ``s`` and ``t`` per output channel (eval
  BatchNorm after decomposition) becomes ``conv(x, W * s) + t``: the folded
  weight is computed in the parameter island on every call, so a weight or
  running-stat update is always seen (``freeze_parameters`` keeps it while
  they are unchanged, analysis/frozen_parameters.py);
- a following ``+ other`` of the output's shape is the binary post-op;
- a following ``relu`` or ``hardtanh`` (ReLU6) is the eltwise post-op.

The folded weight stays [K, C, kh, kw]. Storing it [K, kh, kw, C] (its
channels-last form) would save oneDNN part of its per-call weight reorder
(~1% on the 64-channel convolutions of perf.py's CNN, 2.2 ms on a
512x512x3x3 weight), but writing every weight transposed on every call costs
more: folding ResNet-18's 11M weights takes 3.8 ms in eager, 35 ms with the
transpose, and transformers' ResNet-18 (batch 8 at 64x64) spent 2.94 ms a
call in its folding island with it, 1.36 ms without.

Before::

    y = convolution_channels_last(x, w, None, ...)          # eager
    z = relu(y * scale + shift + residual)                  # island

After::

    w_folded = w * scale.reshape(-1, 1, 1, 1)                               # island
    z = convolution_pointwise_channels_last(x, w_folded, shift, residual, ..., "relu")  # eager

Only float32 (folding in bfloat16 would round the folded weight), only
non-transposed 2-D convolutions, and only where each intermediate value has
no other reader: a value a backward graph saves stays as it was.
"""

from __future__ import annotations

import dataclasses
from typing import Optional, Sequence

import torch
import torch.fx
from tpu_inductor.torch_api import FakeTensor

from tpu_inductor.passes.channels_last import FROM_CHANNELS_LAST, TO_CHANNELS_LAST, convolution_channels_last
from tpu_inductor.passes.rewrite import GraphBuilder
from tpu_inductor.runtime.threads import carry_thread_choice

aten = torch.ops.aten


def available() -> bool:
    """Whether this PyTorch build has oneDNN's fused convolution."""
    return torch.backends.mkldnn.is_available() and hasattr(torch.ops.mkldnn, "_convolution_pointwise")


def convolution_pointwise_channels_last(
    input: torch.Tensor,
    weight: torch.Tensor,
    bias: Optional[torch.Tensor],
    other: Optional[torch.Tensor],
    stride: Sequence[int],
    padding: Sequence[int],
    dilation: Sequence[int],
    groups: int,
    unary: str,
    unary_scalars: Sequence[float] = (),
) -> torch.Tensor:
    """``unary(convolution(input, weight) + bias + other)`` on tensors stored
    [N, H, W, C] (the weight is [K, C, kh, kw]); the result is stored [N, H', W', K].
    ``unary`` is ``"relu"``, ``"hardtanh"`` (``unary_scalars``: its min and
    max) or ``"none"``; ``other`` may be None."""
    mkldnn = torch.ops.mkldnn
    # Contiguous [N, H, W, C] storage is the NCHW tensor with channels-last
    # strides that oneDNN's NHWC kernel reads without a reorder.
    x = input.contiguous().permute(FROM_CHANNELS_LAST)
    w = weight.contiguous()
    # The binary variant has no fake kernel in PyTorch; its output has the
    # unary variant's shape and strides.
    if other is None or isinstance(input, FakeTensor):
        output = mkldnn._convolution_pointwise(
            x, w, bias, padding, stride, dilation, groups, unary, list(unary_scalars), ""
        )
    else:
        output = mkldnn._convolution_pointwise.binary(
            x, other.contiguous().permute(FROM_CHANNELS_LAST), w, bias, padding, stride, dilation, groups,
            "add", None, None if unary == "none" else unary, list(unary_scalars), "",
        )
    return output.permute(TO_CHANNELS_LAST)


@dataclasses.dataclass
class _Epilogue:
    """What follows one convolution, in order: ``* scale + shift + other``, then ``unary``."""

    last: torch.fx.Node
    scale: Optional[torch.fx.Node] = None
    shift: Optional[torch.fx.Node] = None
    other: Optional[torch.fx.Node] = None
    unary: str = "none"
    unary_scalars: tuple[float, ...] = ()

    def describe(self) -> str:
        parts = []
        if self.scale is not None or self.shift is not None:
            parts.append("per-channel affine")
        if self.other is not None:
            parts.append("add")
        if self.unary != "none":
            parts.append(self.unary)
        return " + ".join(parts)


def fuse_convolution_epilogues(gm: torch.fx.GraphModule, chosen: dict[torch.fx.Node, str]) -> dict[torch.fx.Node, str]:
    """Rewrite the channels-last convolutions in ``chosen`` whose output feeds
    a foldable epilogue; returns ``chosen`` keyed by the nodes now in eager."""
    if not available():
        return chosen
    result: dict[torch.fx.Node, str] = {}
    for node, reason in chosen.items():
        epilogue = _match(node) if _fusable(node) else None
        if epilogue is None:
            result[node] = reason
            continue
        fused = _rewrite(gm.graph, node, epilogue)
        carry_thread_choice(node, fused)
        result[fused] = f"{reason}; fused with {epilogue.describe()}"
    if result.keys() != chosen.keys():
        gm.graph.eliminate_dead_code()
        gm.recompile()
    return result


def _fusable(conv: torch.fx.Node) -> bool:
    if conv.target is not convolution_channels_last:
        return False
    _, weight, bias, _, _, _, transposed, _, _ = conv.args
    tensors = [conv, weight] + ([bias] if bias is not None else [])
    return not transposed and all(t.meta["val"].dtype == torch.float32 for t in tensors)


def _match(conv: torch.fx.Node) -> Optional[_Epilogue]:
    """The longest epilogue the convolution's single-reader chain allows."""
    channels = conv.meta["val"].shape[-1]
    epilogue = _Epilogue(last=conv)
    step = _only_reader(conv)
    if _is(step, aten.mul.Tensor) and (scale := _operand_besides(step, epilogue.last)) is not None:
        if _per_channel(scale, channels, allow_scalar=True):
            epilogue.scale, epilogue.last = scale, step
            step = _only_reader(step)
    if _is(step, aten.add.Tensor) and (shift := _operand_besides(step, epilogue.last)) is not None:
        if _per_channel(shift, channels, allow_scalar=False):
            epilogue.shift, epilogue.last = shift, step
            step = _only_reader(step)
    if _is(step, aten.add.Tensor) and (other := _operand_besides(step, epilogue.last)) is not None:
        if _same_layout_and_shape(other, epilogue.last):
            epilogue.other, epilogue.last = other, step
            step = _only_reader(step)
    if _is(step, aten.relu.default):
        epilogue.unary, epilogue.last = "relu", step
    elif _is(step, aten.hardtanh.default) and epilogue.other is None:
        # ReLU6 (MobileNets); oneDNN's binary variant takes ReLU alone after its add.
        min_val, max_val = (*step.args[1:], *_HARDTANH_DEFAULTS[len(step.args) - 1 :])[:2]
        epilogue.unary, epilogue.unary_scalars, epilogue.last = "hardtanh", (float(min_val), float(max_val)), step
    return None if epilogue.last is conv else epilogue


_HARDTANH_DEFAULTS = (-1.0, 1.0)  # aten.hardtanh's min_val, max_val


def _only_reader(node: torch.fx.Node) -> Optional[torch.fx.Node]:
    return next(iter(node.users)) if len(node.users) == 1 else None


def _is(node: Optional[torch.fx.Node], target: object) -> bool:
    # add.Tensor's alpha would scale the operand: only the plain form folds.
    return node is not None and node.target is target and not node.kwargs


def _operand_besides(node: torch.fx.Node, known: torch.fx.Node) -> Optional[torch.fx.Node]:
    """The other tensor operand of a binary op that reads ``known`` once."""
    a, b = node.args[:2]
    other = b if a is known else a if b is known else None
    if a is b or not isinstance(other, torch.fx.Node) or not isinstance(other.meta.get("val"), torch.Tensor):
        return None
    return other


def _per_channel(node: torch.fx.Node, channels: int, allow_scalar: bool) -> bool:
    """Broadcasts against [N, H, W, K] along K only (a BatchNorm scale or shift)."""
    value = node.meta["val"]
    shape = tuple(value.shape)
    if value.dtype != torch.float32 or any(size != 1 for size in shape[:-1]):
        return False
    return shape[-1:] == (channels,) or (allow_scalar and value.numel() == 1)


def _same_layout_and_shape(node: torch.fx.Node, like: torch.fx.Node) -> bool:
    value, reference = node.meta["val"], like.meta["val"]
    return value.shape == reference.shape and value.dtype == reference.dtype


def _rewrite(graph: torch.fx.Graph, conv: torch.fx.Node, epilogue: _Epilogue) -> torch.fx.Node:
    source, weight, bias, stride, padding, dilation, _, _, groups = conv.args
    with graph.inserting_before(epilogue.last):
        builder = GraphBuilder(graph, conv)
        if epilogue.scale is not None:
            scale = builder.call(aten.reshape.default, epilogue.scale, [-1])
            weight = builder.call(
                aten.mul.Tensor, weight, builder.call(aten.reshape.default, scale, [-1, 1, 1, 1])
            )
            if bias is not None:
                bias = builder.call(aten.mul.Tensor, bias, scale)
        if epilogue.shift is not None:
            shift = builder.call(aten.reshape.default, epilogue.shift, [-1])
            bias = shift if bias is None else builder.call(aten.add.Tensor, bias, shift)
        fused = builder.call(
            convolution_pointwise_channels_last,
            source, weight, bias, epilogue.other,
            list(stride), list(padding), list(dilation), groups, epilogue.unary, list(epilogue.unary_scalars),
        )
    epilogue.last.replace_all_uses_with(fused)
    return fused
