"""The sweeps' verdict on half-precision misses (benchmarks/sweep_common.py,
used by the OpInfo and ModuleInfo sweeps).

A bfloat16/float16 output outside eager's tolerance passes when it is no
further than eager (plus one ulp) from the op computed in float32 on the same
inputs: eager rounds too, and on some ops (oneDNN's convolutions, a batch
norm's statistics) it is the further of the two. A device result further
from float32 than eager, or an overflow eager does not have, still fails.

The ModuleInfo sweep's second verdict, for whole modules (attention,
recurrent cells, losses) whose single elements cancel to near zero:
PyTorch's own accuracy check for Inductor (root-mean-square error against
float32 at most 3x eager's).
"""

from __future__ import annotations

import torch

from benchmarks.opinfo_sweep import _as_close_to_float32_as_eager
from benchmarks.sweep_common import float32_verdict, judge_against_exact, rmse_verdict


def _mean_of_squares(x: torch.Tensor) -> torch.Tensor:
    return (x * x).mean(-1)


X = torch.linspace(0.5, 2.0, 64).reshape(4, 16).to(torch.float16)
IN_FLOAT32 = _mean_of_squares(X.float())


def test_a_result_closer_to_float32_than_eager_passes_with_a_note():
    eager = (IN_FLOAT32 * (1 + 8 * 2.0**-10)).to(torch.float16)  # eight ulps off
    device = IN_FLOAT32.to(torch.float16)  # rounded once
    note = _as_close_to_float32_as_eager(_mean_of_squares, [X], device, eager)
    assert note is not None and note.startswith("against float32")


def test_a_result_further_from_float32_than_eager_fails():
    eager = IN_FLOAT32.to(torch.float16)
    device = (IN_FLOAT32 * (1 + 4 * 2.0**-10)).to(torch.float16)
    assert _as_close_to_float32_as_eager(_mean_of_squares, [X], device, eager) is None


def test_an_overflow_fails_and_float32_outputs_are_not_judged_here():
    eager = IN_FLOAT32.to(torch.float16)
    device = torch.full_like(eager, float("inf"))
    assert _as_close_to_float32_as_eager(_mean_of_squares, [X], device, eager) is None
    assert _as_close_to_float32_as_eager(_mean_of_squares, [X.float()], IN_FLOAT32 + 1, IN_FLOAT32) is None


def test_the_other_outputs_must_still_match_eager():
    """A close half output does not pass a sample whose integer (or float32) output differs."""
    half = IN_FLOAT32.to(torch.float16)
    indices = torch.arange(4)
    assert float32_verdict((half, indices), (half, indices), (IN_FLOAT32, indices)) is not None
    assert float32_verdict((half, indices + 1), (half, indices), (IN_FLOAT32, indices)) is None
    assert float32_verdict((half, IN_FLOAT32 + 1), (half, IN_FLOAT32), (IN_FLOAT32, IN_FLOAT32)) is None


GRADIENT = torch.linspace(-1.0, 1.0, 257)[:-1].reshape(16, 16)  # holds values next to zero


def test_a_module_nearer_float32_overall_passes_by_rmse_where_one_element_stands_off():
    """Where float32's element is zero (a gradient that cancels), the device
    lands four ulps of the tensor's largest value off and eager exactly on it:
    per element that is far past eager; over the tensor the device is nearer
    float32 than eager, which is two ulps off everywhere else."""
    eager = (GRADIENT * (1 + 2 * 2.0**-10)).to(torch.float16)  # two ulps off everywhere
    device = GRADIENT.to(torch.float16)
    device[8, 0] = 4 * 2.0**-10  # float32 holds 0 there: 3.9x the verdict's floor (1e-3 of the largest value)
    assert float32_verdict(device, eager, GRADIENT) is None
    note = rmse_verdict(device, eager, GRADIENT)
    assert note is not None and note.startswith("against float32 by RMSE")


def test_a_module_further_than_three_times_eager_fails_by_rmse():
    eager = GRADIENT.to(torch.float16)
    device = (GRADIENT * (1 + 16 * 2.0**-10)).to(torch.float16)  # every element 16 ulps off
    assert rmse_verdict(device, eager, GRADIENT) is None


def test_rmse_verdict_still_needs_the_other_outputs_to_match_eager():
    half = GRADIENT.to(torch.float16)
    indices = torch.arange(4)
    assert rmse_verdict((half, indices), (half, indices), (GRADIENT, indices)) is not None
    assert rmse_verdict((half, indices + 1), (half, indices), (GRADIENT, indices)) is None


def test_small_values_are_judged_relative_to_their_size_where_eager_resolves_them():
    """A deep layer's gradient of RMS 5e-5, eager 2% off and the device 25%
    off (an expert that a flipped routing decision fed other tokens):
    PyTorch's check alone passes it (its floors are absolute); here it fails.
    A gradient that cancels to zero, eager's exactly 0 and the device's
    rounding noise, still passes by the absolute floor."""
    generator = torch.Generator().manual_seed(0)
    exact = torch.randn(256, generator=generator, dtype=torch.float64) * 5e-5
    noise = torch.randn(256, generator=generator, dtype=torch.float64)
    eager = (exact * (1 + 0.02 * noise)).to(torch.bfloat16)
    device = (exact * (1 + 0.25 * noise)).to(torch.bfloat16)
    assert judge_against_exact(eager, eager, exact, tol=1e-2).problem is None
    assert judge_against_exact(eager, device, exact, tol=1e-2).problem is not None
    cancelled = exact * 1e-3  # float32's rounding of a zero gradient
    zero, rounding_noise = torch.zeros(256, dtype=torch.float16), (noise * 1e-5).half()
    assert judge_against_exact(zero, rounding_noise, cancelled, tol=1e-3).problem is None
