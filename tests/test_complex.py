"""Complex arithmetic runs on the device as arithmetic on real parts
(passes/complex_as_real_pairs.py).

Each part is computed by the same float32 products and sums as PyTorch's
complex kernels (a complex multiply is ac - bd and ad + bc either way), so
values are compared at torch.testing's float32 defaults. Device tests run
under ``strict``: a complex op left in eager would raise there, and the
views that cross between complex and real tensors must not.
"""

from __future__ import annotations

import pytest
import torch
from torch.fx.experimental.proxy_tensor import make_fx

import tpu_inductor.report as report
from tpu_inductor.passes.complex_as_real_pairs import CROSSING, complex_as_real_pairs

aten = torch.ops.aten


def rotary_frequencies(dim: int, positions: int, theta: float = 10000.0) -> torch.Tensor:
    """The complex rotations of Meta's Llama reference code and torchtitan."""
    freqs = 1.0 / (theta ** (torch.arange(0, dim, 2)[: dim // 2].float() / dim))
    angles = torch.outer(torch.arange(positions).float(), freqs)
    return torch.polar(torch.ones_like(angles), angles)


def apply_rotary(xq: torch.Tensor, xk: torch.Tensor, freqs_cis: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """torchtitan's ``apply_rotary_emb``, as written there."""
    xq_ = torch.view_as_complex(xq.float().reshape(*xq.shape[:-1], -1, 2))
    xk_ = torch.view_as_complex(xk.float().reshape(*xk.shape[:-1], -1, 2))
    freqs_cis = freqs_cis.view(1, xq_.shape[1], 1, xq_.shape[-1])
    xq_out = torch.view_as_real(xq_ * freqs_cis).flatten(3)
    xk_out = torch.view_as_real(xk_ * freqs_cis).flatten(3)
    return xq_out.type_as(xq), xk_out.type_as(xk)


class RotaryAttention(torch.nn.Module):
    def __init__(self, dim: int = 64, heads: int = 4, positions: int = 32) -> None:
        super().__init__()
        self.heads = heads
        self.qkv = torch.nn.Linear(dim, 3 * dim)
        self.out = torch.nn.Linear(dim, dim)
        self.register_buffer("freqs_cis", rotary_frequencies(dim // heads, positions))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        batch, seq, dim = x.shape
        q, k, v = (t.view(batch, seq, self.heads, -1) for t in self.qkv(x).chunk(3, dim=-1))
        q, k = apply_rotary(q, k, self.freqs_cis[:seq])
        attended = torch.nn.functional.scaled_dot_product_attention(
            q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), is_causal=True
        )
        return self.out(attended.transpose(1, 2).reshape(batch, seq, dim))


def _complex_ops_in(gm: torch.fx.GraphModule) -> list[str]:
    """Nodes left computing on complex values (crossings are views, not compute)."""
    return [
        str(node.target)
        for node in gm.graph.nodes
        if node.op == "call_function"
        and not node.meta.get(CROSSING)
        and any(
            isinstance(v, torch.Tensor) and v.dtype.is_complex
            for v in [node.meta.get("val")] + [a.meta.get("val") for a in node.all_input_nodes]
        )
    ]


def _fallbacks() -> list[str]:
    return [f.op for f in report.current().fallbacks()]


def test_rotary_attention_runs_on_the_device():
    torch.manual_seed(0)
    model, x = RotaryAttention().eval(), torch.randn(2, 16, 64)
    compiled = torch.compile(model, backend="tpu", options={"strict": True})
    with torch.no_grad():
        torch.testing.assert_close(compiled(x), model(x))
    (graph,) = report.current().graphs
    assert len(graph.islands) == 1 and graph.fallbacks == []


def test_rotary_attention_trains_on_the_device():
    """The backward conjugates the saved rotations (``_conj``, ``clone``) and
    multiplies again: every complex op of both graphs is rewritten."""
    torch.manual_seed(0)
    model, x = RotaryAttention(), torch.randn(2, 16, 64)
    reference = RotaryAttention()
    reference.load_state_dict(model.state_dict())
    compiled = torch.compile(model, backend="tpu", options={"strict": True})
    compiled(x).square().mean().backward()
    reference(x).square().mean().backward()
    for (name, ours), theirs in zip(model.named_parameters(), reference.parameters()):
        torch.testing.assert_close(ours.grad, theirs.grad, msg=name)
    kinds = sorted(g.kind for g in report.current().graphs)
    assert kinds == ["backward", "forward"] and all(g.islands for g in report.current().graphs)
    assert _fallbacks() == []


def _rotate_with_input_gradient(x: torch.Tensor, freqs_cis: torch.Tensor) -> torch.Tensor:
    return apply_rotary(x, x * 2, freqs_cis)[0]


def test_gradient_through_the_complex_multiply():
    torch.manual_seed(0)
    x = torch.randn(2, 8, 2, 16, requires_grad=True)
    freqs_cis = rotary_frequencies(16, 8)
    compiled = torch.compile(_rotate_with_input_gradient, backend="tpu", options={"strict": True})
    (ours,) = torch.autograd.grad(compiled(x, freqs_cis).sum(), x)
    (theirs,) = torch.autograd.grad(_rotate_with_input_gradient(x, freqs_cis).sum(), x)
    torch.testing.assert_close(ours, theirs)


def _mixed(z: torch.Tensor, w: torch.Tensor, t: torch.Tensor, angle: torch.Tensor) -> tuple[torch.Tensor, ...]:
    rotated = torch.polar(t.abs() + 0.5, angle) * z.conj() - w / (z + 2)
    scaled = torch.exp(1j * angle) * 0.5 + rotated.sum(dim=0, keepdim=True) - t
    chosen = torch.where(t > 0, scaled, w.unsqueeze(0).expand(3, 4, 5) * 2)
    joined = torch.cat([chosen, z.transpose(1, 2).transpose(1, 2)], 0)
    return torch.view_as_real(chosen), chosen.abs(), chosen.angle(), joined


def _mixed_inputs() -> tuple[torch.Tensor, ...]:
    torch.manual_seed(0)
    return (
        torch.randn(3, 4, 5, dtype=torch.complex64),
        torch.randn(4, 5, dtype=torch.complex64),
        torch.randn(3, 4, 5),
        torch.randn(3, 4, 5),
    )


def test_every_rewritten_op_matches_eager_in_the_graph():
    """The pass alone, on a graph mixing complex ops with real tensors and
    numbers, run by FX: nothing complex is left but the crossings, and the
    values are eager's (tests/test_ops.py's complex64 claims take each op alone)."""
    inputs = _mixed_inputs()
    gm = make_fx(_mixed, tracing_mode="fake")(*inputs)
    assert any(_complex_ops_in(gm))
    rewritten = complex_as_real_pairs(gm)
    assert _complex_ops_in(rewritten) == []
    for ours, theirs in zip(rewritten(*inputs), _mixed(*inputs)):
        torch.testing.assert_close(ours, theirs)


def test_complex_inputs_and_outputs_on_the_device():
    """Complex graph inputs enter as views of their real parts and a complex
    result leaves as one: the report shows no fallback, the numbers are eager's."""
    inputs = _mixed_inputs()
    compiled = torch.compile(_mixed, backend="tpu", options={"strict": True})
    for ours, theirs in zip(compiled(*inputs), _mixed(*inputs)):
        torch.testing.assert_close(ours, theirs)
    (graph,) = report.current().graphs
    assert graph.islands and graph.fallbacks == []


def _split_and_written(z: torch.Tensor, w: torch.Tensor, index: torch.Tensor) -> tuple[torch.Tensor, ...]:
    first, second = (z * 2).split([1, 2], dim=0)
    written = torch.index_put(z * 1j, (index,), w[: index.numel()], accumulate=True)
    scattered = torch.zeros_like(z).slice_scatter(first, dim=0, start=2)
    return second * first, written, scattered, *torch.unbind(z + 1, dim=1)


def test_splits_and_writes_run_on_the_device():
    """A complex tensor split into a list (each item's parts are items of the
    parts' splits) and written into another (``index_put``, ``slice_scatter``)."""
    torch.manual_seed(0)
    z, w = torch.randn(3, 4, dtype=torch.complex64), torch.randn(3, 4, dtype=torch.complex64)
    index = torch.tensor([2, 0, 2])
    compiled = torch.compile(_split_and_written, backend="tpu", options={"strict": True})
    for ours, theirs in zip(compiled(z, w, index), _split_and_written(z, w, index)):
        torch.testing.assert_close(ours, theirs)
    (graph,) = report.current().graphs
    assert graph.islands and graph.fallbacks == []


def _through_fft(x: torch.Tensor) -> torch.Tensor:
    spectrum = torch.fft.fft(x * 2 + 1)
    return torch.fft.ifft(spectrum * torch.polar(torch.ones_like(x), x)).real.sin()


def test_an_op_it_does_not_know_still_runs_eagerly_between_islands():
    """An FFT has no lowering: it runs in eager with its complex values, and
    the complex multiply between the two transforms runs on the device."""
    x = torch.randn(4, 16)
    compiled = torch.compile(_through_fft, backend="tpu")
    torch.testing.assert_close(compiled(x), _through_fft(x))
    assert {op.split(".")[1] for op in _fallbacks()} == {"_fft_r2c", "_fft_c2c"}
    assert any("mul" in op for island in report.current().islands() for op in island.ops)


def test_with_dynamic_shapes():
    torch.manual_seed(0)
    freqs_cis = rotary_frequencies(16, 64)
    compiled = torch.compile(apply_rotary, backend="tpu", dynamic=True, options={"strict": True})
    for seq in (8, 13, 21):
        xq, xk = torch.randn(2, seq, 2, 16), torch.randn(2, seq, 2, 16)
        for ours, theirs in zip(compiled(xq, xk, freqs_cis[:seq]), apply_rotary(xq, xk, freqs_cis[:seq])):
            torch.testing.assert_close(ours, theirs)
    assert _fallbacks() == []


@pytest.mark.parametrize("dtype", [torch.complex64, torch.complex128])
def test_parts_keep_the_precision_of_the_complex_dtype(dtype):
    z = torch.randn(8, dtype=dtype)
    fn = lambda z: (z * z.conj() + 1).real  # noqa: E731
    gm = complex_as_real_pairs(make_fx(fn, tracing_mode="fake")(z))
    result = gm.graph.output_node().args[0]
    assert result.meta["val"].dtype == z.real.dtype and _complex_ops_in(gm) == []
    torch.testing.assert_close(gm(z), fn(z))


def test_llama4_rotary_embedding_runs_on_the_device():
    """transformers' Llama 4 rotates queries and keys as complex numbers
    (``view_as_complex`` times ``freqs_cis``, ``view_as_real``): only its MoE
    router's ``topk`` stays in eager (by design on the CPU client: tie order)."""
    transformers = pytest.importorskip("transformers")
    config = transformers.Llama4TextConfig(
        hidden_size=64, intermediate_size=128, intermediate_size_mlp=128, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, head_dim=16, vocab_size=256, num_local_experts=2,
        max_position_embeddings=128,
    )
    torch.manual_seed(0)
    model = transformers.Llama4ForCausalLM(config).eval()
    tokens = torch.randint(0, 256, (2, 12))
    with torch.no_grad():
        expected = model(tokens).logits
        model.forward = torch.compile(model.forward, backend="tpu")
        torch.testing.assert_close(model(tokens).logits, expected, rtol=1e-4, atol=1e-4)
    assert {op for op in _fallbacks()} == {"aten.topk.default"}
