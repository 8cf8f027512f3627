"""The models benchmarks/perf.py times, in PyTorch and the same computations in JAX.

Imported (through perf_workloads.py) after perf.py has set (or left alone) the thread and
allocator settings, which torch and XLA read when they load.
"""

from __future__ import annotations

import math
from typing import Callable

import jax
import jax.numpy as jnp
import torch
import torch.nn as nn
import torch.nn.functional as F

LEARNING_RATE = 1e-3


# --------------------------------------------------------------------------- models


class MLP(nn.Module):
    def __init__(self, width: int = 1024) -> None:
        super().__init__()
        self.fc1, self.fc2, self.fc3 = (nn.Linear(width, width) for _ in range(3))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc3(F.relu(self.fc2(F.relu(self.fc1(x)))))


class DecoderBlock(nn.Module):
    def __init__(self, dim: int, heads: int) -> None:
        super().__init__()
        self.heads = heads
        self.norm1, self.norm2 = nn.LayerNorm(dim), nn.LayerNorm(dim)
        self.qkv, self.proj = nn.Linear(dim, 3 * dim), nn.Linear(dim, dim)
        self.fc1, self.fc2 = nn.Linear(dim, 4 * dim), nn.Linear(4 * dim, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        batch, seq, dim = x.shape
        q, k, v = self.qkv(self.norm1(x)).chunk(3, dim=-1)
        q, k, v = (t.view(batch, seq, self.heads, -1).transpose(1, 2) for t in (q, k, v))
        attention = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.proj(attention.transpose(1, 2).reshape(batch, seq, dim))
        return x + self.fc2(F.gelu(self.fc1(self.norm2(x))))


class Decoder(nn.Module):
    def __init__(
        self, vocab: int = 1000, dim: int = 256, heads: int = 4, layers: int = 2, seq: int = 128
    ) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab, dim)
        self.pos = nn.Parameter(torch.randn(seq, dim) * 0.02)
        self.blocks = nn.ModuleList(DecoderBlock(dim, heads) for _ in range(layers))
        self.norm = nn.LayerNorm(dim)
        self.head = nn.Linear(dim, vocab, bias=False)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        x = self.embed(tokens) + self.pos[: tokens.shape[1]]
        for block in self.blocks:
            x = block(x)
        return self.head(self.norm(x))


class BasicBlock(nn.Module):
    def __init__(self, cin: int, cout: int, stride: int) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(cout)
        self.conv2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(cout)
        self.shortcut = nn.Sequential()
        if stride != 1 or cin != cout:
            self.shortcut = nn.Sequential(
                nn.Conv2d(cin, cout, 1, stride, bias=False), nn.BatchNorm2d(cout)
            )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = F.relu(self.bn1(self.conv1(x)))
        return F.relu(self.bn2(self.conv2(out)) + self.shortcut(x))


CNN_BLOCKS = ((32, 32, 1), (32, 64, 2), (64, 128, 2))  # (in channels, out channels, stride)


