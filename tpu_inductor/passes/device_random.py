"""Random ops draw their numbers on the device, from one seed per call.

Why: an op that draws from torch's generator cannot run inside an XLA
executable, so each one ran in eager PyTorch between islands: a dropout in
every training step split the graph and, on a TPU, cost a host round trip.
torch-mlir's own lowerings of random ops use a generator of their own whose
state is fixed when the executable is compiled, so they are not an answer.

Inductor's answer (``fallback_random=False``, its default) is ours too: each
random op becomes a counter-based generator, a pure function of a seed and
the element's position, written in ATen integer ops that lower anywhere.
The seed is one 0-d int64 input, ``rng_seed``, that the runtime draws from
torch's generator at every call of the graph (:func:`draw_seed`), so
``torch.manual_seed`` makes a run reproducible and no two calls repeat, but
the numbers are not eager's. ``fallback_random=True`` skips this stage: the
ops then run in eager PyTorch and draw exactly eager's numbers.

Before: ``native_dropout(x, 0.1, True)``; after: ``rand = bits(rng_seed,
stream 0, arange(numel)) * 2**-24; mask = rand > 0.1; out = x * mask / 0.9``.

The generator is SplitMix64's finaliser over ``counter * golden + key``
(a strong 64-bit mixer; counter-based, so every element is independent of
every other and of the graph's partitioning). Each random op in a graph is
its own stream: its key mixes the seed with the op's index.
"""

from __future__ import annotations

import logging
import math
from typing import Any, Callable, Sequence

import torch
import torch.fx

from tpu_inductor.passes.rewrite import inline_replacement, trace_replacement

log = logging.getLogger(__name__)
aten = torch.ops.aten

SEED_INPUT = "rng_seed"
"""The name of the placeholder the runtime fills with :func:`draw_seed`."""
SEED_META = "tpu_inductor_rng_seed_device"
"""``gm.meta`` key: the device the graph's seed input is drawn on (absent: no seed input)."""


def _signed(value: int) -> int:
    """A Python int's low 64 bits as the int64 with those bits (wrapping, as int64 arithmetic does)."""
    value &= (1 << 64) - 1
    return value - (1 << 64) if value >= 1 << 63 else value


_GOLDEN = _signed(0x9E3779B97F4A7C15)
_MIX_1 = _signed(0xBF58476D1CE4E5B9)
_MIX_2 = _signed(0x94D049BB133111EB)


def _logical_shift_right(z: torch.Tensor, bits: int) -> torch.Tensor:
    """``z >>> bits`` on int64: the arithmetic shift, its sign bits masked off
    (ATen has no unsigned shift for int64)."""
    return torch.bitwise_and(torch.bitwise_right_shift(z, bits), (1 << (64 - bits)) - 1)


def _mix(z: torch.Tensor) -> torch.Tensor:
    """SplitMix64's finaliser: every output bit depends on every input bit.
    int64 multiplication wraps in eager and in XLA alike."""
    z = torch.bitwise_xor(z, _logical_shift_right(z, 30)) * _MIX_1
    z = torch.bitwise_xor(z, _logical_shift_right(z, 27)) * _MIX_2
    return torch.bitwise_xor(z, _logical_shift_right(z, 31))


def random_bits(seed: torch.Tensor, stream: int, shape: Sequence[Any]) -> torch.Tensor:
    """64 random bits (as int64) per element of ``shape``, for ``stream`` of ``seed``."""
    key = _mix(seed + _signed((stream + 1) * _GOLDEN))
    count = math.prod(shape) if shape else 1
    counter = torch.arange(count, dtype=torch.int64, device=seed.device)
    return _mix(counter * _GOLDEN + key).reshape(tuple(shape))


def uniform(seed: torch.Tensor, stream: int, shape: Sequence[Any], dtype: torch.dtype) -> torch.Tensor:
    """Uniform in [0, 1): as many top bits as ``dtype``'s mantissa holds, so
    the value is exact in ``dtype`` and never rounds up to 1."""
    bits = 1 - int(math.log2(torch.finfo(dtype).eps))  # float32: 24, bfloat16: 8, float64: 53
    top = _logical_shift_right(random_bits(seed, stream, shape), 64 - bits)
    return top.to(dtype) * (2.0**-bits)


