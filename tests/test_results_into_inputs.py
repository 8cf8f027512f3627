"""An input whose whole new value an island computes (a full sliding-window
cache rolled by a position) gets the device's value as its device copy.

placement/results_into_inputs.py lets an island's call write such a result
into the input and keep the result's buffer as the input's device copy, on a
client that keeps device copies (``zero_copy=False``, a TPU's path). What
could go wrong, checked against eager step by step: a stale device copy (the
next step would read the old window), an output that becomes an alias of the
input, a write that lands while something still reads the old value.
"""

from __future__ import annotations

import pytest
import torch

import tpu_inductor.report as report
from tpu_inductor.runtime.executable import resident_buffers
from tpu_inductor.runtime.platform import get_platform

STEPS = 5
WINDOW = (2, 4, 8, 16)


class RollingWindow(torch.nn.Module):
    """transformers' full sliding-window cache: roll left by one, new row last, copy back."""

    def __init__(self, returns_window: bool = False) -> None:
        super().__init__()
        self.register_buffer("window", torch.zeros(WINDOW))
        self.weight = torch.nn.Parameter(torch.randn(WINDOW[-1], WINDOW[-1]))
        self.returns_window = returns_window

    def forward(self, row: torch.Tensor) -> torch.Tensor:
        new = torch.cat([self.window[:, :, 1:], row], dim=2)
        self.window.copy_(new)
        scores = (self.window @ self.weight).softmax(-1).sum(-2)
        return (scores, new) if self.returns_window else scores


def _run(returns_window: bool, zero_copy: bool):
    torch.manual_seed(0)
    model = RollingWindow(returns_window)
    eager = RollingWindow(returns_window)
    eager.load_state_dict(model.state_dict())
    compiled = torch.compile(model, backend="tpu", options={"cache": False, "zero_copy": zero_copy, "strict": True})
    generator = torch.Generator().manual_seed(1)
    for _ in range(STEPS):
        row = torch.randn(WINDOW[0], WINDOW[1], 1, WINDOW[3], generator=generator)
        with torch.no_grad():
            got, want = compiled(row), eager(row)
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)
        assert torch.equal(model.window, eager.window)
        yield model, got


@pytest.mark.parametrize("zero_copy", [True, False], ids=["zero_copy", "copies"])
def test_a_window_rolled_each_call_matches_eager_and_crosses_once(zero_copy):
    for model, _ in _run(returns_window=False, zero_copy=zero_copy):
        pass
    graph = report.current().graphs[-1]
    assert graph.fallbacks == [] and len(graph.islands) == 1
    # Where memory is shared the copy-back stays (it costs less there).
    assert graph.inputs_written_in_place == (0 if zero_copy else 1)
    if not zero_copy:
        # Uploaded at the first call; every later call kept the device's new window.
        uploads = resident_buffers(get_platform("cpu", zero_copy=False)).uploads[id(model.window)]
        assert uploads == 1


def test_a_new_value_also_returned_to_the_caller_is_not_the_input():
    """The graph returns the new window as an output too: that output must stay
    a tensor of its own (in eager it is), not become the buffer itself."""
    for model, (_, new) in _run(returns_window=True, zero_copy=False):
        assert new.data_ptr() != model.window.data_ptr()
        before = model.window.clone()
        new.zero_()
        assert torch.equal(model.window, before)
