"""The timm sweep's verdict (benchmarks/timm_sweep.py), without timm.

A result is judged as PyTorch's Dynamo benchmarks judge one: its error
against float64 may be 2x eager float32's (3x for small tensors) plus a
floor, eager's error being its worst over the input as given and copies
moved by an ulp. A looser rule would hide a wrong op in a deep network, a
stricter one would call rounding a bug; a gradient the backend lost must fail.
"""

from __future__ import annotations

import torch

from benchmarks.timm_sweep import _multiplier, _varied, allowed_errors, errors, moved_by_an_ulp, verdict


def _allowed(eager: dict, reference: dict) -> dict:
    return allowed_errors(reference, [errors(eager, reference)])


def test_within_twice_eager_float32s_error_passes_and_beyond_fails():
    reference = {"weight": torch.ones(2000, dtype=torch.float64)}
    eager = {"weight": reference["weight"] + 1e-3}
    allowed = _allowed(eager, reference)
    assert verdict(errors({"weight": reference["weight"] + 1.9e-3}, reference), allowed) == []
    wrong = verdict(errors({"weight": reference["weight"] + 2.1e-3}, reference), allowed)
    assert len(wrong) == 1 and wrong[0].startswith("weight:")


def test_small_tensors_and_1x1_kernels_get_three_times():
    assert _multiplier(torch.ones(999)) == 3.0
    assert _multiplier(torch.ones(64, 64, 1, 1)) == 3.0
    assert _multiplier(torch.ones(64, 64, 3, 3)) == 2.0
    reference = {"bias": torch.zeros(10, dtype=torch.float64)}
    allowed = _allowed({"bias": reference["bias"] + 1e-3}, reference)
    assert verdict(errors({"bias": reference["bias"] + 2.9e-3}, reference), allowed) == []


def test_a_missing_or_misshapen_gradient_fails():
    reference = {"loss": torch.ones(1, dtype=torch.float64), "weight": torch.ones(4, dtype=torch.float64)}
    allowed = _allowed(dict(reference), reference)
    assert [w.split(":")[0] for w in verdict(errors({"loss": reference["loss"]}, reference), allowed)] == ["weight"]
    misshapen = {"loss": reference["loss"], "weight": torch.ones(2, 2, dtype=torch.float64)}
    assert len(verdict(errors(misshapen, reference), allowed)) == 1


def test_constants_vary_around_their_value():
    """A constant gain stays centred on its value (raising every BatchNorm gain
    compounded through inception_v3); a zero one varies around zero, so its
    branch shows; a mask's -inf stays -inf."""
    gains = _varied(torch.ones(10_000))
    assert gains.std() > 0 and 0.9 <= gains.min() and gains.max() <= 1.1 and abs(gains.mean() - 1) < 0.01
    zeros = _varied(torch.zeros(10_000))
    assert zeros.std() > 0 and zeros.abs().max() <= 0.1 and abs(zeros.mean()) < 0.01
    negative = _varied(torch.full((100,), -2.0))
    assert (negative <= -1.8).all() and (negative >= -2.2).all()
    assert torch.equal(_varied(torch.full((3,), float("-inf"))), torch.full((3,), float("-inf")))


def test_the_bound_follows_eager_float32s_worst_draw():
    """Eager's error on an input moved by an ulp counts as much as on the
    input as given: the bound follows the worse of the two."""
    reference = {"weight": torch.ones(2000, dtype=torch.float64)}
    lucky, unlucky = reference["weight"] + 1e-4, reference["weight"] + 1e-3
    allowed = allowed_errors(reference, [errors({"weight": lucky}, reference), errors({"weight": unlucky}, reference)])
    assert verdict(errors({"weight": reference["weight"] + 1.9e-3}, reference), allowed) == []
    assert len(verdict(errors({"weight": reference["weight"] + 2.1e-3}, reference), allowed)) == 1


def test_moving_by_an_ulp_moves_each_element_at_most_one_float():
    inputs = torch.randn(3000)
    moved = moved_by_an_ulp(inputs, seed=0)
    up, down = torch.nextafter(inputs, torch.tensor(torch.inf)), torch.nextafter(inputs, torch.tensor(-torch.inf))
    assert ((moved == inputs) | (moved == up) | (moved == down)).all()
    for kept_or_moved in (moved == inputs, moved == up, moved == down):
        assert 800 < int(kept_or_moved.sum()) < 1200  # a third each
    assert torch.equal(moved, moved_by_an_ulp(inputs, seed=0)) and not torch.equal(moved, moved_by_an_ulp(inputs, seed=1))
