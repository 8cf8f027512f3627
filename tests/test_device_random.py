"""Random ops draw on the device from one seed per call (passes/device_random.py).

The numbers are not eager's (as with Inductor's default), so these tests check
what a user relies on: the ops run on the device, the distributions are right,
``torch.manual_seed`` reproduces a run, calls and ops do not repeat each
other, gradients see the same mask as the forward, and ``fallback_random``
gives eager's exact numbers.

Statistical tolerances: with n = 2**16 samples, a mean has a standard error
of std / sqrt(n) (0.0011 for U(0, 1)); the bounds below are 5-8 standard
errors, so a correct generator fails them with probability below 1e-6, while
a wrong distribution (an off-by-one in the bits, a constant, repeated
streams) misses them by far.
"""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

import tpu_inductor.report as report
from tpu_inductor.passes.device_random import random_bits

N = 1 << 16


def on_device(fn, **options):
    return torch.compile(fn, backend="tpu", options={"cache": False, **options})


def assert_on_device() -> None:
    assert report.current().fallbacks() == [] and report.current().islands()


def test_the_device_computes_the_generator_bit_for_bit():
    """int64 multiplication must wrap and shifts must be arithmetic on the
    device as in eager: the same seed gives the same bits both ways."""
    seed = torch.tensor(123456789012345, dtype=torch.int64)
    fn = lambda s: random_bits(s, 3, (4096,))  # noqa: E731
    got = on_device(fn)(seed)
    assert_on_device()
    assert torch.equal(got, fn(seed))
    assert got.unique().numel() == 4096  # no repeated values among 4096 64-bit draws


@pytest.mark.parametrize(
    "name, fn, mean, std",
    [
        ("rand", lambda x: torch.rand(N), 0.5, 1 / math.sqrt(12)),
        ("randn", lambda x: torch.randn(N), 0.0, 1.0),
        ("rand_like", lambda x: torch.rand_like(x), 0.5, 1 / math.sqrt(12)),
        ("randn_like", lambda x: torch.randn_like(x) * 2 + 1, 1.0, 2.0),
        ("uniform_", lambda x: torch.empty_like(x).uniform_(-3, 1), -1.0, 4 / math.sqrt(12)),
        ("normal_", lambda x: torch.empty_like(x).normal_(2.0, 0.5), 2.0, 0.5),
        ("exponential_", lambda x: torch.empty_like(x).exponential_(2.0), 0.5, 0.5),
        ("bernoulli_p", lambda x: torch.bernoulli(torch.full_like(x, 0.25)), 0.25, math.sqrt(0.25 * 0.75)),
        ("bernoulli_float", lambda x: torch.empty_like(x).bernoulli_(0.75), 0.75, math.sqrt(0.25 * 0.75)),
        ("randint", lambda x: torch.randint(3, 7, (N,)).float(), 4.5, math.sqrt((4**2 - 1) / 12)),
    ],
    ids=lambda v: v if isinstance(v, str) else "",
)
def test_distributions(name, fn, mean, std):
    x = torch.zeros(N)
    got = on_device(fn)(x)
    assert_on_device()
    assert got.shape == (N,)
    assert abs(got.mean().item() - mean) < 8 * std / math.sqrt(N)  # 8 standard errors
    assert abs(got.std().item() - std) < 0.03 * std  # >5 standard errors, even for the exponential's tail
    if name in ("rand", "rand_like"):
        assert 0 <= got.min() and got.max() < 1
    if name == "randint":
        assert set(got.unique().tolist()) == {3.0, 4.0, 5.0, 6.0}


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float64])
def test_uniform_in_other_dtypes_stays_below_one(dtype):
    got = on_device(lambda: torch.rand(N, dtype=dtype))()
    assert_on_device()
    assert got.dtype == dtype and 0 <= got.min() and got.max() < 1
    assert abs(got.float().mean().item() - 0.5) < 0.01


def test_manual_seed_reproduces_and_calls_do_not_repeat():
    fn = on_device(lambda x: (torch.rand_like(x), torch.rand_like(x)))
    x = torch.zeros(1024)
    torch.manual_seed(0)
    first, second = fn(x)
    torch.manual_seed(0)
    again, _ = fn(x)
    later, _ = fn(x)
    assert torch.equal(first, again)
    assert not torch.equal(first, second)  # two ops of one graph: two streams
    assert not torch.equal(again, later)  # two calls: two seeds
    assert abs(torch.corrcoef(torch.stack([first, second]))[0, 1]) < 0.1


def test_dropout_in_training_masks_forward_and_backward_alike():
    """The mask the forward drew is the one the backward scales by."""
    model = torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.Dropout(0.25)).train()
    x = torch.randn(128, 64)
    out = on_device(lambda a: model(a))(x)
    assert_on_device()
    out.sum().backward()
    kept = (out != 0).float()
    assert abs(kept.mean().item() - 0.75) < 0.01
    # d out / d bias = mask / (1 - p), summed over the batch.
    torch.testing.assert_close(model[0].bias.grad, (kept / 0.75).sum(0))


def test_rrelu_in_training_draws_its_slopes_on_the_device():
    x = torch.linspace(-1, 1, N)
    out = on_device(lambda a: F.rrelu(a, 0.1, 0.3, training=True))(x)
    assert_on_device()
    slopes = out[: N // 2 - 1] / x[: N // 2 - 1]
    assert 0.1 <= slopes.min() and slopes.max() <= 0.3
    assert abs(slopes.mean().item() - 0.2) < 0.01
    torch.testing.assert_close(out[N // 2 + 1 :], x[N // 2 + 1 :])


def test_dynamic_shapes_draw_on_the_device():
    fn = on_device(lambda x: F.dropout(x, 0.5, training=True) + 1)
    for rows in (300, 301, 517):
        x = torch.ones(rows, 8)
        torch._dynamo.mark_dynamic(x, 0)
        got = fn(x)
        assert got.shape == (rows, 8)
        assert abs((got == 1).float().mean().item() - 0.5) < 0.1
    assert_on_device()


def test_fallback_random_draws_eagers_numbers():
    def f(x, noise):
        out, out_noise = torch.ops.aten.rrelu_with_noise_functional(x, noise, 0.2, 0.5, True)
        return F.dropout(out, 0.3, training=True), out_noise

    x, noise = torch.rand(64, 64) * 2 - 1, torch.rand(64, 64)
    torch.manual_seed(0)
    expected = f(x, noise)
    torch.manual_seed(0)
    torch.testing.assert_close(on_device(f, fallback_random=True)(x, noise), expected, rtol=0, atol=0)
    assert sorted({r.op for r in report.current().fallbacks()}) == [
        "aten.native_dropout.default", "aten.rrelu_with_noise_functional.default"
    ]


def test_multinomial_and_randperm_stay_on_torchs_generator():
    def f(p):
        return torch.multinomial(p, 4), torch.randperm(16)

    p = torch.rand(3, 10)
    torch.manual_seed(0)
    expected = f(p)
    torch.manual_seed(0)
    for got, want in zip(on_device(f)(p), expected):
        assert torch.equal(got, want)