def normal(seed: torch.Tensor, stream: int, shape: Sequence[Any], dtype: torch.dtype) -> torch.Tensor:
    """Standard normal by Box-Muller over two uniforms of the stream (its even
    and odd counters), computed in float32 at least."""
    compute = torch.promote_types(dtype, torch.float32)
    count = math.prod(shape) if shape else 1
    pair = uniform(seed, stream, (count, 2), compute)
    radius = torch.sqrt(-2.0 * torch.log1p(-pair[:, 0]))  # 1 - u is in (0, 1]
    return (radius * torch.cos((2 * math.pi) * pair[:, 1])).reshape(tuple(shape)).to(dtype)


def integers(seed: torch.Tensor, stream: int, shape: Sequence[Any], low: int, high: int, dtype) -> torch.Tensor:
    """Integers in [low, high): 63 random bits modulo the range (the bias is
    below 2**-30 for any range under 2**32)."""
    bits = _logical_shift_right(random_bits(seed, stream, shape), 1)
    return (torch.remainder(bits, high - low) + low).to(dtype)


# -- the ops -------------------------------------------------------------------------
#
# Each replacement takes (seed, stream, *the op's arguments) and returns what the
# op returns; factories get their result's dtype as ``dtype`` (device_random).


def _rand(seed, stream, size, *, dtype, **_):
    return uniform(seed, stream, size, dtype)


def _randn(seed, stream, size, *, dtype, **_):
    return normal(seed, stream, size, dtype)


def _rand_like(seed, stream, x, *, dtype, **_):
    return uniform(seed, stream, x.shape, dtype)


def _randn_like(seed, stream, x, *, dtype, **_):
    return normal(seed, stream, x.shape, dtype)


def _randint(seed, stream, high, size, *, dtype, **_):
    return integers(seed, stream, size, 0, high, dtype)


def _randint_low(seed, stream, low, high, size, *, dtype, **_):
    return integers(seed, stream, size, low, high, dtype)


def _uniform(seed, stream, x, low=0.0, high=1.0, **_):
    return uniform(seed, stream, x.shape, x.dtype) * (high - low) + low


def _normal_functional(seed, stream, x, mean=0.0, std=1.0, **_):
    return normal(seed, stream, x.shape, x.dtype) * std + mean


def _exponential(seed, stream, x, lambd=1.0, **_):
    # -log(1 - u) for u in [0, 1): in [0, inf), as eager's inverse transform.
    return -torch.log1p(-uniform(seed, stream, x.shape, x.dtype)) / lambd


def _bernoulli_p(seed, stream, x, p=0.5, **_):
    """1 where a uniform is below ``p`` (a number or a tensor), in ``x``'s shape and dtype."""
    return (uniform(seed, stream, x.shape, torch.float32) < p).to(x.dtype)


def _bernoulli(seed, stream, x, **_):
    """``bernoulli(p)``: ``x`` holds the probabilities."""
    return _bernoulli_p(seed, stream, x, x)


def _native_dropout(seed, stream, x, p, train):
    """PyTorch's decomposition of ``native_dropout`` (torch/_decomp), drawing here."""
    if not train or p == 0:
        return x.clone(), torch.ones_like(x, dtype=torch.bool)
    if p == 1:
        return torch.zeros_like(x), torch.zeros_like(x, dtype=torch.bool)
    keep = uniform(seed, stream, x.shape, torch.float32) > p
    return keep * x * (1.0 / (1.0 - p)), keep


def _rrelu_with_noise(seed, stream, x, noise, lower=1.0 / 8, upper=1.0 / 3, training=False, **_):
    """PyTorch's decomposition of ``rrelu_with_noise`` (torch/_decomp), functional:
    the output and the noise it writes."""
    if not training:
        return torch.nn.functional.leaky_relu(x, (lower + upper) / 2), noise.clone()
    not_positive = x <= 0
    slope = _uniform(seed, stream, x, lower, upper)
    return torch.where(not_positive, x * slope, x), torch.where(not_positive, slope, torch.ones_like(slope))


