"""Eager convolutions run channels-last and their pointwise neighbours follow (passes/channels_last.py).

Values are compared at torch.testing's float32 defaults: the rewrite only
moves where transposes happen, and oneDNN's NHWC and NCHW kernels both
accumulate in float32 over the same 3x3xC products.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch.fx.experimental.proxy_tensor import make_fx

import tpu_inductor.report as report
from tpu_inductor.passes.channels_last import FROM_CHANNELS_LAST, TO_CHANNELS_LAST, run_channels_last

aten = torch.ops.aten


def residual_block(x, w1, w2, scale, shift):
    y = F.relu(F.conv2d(x, w1, padding=1) * scale + shift)  # BatchNorm's eval affine: [C, 1, 1]
    z = F.conv2d(y, w2, padding=1) + y
    return z.mean((2, 3)), z


def _inputs():
    generator = torch.Generator().manual_seed(0)
    return (
        torch.randn(2, 8, 6, 6, generator=generator),
        torch.randn(8, 8, 3, 3, generator=generator),
        torch.randn(8, 8, 3, 3, generator=generator),
        torch.rand(8, 1, 1, generator=generator) + 0.5,
        torch.randn(8, 1, 1, generator=generator),
    )


def _activation_transposes(gm: torch.fx.GraphModule) -> list[tuple[int, ...]]:
    """The permutes that move a whole activation between NCHW and NHWC (not an
    operand constant over space, such as a [1, C, 1, 1] scale)."""
    found = []
    for node in gm.graph.find_nodes(op="call_function", target=aten.permute.default):
        source = node.args[0].meta["val"]
        spatial = source.shape[1:3] if tuple(node.args[1]) == FROM_CHANNELS_LAST else source.shape[2:]
        if source.dim() == 4 and spatial.numel() > 1:
            found.append(tuple(node.args[1]))
    return found


def test_pointwise_ops_between_convolutions_stay_channels_last():
    inputs = _inputs()
    gm = make_fx(residual_block, tracing_mode="fake")(*inputs)
    convolutions = list(gm.graph.find_nodes(op="call_function", target=aten.convolution.default))
    chosen = run_channels_last(gm, {node: "faster" for node in convolutions})

    assert len(chosen) == 2 and all("channels-last" in why for why in chosen.values())
    # One transpose in (the graph input), one out (for mean and the output z);
    # the affine, relu and residual add between the convolutions need none.
    assert sorted(_activation_transposes(gm)) == sorted([TO_CHANNELS_LAST, FROM_CHANNELS_LAST])
    for node in gm.graph.nodes:
        if node.target in (aten.relu.default, aten.add.Tensor) and node.meta["val"].dim() == 4:
            assert tuple(node.meta["val"].shape) == (2, 6, 6, 8), node.format_node()

    expected = residual_block(*inputs)
    actual = gm(*inputs)
    for a, e in zip(actual, expected):
        torch.testing.assert_close(a, e)
    assert actual[1].is_contiguous()  # eager's NCHW storage for a graph output


def test_per_sample_gates_follow_the_layout():
    """A squeeze-excitation gate ([N, C, 1, 1], one per sample and channel) is
    constant over space, so the gated product stays NHWC too."""

    def gated(x, w, gate):
        return F.conv2d(F.conv2d(x, w, padding=1) * gate, w, padding=1)

    inputs = (torch.randn(2, 8, 6, 6), torch.randn(8, 8, 3, 3), torch.rand(2, 8, 1, 1))
    gm = make_fx(gated, tracing_mode="fake")(*inputs)
    convolutions = list(gm.graph.find_nodes(op="call_function", target=aten.convolution.default))
    run_channels_last(gm, {node: "faster" for node in convolutions})
    assert sorted(_activation_transposes(gm)) == sorted([TO_CHANNELS_LAST, FROM_CHANNELS_LAST])
    torch.testing.assert_close(gm(*inputs), gated(*inputs))


def test_convolutions_of_other_ranks_are_left_alone():
    def conv1d(x, w):
        return F.relu(F.conv1d(x, w))

    gm = make_fx(conv1d, tracing_mode="fake")(torch.randn(2, 4, 9), torch.randn(4, 4, 3))
    (conv,) = gm.graph.find_nodes(op="call_function", target=aten.convolution.default)
    assert run_channels_last(gm, {conv: "faster"}) == {conv: "faster"}
    assert _activation_transposes(gm) == []


# --------------------------------------------------------------------------- through torch.compile


class SmallResNet(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.stem = torch.nn.Conv2d(3, 8, 3, padding=1, bias=False)
        self.norm = torch.nn.BatchNorm2d(8)
        self.conv = torch.nn.Conv2d(8, 8, 3, padding=1)
        self.down = torch.nn.Conv2d(8, 16, 1, stride=2)

    def forward(self, x):
        x = F.relu(self.norm(self.stem(x)))
        x = F.relu(self.conv(x)) + x
        return F.max_pool2d(x, 2), self.down(x)  # a non-pointwise reader; a conv as the output


def test_compiled_resnet_matches_eager_with_channels_last_convolutions(eager_convolutions, tmp_path):
    torch.manual_seed(0)
    model = SmallResNet().eval()
    with torch.no_grad():
        model.norm.running_mean.uniform_(-0.5, 0.5)
        model.norm.running_var.uniform_(0.5, 2.0)
    # 16x16: at 8x8 the strided convolution's 32 output positions would run as
    # a matmul (passes/small_convolutions_as_matmuls.py), not as a convolution.
    x = torch.randn(2, 3, 16, 16)
    compiled = torch.compile(model, backend="tpu", options={"cache_dir": str(tmp_path)})
    with torch.no_grad():
        expected, actual = model(x), compiled(x)
    for a, e in zip(actual, expected):
        torch.testing.assert_close(a, e)
        assert a.is_contiguous()
    (graph,) = report.current().graphs
    # The stem's BatchNorm + ReLU and the middle ReLU fold into their
    # convolutions (passes/conv_epilogue.py); the strided one has no epilogue.
    convolutions = [k.op for k in graph.eager_kernels if "convolution" in k.op]
    assert convolutions == ["convolution_pointwise_channels_last"] * 2 + ["convolution_channels_last"]
    assert graph.fallbacks == []


def test_training_through_channels_last_convolutions(eager_convolutions, tmp_path):
    """Forward graphs choose eager convolutions too; the saved activations and
    the gradients are eager's."""
    torch.manual_seed(0)
    model = SmallResNet()
    compiled_model = SmallResNet()
    compiled_model.load_state_dict(model.state_dict())
    x = torch.randn(2, 3, 8, 8)

    def loss(m, fn):
        pooled, down = fn(x)
        return pooled.square().mean() + down.mean()

    loss(model, model).backward()
    compiled = torch.compile(compiled_model, backend="tpu", options={"cache_dir": str(tmp_path)})
    loss(compiled_model, compiled).backward()
    for (name, p), q in zip(model.named_parameters(), compiled_model.parameters()):
        torch.testing.assert_close(q.grad, p.grad, msg=name)
    assert any(k.op == "convolution_channels_last" for g in report.current().graphs for k in g.eager_kernels)
