"""An input grown by ``cat`` in a padded graph stays on the device between calls
(passes/grown_caches.py, dynamic/device_caches.py), on a client that keeps
device copies (``zero_copy=False``: a TPU's path), and only where that is safe.

Each test feeds the grown output back as the next call's input, as a decode
loop does with its cache, and compares every step with eager.
"""

from __future__ import annotations

import pytest
import torch

import tpu_inductor.report as report
from tpu_inductor.runtime import transfer


@pytest.fixture
def uploads(monkeypatch, tmp_path):
    monkeypatch.setenv("TPU_INDUCTOR_CACHE_DIR", str(tmp_path))
    monkeypatch.setenv("TPU_INDUCTOR_ZERO_COPY", "0")
    shapes: list[tuple[int, ...]] = []
    upload = transfer.upload
    monkeypatch.setattr(transfer, "upload", lambda t, device: (shapes.append(tuple(t.shape)), upload(t, device))[1])
    return shapes


def _grow(step, steps: int = 12):
    """Call ``step(cache, new)`` ``steps`` times, compiled and eager, growing the cache each time."""
    compiled = torch.compile(step, backend="tpu", dynamic=True)
    cache = torch.randn(2, 3, 4)
    expected = got = cache
    for index in range(steps):
        new = torch.randn(2, 1, 4) + index
        expected, expected_other = step(expected, new)
        got, other = compiled(got, new)
        torch.testing.assert_close(got, expected, rtol=0, atol=0)
        torch.testing.assert_close(other, expected_other)
    return got


def _cache_uploads(shapes: list[tuple[int, ...]]) -> list[int]:
    return [shape[1] for shape in shapes if len(shape) == 3 and shape[0] == 2 and shape[2] == 4 and shape[1] > 1]


def test_a_cache_grown_by_cat_goes_up_once_per_bucket(uploads):
    def step(cache, new):
        grown = torch.cat([cache, new], dim=1)
        return grown, grown * 2  # read on the device, position by position: padding-safe

    _grow(step)
    # Lengths 3..14 in powers of two: the first call is traced static, then 4, 8 and 16.
    assert _cache_uploads(uploads) == [4, 8, 16]
    assert [g.caches_kept_on_device for g in report.current().graphs if g.caches_kept_on_device] == [1]


def test_a_cache_read_outside_the_cat_is_not_kept(uploads):
    def step(cache, new):
        return torch.cat([cache, new], dim=1), cache * 3  # the old cache is an output of its own

    _grow(step)
    assert not [g for g in report.current().graphs if g.caches_kept_on_device]
    assert len(_cache_uploads(uploads)) >= 9  # every padded call uploads it


def test_a_cache_whose_length_is_not_padded_is_not_kept(uploads):
    def step(cache, new):
        grown = torch.cat([cache, new], dim=1)
        return grown, grown.softmax(dim=1)  # a reduction over the length: compiled at exact sizes

    _grow(step, steps=4)
    assert not [g for g in report.current().graphs if g.caches_kept_on_device]