REPLACEMENTS: dict[Any, Callable[..., Any]] = {
    aten.rand.default: _rand,
    aten.randn.default: _randn,
    aten.rand_like.default: _rand_like,
    aten.randn_like.default: _randn_like,
    aten.randint.default: _randint,
    aten.randint.low: _randint_low,
    aten.uniform.default: _uniform,
    aten.normal_functional.default: _normal_functional,
    aten.exponential.default: _exponential,
    aten.bernoulli.default: _bernoulli,
    aten.bernoulli.p: _bernoulli_p,
    aten.bernoulli.Tensor: _bernoulli_p,
    aten.native_dropout.default: _native_dropout,
    aten.rrelu_with_noise_functional.default: _rrelu_with_noise,
}
"""Random ops drawn on the device; any other (``multinomial``, ``randperm``,
one given its own ``generator``) runs in eager PyTorch on torch's generator."""


_FACTORIES = frozenset({aten.rand.default, aten.randn.default, aten.rand_like.default, aten.randn_like.default,
                        aten.randint.default, aten.randint.low})
"""Ops whose result dtype is a ``dtype`` argument (absent: the default dtype when traced)."""


def _replaceable(node: torch.fx.Node) -> bool:
    if node.op != "call_function" or node.target not in REPLACEMENTS:
        return False
    if node.kwargs.get("generator") is not None:  # the user's own generator: its state is theirs
        return False
    nested = [a for a in torch.fx.node.map_aggregate(node.args, lambda a: a) if isinstance(a, (list, tuple))]
    if any(isinstance(x, torch.fx.Node) for seq in nested for x in seq):
        return False  # a size that is a graph value (a symbolic factory size): not traced here
    val = node.meta.get("val")
    outputs = val if isinstance(val, (tuple, list)) else (val,)
    if not all(isinstance(v, torch.Tensor) for v in outputs):
        return False
    # A complex draw or probability (its draw is defined by torch's kernels,
    # and the replacements compare and scale real values) keeps torch's generator.
    values = [*outputs, *(a.meta.get("val") for a in node.all_input_nodes)]
    return not any(isinstance(v, torch.Tensor) and v.is_complex() for v in values)


def _first_output(node: torch.fx.Node) -> torch.Tensor:
    val = node.meta["val"]
    return val[0] if isinstance(val, (tuple, list)) else val


def _replace(gm: torch.fx.GraphModule, node: torch.fx.Node, seed: torch.fx.Node, stream: int) -> None:
    replacement = REPLACEMENTS[node.target]
    kwargs = {k: v for k, v in node.kwargs.items() if k not in ("generator", "layout", "device", "pin_memory")}
    if node.target in _FACTORIES:
        kwargs["dtype"] = _first_output(node).dtype
    positions = [i for i, a in enumerate(node.args) if isinstance(a, torch.fx.Node)]
    inputs = [node.args[i] for i in positions]

    def draw(seed_value: torch.Tensor, *tensors: torch.Tensor) -> Any:
        args = list(node.args)
        for i, tensor in zip(positions, tensors):
            args[i] = tensor
        return replacement(seed_value, stream, *args, **kwargs)

    traced = trace_replacement(draw, [seed.meta["val"], *[a.meta["val"] for a in inputs]])
    inline_replacement(gm, node, traced, [seed, *inputs])


def device_random(gm: torch.fx.GraphModule) -> torch.fx.GraphModule:
    """Replace every op of :data:`REPLACEMENTS` by its counter-based draw from
    one ``rng_seed`` input, appended after every other input."""
    random_nodes = [n for n in gm.graph.nodes if _replaceable(n)]
    if not random_nodes:
        return gm
    like = _first_output(random_nodes[0])
    placeholders = list(gm.graph.find_nodes(op="placeholder"))
    with gm.graph.inserting_after(placeholders[-1]) if placeholders else gm.graph.inserting_before(None):
        seed = gm.graph.placeholder(SEED_INPUT)
    with like.fake_mode:
        seed.meta["val"] = torch.empty((), dtype=torch.int64, device=like.device)
    for stream, node in enumerate(random_nodes):
        _replace(gm, node, seed, stream)
    gm.meta[SEED_META] = like.device
    gm.graph.lint()
    gm.recompile()
    log.debug("tpu_inductor: %d random op(s) draw on the device from %s", len(random_nodes), SEED_INPUT)
    return gm


def draw_seed(device: torch.device) -> torch.Tensor:
    """One call's seed, from torch's generator for ``device`` (so ``torch.manual_seed`` applies)."""
    return torch.randint(0, 1 << 62, (), dtype=torch.int64, device=device)
