"""Foreach ops on the device (decompositions/foreach_ops.py): PyTorch's own
foreach OpInfo samples, gradient clipping and a foreach optimizer, each
checked against eager and for running with no op in eager."""

from __future__ import annotations

import pytest
import torch
from torch.testing._internal.common_methods_invocations import (
    foreach_binary_op_db,
    foreach_other_op_db,
    foreach_pointwise_op_db,
    foreach_reduce_op_db,
    foreach_unary_op_db,
)

import tpu_inductor.report as report

# The path a TPU takes: on the CPU client's zero-copy path a graph of
# elementwise in-place updates runs in place in eager (analysis/in_place_updates.py).
DEVICE_PATH = {"cache": False, "zero_copy": False, "eager_kernels": False}

NOT_ON_THE_DEVICE = {
    "_foreach_erfc": "erfc has no StableHLO lowering (as the plain op)",
    "_foreach_lgamma": "lgamma has no StableHLO lowering (as the plain op)",
    "_foreach_max": "Dynamo does not trace it (graph break)",
    "_foreach_mm": "Dynamo does not trace it (graph break)",
    "_foreach_clone": "clones of the inputs: nothing to compute",
}
FOREACH_OPS = [
    op
    for op in foreach_unary_op_db + foreach_binary_op_db + foreach_pointwise_op_db + foreach_reduce_op_db + foreach_other_op_db
    if op.name not in NOT_ON_THE_DEVICE
]


def _samples(op):
    """The op's float32 samples over two tensors, but a bool scalar (``clamp``
    with ``True`` as its bound does not lower, foreach or not)."""
    for sample in op.sample_inputs("cpu", torch.float32, num_input_tensors=[2]):
        if not any(isinstance(a, bool) for a in sample.args):
            yield sample


def _on_device(fn, *args, **kwargs):
    got = torch.compile(fn, backend="tpu", options=DEVICE_PATH)(*args, **kwargs)
    assert report.current().fallbacks() == [] and report.current().islands()
    return got


@pytest.mark.parametrize("op", FOREACH_OPS, ids=lambda op: op.name)
def test_foreach_op_runs_on_the_device(op):
    samples = list(_samples(op))[:1]
    assert samples
    for sample in samples:
        torch._dynamo.reset()
        report.reset()
        fn = lambda tensors, *args, **kwargs: op.op(tensors, *args, **kwargs)  # noqa: E731
        expected = fn(sample.input, *sample.args, **sample.kwargs)
        got = _on_device(fn, sample.input, *sample.args, **sample.kwargs)
        # One per-tensor op per tensor, as eager's slow path computes it:
        # torch's float32 defaults (rtol 1.3e-6, atol 1e-5) for a few ulps.
        torch.testing.assert_close(got, expected, equal_nan=True)


def _model_and_twin():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.Tanh(), torch.nn.Linear(32, 4))
    twin = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.Tanh(), torch.nn.Linear(32, 4))
    twin.load_state_dict(model.state_dict())
    return model, twin


def test_gradient_clipping_runs_on_the_device():
    """``clip_grad_norm_`` takes its foreach path for CPU tensors
    (``_foreach_norm``, ``_foreach_mul``)."""
    model, twin = _model_and_twin()
    x = torch.randn(8, 16)
    for m in (model, twin):
        m(x).pow(2).mean().backward()

    def clip(parameters):
        return torch.nn.utils.clip_grad_norm_(parameters, 0.05)

    got = _on_device(clip, list(model.parameters()))
    expected = clip(list(twin.parameters()))
    torch.testing.assert_close(got, expected)
    assert expected > 0.05  # the clip scaled every gradient
    for p, q in zip(model.parameters(), twin.parameters()):
        torch.testing.assert_close(p.grad, q.grad)


def test_foreach_adam_step_runs_on_the_device():
    model, twin = _model_and_twin()
    optimizers = [torch.optim.Adam(m.parameters(), lr=1e-2, foreach=True) for m in (model, twin)]
    x = torch.randn(8, 16)
    for m in (model, twin):
        m(x).pow(2).mean().backward()
    _on_device(optimizers[0].step)
    optimizers[1].step()
    for p, q in zip(model.parameters(), twin.parameters()):
        # Adam divides by sqrt(v) + eps: a gradient of ~1e-7 makes the
        # update sensitive to the last bit of v, a few float32 ulps of p.
        torch.testing.assert_close(p, q, rtol=1e-5, atol=1e-6)
