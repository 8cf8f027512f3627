"""Compile a small transformer with backend="tpu", check it against eager, time both.

Run: python examples/quickstart.py
"""

from __future__ import annotations

import statistics
import time

import torch
import torch.nn as nn
import torch.nn.functional as F


class Block(nn.Module):
    def __init__(self, dim: int, heads: int) -> None:
        super().__init__()
        self.heads = heads
        self.norm1 = nn.LayerNorm(dim)
        self.qkv = nn.Linear(dim, 3 * dim)
        self.proj = nn.Linear(dim, dim)
        self.norm2 = nn.LayerNorm(dim)
        self.mlp = nn.Sequential(nn.Linear(dim, 4 * dim), nn.GELU(), nn.Linear(4 * dim, dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        batch, seq, dim = x.shape
        q, k, v = self.qkv(self.norm1(x)).chunk(3, dim=-1)
        q, k, v = (t.view(batch, seq, self.heads, -1).transpose(1, 2) for t in (q, k, v))
        attn = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.proj(attn.transpose(1, 2).reshape(batch, seq, dim))
        return x + self.mlp(self.norm2(x))


class TinyTransformer(nn.Module):
    def __init__(self, vocab: int = 1000, dim: int = 128, heads: int = 4, layers: int = 2) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab, dim)
        self.pos = nn.Parameter(torch.randn(1, 256, dim) * 0.02)
        self.blocks = nn.ModuleList(Block(dim, heads) for _ in range(layers))
        self.norm = nn.LayerNorm(dim)
        self.head = nn.Linear(dim, vocab, bias=False)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        x = self.embed(tokens) + self.pos[:, : tokens.shape[1]]
        for block in self.blocks:
            x = block(x)
        return self.head(self.norm(x))


def paired_timings(eager, compiled, *args, rounds: int = 15, calls: int = 10) -> tuple[float, float, float]:
    """Median seconds per call of each, and the median over rounds of eager's
    time / compiled's time: both warmed alike, timed in alternating order.
    The warm-up runs past the 100th call, where tpu starts picking XLA's
    schedule for a program that runs often (one more compile)."""
    import tpu_inductor

    for fn in (eager, compiled):
        for _ in range(100):
            fn(*args)
    # That schedule's compile runs beside the program; time after it.
    tpu_inductor.wait_for_background_compiles()
    eager_times, compiled_times = [], []
    for round_index in range(rounds):
        pair = [(eager, eager_times), (compiled, compiled_times)]
        for fn, times in pair if round_index % 2 == 0 else reversed(pair):
            started = time.perf_counter()
            for _ in range(calls):
                fn(*args)
            times.append((time.perf_counter() - started) / calls)
    ratio = statistics.median(e / c for e, c in zip(eager_times, compiled_times))
    return statistics.median(eager_times), statistics.median(compiled_times), ratio


def main() -> None:
    import tpu_inductor.report

    torch.manual_seed(0)
    model = TinyTransformer().eval()
    tokens = torch.randint(0, 1000, (4, 64))
    compiled = torch.compile(model, backend="tpu")  # no import of tpu_inductor needed

    with torch.no_grad():
        expected = model(tokens)
        started = time.perf_counter()
        got = compiled(tokens)
        compile_seconds = time.perf_counter() - started
        torch.testing.assert_close(got, expected, rtol=1e-4, atol=1e-4)
        print(f"compiled output matches eager (max abs diff {(got - expected).abs().max():.2e})")
        print(f"first call (trace + lower + XLA compile or cache hit): {compile_seconds:.2f} s")
        eager_s, tpu_s, speedup = paired_timings(model, compiled, tokens)
    print(f"eager   : {eager_s * 1e3:8.2f} ms/call")
    verdict = "faster than" if speedup > 1 else "slower than" if speedup < 1 else "as fast as"
    print(f"tpu/XLA : {tpu_s * 1e3:8.2f} ms/call  ({speedup:.2f}x eager: {verdict} eager here, "
          "median of 15 paired rounds)")

    record = tpu_inductor.report.current()
    for graph in record.graphs:
        for island in graph.islands:
            print(
                f"graph {graph.graph_id} ({graph.kind}): {island.name} with {island.num_nodes} nodes, "
                f"executable from {island.compile_source}, cache key {island.cache_key}"
            )
        for fallback in graph.fallbacks:
            print(f"  ran eagerly: {fallback.op} ({fallback.reason}) at {fallback.source}")
    from tpu_inductor.config import Config

    print(f"compiled artifacts: {Config.load().resolved_cache_dir / 'executables'}")


if __name__ == "__main__":
    main()
