"""Fold an explicit zero pad in front of a convolution into its padding.

Why: models ported from TensorFlow pad explicitly for "SAME" padding
(transformers' MobileNet, EfficientNet and friends call ``F.pad`` before
every convolution with ``tf_padding``). A convolution that runs on oneDNN
(placement/kernel_choice.py) then waits for an island that only pads: on
MobileNetV2 at batch 1, 21 of its 37 islands did little besides. Where the pad
is symmetric, the convolution pads the same zeros itself:

Before::

    y = convolution(constant_pad_nd(x, [1, 1, 1, 1], 0.0), w, b, stride, [0, 0], ...)

After::

    y = convolution(x, w, b, stride, [1, 1], ...)

Asymmetric pads (stride-2 "SAME" on an even size pads one side only) are
left alone: the convolution's padding is symmetric.
"""

from __future__ import annotations

import torch
import torch.fx

aten = torch.ops.aten


def pad_into_convolution(gm: torch.fx.GraphModule) -> torch.fx.GraphModule:
    changed = False
    for conv in gm.graph.find_nodes(op="call_function", target=aten.convolution.default):
        source, weight, bias, stride, padding, dilation, transposed, output_padding, groups = conv.args
        folded = _symmetric_zero_pad(source)
        if transposed or folded is None or len(padding) != 2:
            continue
        unpadded, (height, width) = folded
        new_padding = [padding[0] + height, padding[1] + width]
        conv.args = (unpadded, weight, bias, stride, new_padding, dilation, transposed, output_padding, groups)
        changed = True
    if changed:
        gm.graph.eliminate_dead_code()
        gm.recompile()
    return gm


def _symmetric_zero_pad(node: torch.fx.Node):
    """``(x, (pad_h, pad_w))`` when ``node`` pads a 4-D ``x`` with zeros by the
    same amount on both sides of H and of W only, else None."""
    if node.op != "call_function" or node.target is not aten.constant_pad_nd.default:
        return None
    source, pads = node.args[:2]
    value = node.args[2] if len(node.args) > 2 else node.kwargs.get("value", 0)
    if value != 0 or not isinstance(source, torch.fx.Node) or len(pads) != 4:
        return None
    if not all(isinstance(p, int) and p >= 0 for p in pads):
        return None
    left, right, top, bottom = pads
    source_value = source.meta.get("val")
    if left != right or top != bottom or not isinstance(source_value, torch.Tensor) or source_value.dim() != 4:
        return None
    return source, (top, left)