class ResNet(nn.Module):
    def __init__(self, classes: int = 10) -> None:
        super().__init__()
        self.stem = nn.Sequential(
            nn.Conv2d(3, 32, 3, 1, 1, bias=False), nn.BatchNorm2d(32), nn.ReLU()
        )
        self.blocks = nn.Sequential(*(BasicBlock(*spec) for spec in CNN_BLOCKS))
        self.fc = nn.Linear(CNN_BLOCKS[-1][1], classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(self.blocks(self.stem(x)).mean(dim=(2, 3)))


class SqueezeExcite(nn.Module):
    def __init__(self, channels: int) -> None:
        super().__init__()
        self.reduce, self.expand = nn.Conv2d(channels, channels // 4, 1), nn.Conv2d(channels // 4, channels, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * F.hardsigmoid(self.expand(F.relu(self.reduce(x.mean((2, 3), keepdim=True)))))


class InvertedResidual(nn.Module):
    """MobileNetV3's block: expand 1x1, depthwise kxk, squeeze-excite, project 1x1."""

    def __init__(self, cin: int, hidden: int, cout: int, stride: int, kernel: int, excite: bool) -> None:
        super().__init__()
        self.expand = nn.Sequential(nn.Conv2d(cin, hidden, 1, bias=False), nn.BatchNorm2d(hidden), nn.Hardswish())
        self.depthwise = nn.Sequential(
            nn.Conv2d(hidden, hidden, kernel, stride, kernel // 2, groups=hidden, bias=False),
            nn.BatchNorm2d(hidden),
            nn.Hardswish(),
        )
        self.excite = SqueezeExcite(hidden) if excite else nn.Identity()
        self.project = nn.Sequential(nn.Conv2d(hidden, cout, 1, bias=False), nn.BatchNorm2d(cout))
        self.residual = stride == 1 and cin == cout

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.project(self.excite(self.depthwise(self.expand(x))))
        return x + y if self.residual else y


MOBILENET_BLOCKS = (  # (in, hidden, out, stride, kernel, squeeze-excite): MobileNetV3-Small's shape, narrower
    (16, 64, 24, 2, 3, False),
    (24, 72, 24, 1, 3, False),
    (24, 96, 40, 2, 5, True),
    (40, 240, 40, 1, 5, True),
    (40, 120, 48, 1, 5, True),
    (48, 288, 96, 2, 5, True),
    (96, 576, 96, 1, 5, True),
)


class MobileNet(nn.Module):
    def __init__(self, classes: int = 10) -> None:
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, 16, 3, 2, 1, bias=False), nn.BatchNorm2d(16), nn.Hardswish())
        self.blocks = nn.Sequential(*(InvertedResidual(*spec) for spec in MOBILENET_BLOCKS))
        self.head = nn.Sequential(nn.Conv2d(96, 576, 1, bias=False), nn.BatchNorm2d(576), nn.Hardswish())
        self.fc = nn.Linear(576, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(self.head(self.blocks(self.stem(x))).mean(dim=(2, 3)))


def _seeded(factory: Callable[[], nn.Module]) -> nn.Module:
    torch.manual_seed(0)
    return factory()


def _resnet() -> ResNet:
    """A ResNet with non-trivial BatchNorm statistics and affine parameters, in eval mode."""
    return _with_batch_norm_statistics(_seeded(ResNet))


def _mobilenet() -> MobileNet:
    """A MobileNet with non-trivial BatchNorm statistics and affine parameters, in eval mode."""
    return _with_batch_norm_statistics(_seeded(MobileNet))


def _with_batch_norm_statistics(model: nn.Module) -> nn.Module:
    for module in model.modules():
        if isinstance(module, nn.BatchNorm2d):
            module.running_mean.uniform_(-0.1, 0.1)
            module.running_var.uniform_(0.5, 1.5)
            nn.init.uniform_(module.weight, 0.5, 1.5)
            nn.init.uniform_(module.bias, -0.1, 0.1)
    return model.eval()


# ------------------------------------------------------------ the same models in JAX

Params = dict[str, jax.Array]


def to_jax(module: nn.Module) -> Params:
    """The module's floating-point state as jax arrays (shared names)."""
    return {
        name: jnp.asarray(value.detach().numpy())
        for name, value in module.state_dict().items()
        if value.is_floating_point()
    }


def linear(p: Params, name: str, x: jax.Array) -> jax.Array:
    out = x @ p[f"{name}.weight"].T
    bias = p.get(f"{name}.bias")
    return out if bias is None else out + bias


def mlp_jax(p: Params, x: jax.Array) -> jax.Array:
    x = jax.nn.relu(linear(p, "fc1", x))
    x = jax.nn.relu(linear(p, "fc2", x))
    return linear(p, "fc3", x)


def layer_norm(p: Params, name: str, x: jax.Array, eps: float = 1e-5) -> jax.Array:
    mean = x.mean(-1, keepdims=True)
    var = ((x - mean) ** 2).mean(-1, keepdims=True)
    return (x - mean) * jax.lax.rsqrt(var + eps) * p[f"{name}.weight"] + p[f"{name}.bias"]


def causal_attention(q: jax.Array, k: jax.Array, v: jax.Array) -> jax.Array:
    seq = q.shape[-2]
    scores = (q @ k.swapaxes(-1, -2)) / math.sqrt(q.shape[-1])
    scores = jnp.where(jnp.tril(jnp.ones((seq, seq), bool)), scores, -jnp.inf)
    return jax.nn.softmax(scores, axis=-1) @ v


def decoder_block_jax(p: Params, name: str, x: jax.Array, heads: int) -> jax.Array:
    batch, seq, dim = x.shape
    q, k, v = jnp.split(linear(p, f"{name}.qkv", layer_norm(p, f"{name}.norm1", x)), 3, axis=-1)
    q, k, v = (t.reshape(batch, seq, heads, -1).transpose(0, 2, 1, 3) for t in (q, k, v))
    attention = causal_attention(q, k, v).transpose(0, 2, 1, 3).reshape(batch, seq, dim)
    x = x + linear(p, f"{name}.proj", attention)
    hidden = linear(p, f"{name}.fc1", layer_norm(p, f"{name}.norm2", x))
    hidden = jax.nn.gelu(hidden, approximate=False)
    return x + linear(p, f"{name}.fc2", hidden)


def decoder_jax(p: Params, tokens: jax.Array, heads: int, layers: int) -> jax.Array:
    x = p["embed.weight"][tokens] + p["pos"][: tokens.shape[1]]
    for i in range(layers):
        x = decoder_block_jax(p, f"blocks.{i}", x, heads)
    return linear(p, "head", layer_norm(p, "norm", x))


def conv(x: jax.Array, w: jax.Array, stride: int) -> jax.Array:
    pad = w.shape[-1] // 2
    return jax.lax.conv_general_dilated(
        x, w, (stride, stride), [(pad, pad), (pad, pad)], dimension_numbers=("NCHW", "OIHW", "NCHW")
    )


def batch_norm_eval(p: Params, name: str, x: jax.Array, eps: float = 1e-5) -> jax.Array:
    scale = p[f"{name}.weight"] * jax.lax.rsqrt(p[f"{name}.running_var"] + eps)
    shift = p[f"{name}.bias"] - p[f"{name}.running_mean"] * scale
    return x * scale[:, None, None] + shift[:, None, None]


def basic_block_jax(p: Params, name: str, x: jax.Array, stride: int) -> jax.Array:
    out = jax.nn.relu(batch_norm_eval(p, f"{name}.bn1", conv(x, p[f"{name}.conv1.weight"], stride)))
    out = batch_norm_eval(p, f"{name}.bn2", conv(out, p[f"{name}.conv2.weight"], 1))
    shortcut = x
    if f"{name}.shortcut.0.weight" in p:
        shortcut = conv(x, p[f"{name}.shortcut.0.weight"], stride)
        shortcut = batch_norm_eval(p, f"{name}.shortcut.1", shortcut)
    return jax.nn.relu(out + shortcut)


def resnet_jax(p: Params, x: jax.Array) -> jax.Array:
    x = jax.nn.relu(batch_norm_eval(p, "stem.1", conv(x, p["stem.0.weight"], 1)))
    for i, (_, _, stride) in enumerate(CNN_BLOCKS):
        x = basic_block_jax(p, f"blocks.{i}", x, stride)
    return linear(p, "fc", x.mean(axis=(2, 3)))


def hardswish(x: jax.Array) -> jax.Array:
    return x * jnp.clip(x + 3, 0, 6) / 6


def hardsigmoid(x: jax.Array) -> jax.Array:
    return jnp.clip(x + 3, 0, 6) / 6


def conv_groups(x: jax.Array, w: jax.Array, stride: int, groups: int) -> jax.Array:
    pad = w.shape[-1] // 2
    return jax.lax.conv_general_dilated(
        x, w, (stride, stride), [(pad, pad), (pad, pad)],
        dimension_numbers=("NCHW", "OIHW", "NCHW"), feature_group_count=groups,
    )


def conv_bias(p: Params, name: str, x: jax.Array) -> jax.Array:
    return conv(x, p[f"{name}.weight"], 1) + p[f"{name}.bias"][:, None, None]


def inverted_residual_jax(p: Params, name: str, x: jax.Array, spec: tuple) -> jax.Array:
    cin, hidden, cout, stride, _, excite = spec
    y = hardswish(batch_norm_eval(p, f"{name}.expand.1", conv(x, p[f"{name}.expand.0.weight"], 1)))
    y = conv_groups(y, p[f"{name}.depthwise.0.weight"], stride, hidden)
    y = hardswish(batch_norm_eval(p, f"{name}.depthwise.1", y))
    if excite:
        squeezed = jax.nn.relu(conv_bias(p, f"{name}.excite.reduce", y.mean((2, 3), keepdims=True)))
        y = y * hardsigmoid(conv_bias(p, f"{name}.excite.expand", squeezed))
    y = batch_norm_eval(p, f"{name}.project.1", conv(y, p[f"{name}.project.0.weight"], 1))
    return x + y if stride == 1 and cin == cout else y


def mobilenet_jax(p: Params, x: jax.Array) -> jax.Array:
    x = hardswish(batch_norm_eval(p, "stem.1", conv(x, p["stem.0.weight"], 2)))
    for i, spec in enumerate(MOBILENET_BLOCKS):
        x = inverted_residual_jax(p, f"blocks.{i}", x, spec)
    x = hardswish(batch_norm_eval(p, "head.1", conv(x, p["head.0.weight"], 1)))
    return linear(p, "fc", x.mean(axis=(2, 3)))


def mlp_sgd_step_jax(p: Params, x: jax.Array, y: jax.Array) -> tuple[Params, jax.Array]:
    loss, grads = jax.value_and_grad(lambda q: jnp.mean((mlp_jax(q, x) - y) ** 2))(p)
    return jax.tree.map(lambda w, g: w - LEARNING_RATE * g, p, grads), loss
