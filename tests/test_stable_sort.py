"""``sort(stable=True)`` and ``argsort(stable=True)`` run on the device with eager's order.

Equal values must come in input order (that is the promise of ``stable``),
NaNs last ascending and first descending, ``-0.0`` equal to ``+0.0``. Values
and indices are compared exactly: values bit for bit (a ``-0.0`` where eager
has ``+0.0`` would be a wrong value), indices as integers.
"""

from __future__ import annotations

import pytest
import torch

import tpu_inductor.report as report

OPTIONS = {"cache": False}


def _values_with_ties() -> torch.Tensor:
    """Five distinct values over 600 positions per row, with NaNs of both
    signs, both zeros and both infinities among them."""
    x = torch.randint(-2, 3, (3, 600), generator=torch.Generator().manual_seed(0)).float()
    x[0, ::7] = float("nan")
    x[0, 3::17] = -float("nan")
    x[1, ::5] = -0.0
    x[1, ::11] = -float("inf")
    x[2, ::13] = float("inf")
    return x


def _as(dtype: torch.dtype) -> torch.Tensor:
    x = _values_with_ties()
    if dtype.is_floating_point:
        return x.to(dtype)
    finite = torch.nan_to_num(x, posinf=7, neginf=-7)
    return (finite.abs() if dtype in (torch.uint8, torch.bool) else finite).to(dtype)


def _bits(t: torch.Tensor) -> torch.Tensor:
    return t if t.dtype == torch.bool else t.view(torch.uint8)


CASES = [(dtype, -1, descending) for dtype in (torch.float32, torch.bfloat16, torch.float16, torch.int32, torch.uint8,
                                               torch.bool) for descending in (False, True)]
CASES.append((torch.float32, 0, True))  # across rows: three values per column


@pytest.mark.parametrize("dtype,dim,descending", CASES, ids=[f"{d}-dim{i}-{'desc' if s else 'asc'}" for d, i, s in CASES])
def test_stable_sort_on_the_device(dtype, dim, descending):
    def stable_sort(x):
        return torch.sort(x, dim=dim, descending=descending, stable=True)

    x = _as(dtype)
    expected = stable_sort(x)
    actual = torch.compile(stable_sort, backend="tpu", options={**OPTIONS, "strict": True})(x)
    assert torch.equal(actual.indices, expected.indices)
    assert torch.equal(_bits(actual.values), _bits(expected.values))
    assert report.current().fallbacks() == []


def test_stable_argsort_inside_a_graph():
    """FlexAttention's block masks: ``argsort(descending=True, stable=True)`` of 0/1 blocks."""

    def ordered_blocks(mask):
        dense = mask.to(torch.int32)
        return dense.sum(-1), torch.argsort(dense, dim=-1, descending=True, stable=True).to(torch.int32)

    mask = torch.rand(2, 4, 8, 8, generator=torch.Generator().manual_seed(1)) > 0.5
    expected = ordered_blocks(mask)
    actual = torch.compile(ordered_blocks, backend="tpu", options={**OPTIONS, "strict": True})(mask)
    torch.testing.assert_close(actual, expected, rtol=0, atol=0)


def test_sixty_four_bit_values_stay_eager_without_a_failed_compile():
    """int64 values need all 64 bits of the key: the op runs eagerly, known
    before any compile (no reproducer, no warning)."""

    def order(x):
        return torch.argsort(x * 2, dim=-1, stable=True) + 1

    x = torch.randint(0, 3, (4, 50))
    actual = torch.compile(order, backend="tpu", options=OPTIONS)(x)
    assert torch.equal(actual, order(x))
    assert {f.op for f in report.current().fallbacks()} == {"aten.sort.stable"}
    assert report.current().repros == []
