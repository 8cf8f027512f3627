"""Small standard models for the model suite (tests/test_models.py).

Every model is tiny (a few thousand parameters) with random weights from a
seeded generator, so the suite needs no downloads and runs in seconds on CPU.
Each ``make_*`` function returns ``(model, inputs, targets, loss_fn)``.
"""

from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F


class MLP(nn.Module):
    def __init__(self, d_in: int = 16, hidden: int = 32, d_out: int = 4) -> None:
        super().__init__()
        self.net = nn.Sequential(
            nn.Linear(d_in, hidden),
            nn.ReLU(),
            nn.Linear(hidden, hidden),
            nn.Tanh(),
            nn.Linear(hidden, d_out),
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)


class CNN(nn.Module):
    """Conv2d + BatchNorm2d + ReLU + max/avg pooling + Linear classifier.

    The convolutions have no bias, as usual before BatchNorm: a bias there has
    an exactly-zero gradient in theory, so in practice its gradient is rounding
    noise, which AdamW normalizes into lr-sized random steps that no float32
    tolerance could compare between eager and compiled.
    """

    def __init__(self, channels: int = 3, classes: int = 5) -> None:
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(channels, 8, kernel_size=3, padding=1, bias=False),
            nn.BatchNorm2d(8),
            nn.ReLU(),
            nn.MaxPool2d(2),
            nn.Conv2d(8, 16, kernel_size=3, padding=1, bias=False),
            nn.BatchNorm2d(16),
            nn.ReLU(),
            nn.AdaptiveAvgPool2d(1),
        )
        self.classifier = nn.Linear(16, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.classifier(torch.flatten(self.features(x), 1))


class CausalSelfAttention(nn.Module):
    def __init__(self, dim: int, heads: int) -> None:
        super().__init__()
        self.heads = heads
        self.qkv = nn.Linear(dim, 3 * dim)
        self.proj = nn.Linear(dim, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, c = x.shape
        q, k, v = self.qkv(x).split(c, dim=2)
        q, k, v = (z.view(b, t, self.heads, c // self.heads).transpose(1, 2) for z in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.proj(y.transpose(1, 2).contiguous().view(b, t, c))


class DecoderBlock(nn.Module):
    def __init__(self, dim: int, heads: int) -> None:
        super().__init__()
        self.ln1 = nn.LayerNorm(dim)
        self.attn = CausalSelfAttention(dim, heads)
        self.ln2 = nn.LayerNorm(dim)
        self.mlp = nn.Sequential(nn.Linear(dim, 4 * dim), nn.GELU(), nn.Linear(4 * dim, dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln1(x))
        return x + self.mlp(self.ln2(x))


class GPT(nn.Module):
    """Token + position embedding, 2 pre-LN decoder blocks, final LayerNorm, LM head."""

    def __init__(self, vocab: int = 50, block_size: int = 16, dim: int = 32, heads: int = 4,
                 layers: int = 2) -> None:
        super().__init__()
        self.tok = nn.Embedding(vocab, dim)
        self.pos = nn.Embedding(block_size, dim)
        self.blocks = nn.ModuleList(DecoderBlock(dim, heads) for _ in range(layers))
        self.ln_f = nn.LayerNorm(dim)
        self.head = nn.Linear(dim, vocab, bias=False)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        t = idx.shape[1]
        pos = torch.arange(t, device=idx.device)
        x = self.tok(idx) + self.pos(pos)
        for block in self.blocks:
            x = block(x)
        return self.head(self.ln_f(x))


class EmbeddingConvClassifier(nn.Module):
    """nn.Embedding -> 1D conv over the sequence -> masked mean-pooling -> classifier."""

    def __init__(self, vocab: int = 40, dim: int = 16, classes: int = 3, pad: int = 0) -> None:
        super().__init__()
        self.pad = pad
        self.emb = nn.Embedding(vocab, dim, padding_idx=pad)
        self.conv = nn.Conv1d(dim, dim, kernel_size=3, padding=1)
        self.classifier = nn.Linear(dim, classes)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        mask = (idx != self.pad).unsqueeze(-1).to(torch.float32)  # (b, t, 1)
        x = self.emb(idx).transpose(1, 2)  # (b, dim, t)
        x = F.relu(self.conv(x)).transpose(1, 2)  # (b, t, dim)
        pooled = (x * mask).sum(1) / mask.sum(1).clamp(min=1.0)
        return self.classifier(pooled)


class EncoderBlock(nn.Module):
    def __init__(self, dim: int, heads: int) -> None:
        super().__init__()
        self.heads = heads
        self.ln1 = nn.LayerNorm(dim)
        self.qkv = nn.Linear(dim, 3 * dim)
        self.proj = nn.Linear(dim, dim)
        self.ln2 = nn.LayerNorm(dim)
        self.mlp = nn.Sequential(nn.Linear(dim, 2 * dim), nn.GELU(), nn.Linear(2 * dim, dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, c = x.shape
        h = self.ln1(x)
        q, k, v = self.qkv(h).reshape(b, t, 3, self.heads, c // self.heads).permute(2, 0, 3, 1, 4)
        y = F.scaled_dot_product_attention(q, k, v)
        x = x + self.proj(y.transpose(1, 2).reshape(b, t, c))
        return x + self.mlp(self.ln2(x))


class ViT(nn.Module):
    """Patch embedding (Conv2d, stride = patch), class token, 2 encoder blocks, head."""

    def __init__(self, image: int = 16, patch: int = 4, channels: int = 3, dim: int = 32,
                 heads: int = 4, layers: int = 2, classes: int = 5) -> None:
        super().__init__()
        self.patch_embed = nn.Conv2d(channels, dim, kernel_size=patch, stride=patch)
        num_patches = (image // patch) ** 2
        self.cls_token = nn.Parameter(torch.randn(1, 1, dim) * 0.02)
        self.pos_embed = nn.Parameter(torch.randn(1, num_patches + 1, dim) * 0.02)
        self.blocks = nn.ModuleList(EncoderBlock(dim, heads) for _ in range(layers))
        self.norm = nn.LayerNorm(dim)
        self.head = nn.Linear(dim, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.patch_embed(x).flatten(2).transpose(1, 2)  # (b, patches, dim)
        cls = self.cls_token.expand(x.shape[0], -1, -1)
        x = torch.cat([cls, x], dim=1) + self.pos_embed
        for block in self.blocks:
            x = block(x)
        return self.head(self.norm(x)[:, 0])


def _generator(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def make_mlp(seed: int = 0):
    torch.manual_seed(seed)
    g = _generator(seed)
    model = MLP()
    x = torch.randn(8, 16, generator=g)
    y = torch.randint(0, 4, (8,), generator=g)
    return model, (x,), y, F.cross_entropy


def make_cnn(seed: int = 0):
    torch.manual_seed(seed)
    g = _generator(seed)
    model = CNN()
    with torch.no_grad():  # non-trivial running statistics for eval mode
        for _ in range(2):
            model(torch.randn(4, 3, 8, 8, generator=g) * 2 + 0.5)
    x = torch.randn(4, 3, 8, 8, generator=g)
    y = torch.randint(0, 5, (4,), generator=g)
    return model, (x,), y, F.cross_entropy


def _lm_loss(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1))


def make_gpt(seed: int = 0):
    torch.manual_seed(seed)
    g = _generator(seed)
    model = GPT()
    tokens = torch.randint(0, 50, (2, 13), generator=g)
    return model, (tokens[:, :-1],), tokens[:, 1:], _lm_loss


def make_embedding_classifier(seed: int = 0):
    torch.manual_seed(seed)
    g = _generator(seed)
    model = EmbeddingConvClassifier()
    idx = torch.randint(1, 40, (4, 10), generator=g)
    idx[0, 7:] = 0  # padded tails exercise the mask
    idx[2, 4:] = 0
    y = torch.randint(0, 3, (4,), generator=g)
    return model, (idx,), y, F.cross_entropy


def make_vit(seed: int = 0):
    torch.manual_seed(seed)
    g = _generator(seed)
    model = ViT()
    x = torch.randn(2, 3, 16, 16, generator=g)
    y = torch.randint(0, 5, (2,), generator=g)
    return model, (x,), y, F.cross_entropy


MODELS = {
    "mlp": make_mlp,
    "cnn": make_cnn,
    "gpt": make_gpt,
    "embedding_classifier": make_embedding_classifier,
    "vit": make_vit,
}
