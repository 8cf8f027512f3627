"""Model suite: standard small models compiled with ``backend="tpu"`` vs eager.

For each model in :data:`models.MODELS` (MLP, CNN with BatchNorm, GPT-style
decoder, embedding + conv1d classifier, ViT):

* inference (eval mode, ``torch.no_grad``) matches eager;
* one training step (``loss.backward()``) gives the same loss and gradients as
  an identical deep copy run eagerly;
* the backend actually ran the model on the device: every graph it compiled
  has islands and no op fell back to eager.

Then 20-step SGD and AdamW loops for the MLP and for the CNN in train mode:
losses track eager step by step, and the parameters and BatchNorm running
statistics (mutated inputs of the forward graph) match eager afterwards.

Tolerances. Everything is float32. XLA's CPU dot/conv kernels and its fused
reductions sum in a different order than ATen's (oneDNN/MKL, blocked
reductions), so single results differ by a few ULPs of the accumulated
magnitude; measured differences here are <= 1e-6 on values of order 1.
rtol=1e-4, atol=1e-5 leaves two orders of margin for one step while still
catching any semantic error (a wrong mask, a missed mutation, a stale weight
or a wrong saved activation all show up as 1e-2 or more). Over 20 optimizer
steps those rounding differences feed back through the weights (AdamW
divides by sqrt(v), which amplifies tiny gradient differences early on), so
the loops allow rtol=1e-3, atol=1e-4 (measured drift today: <= 2e-7
relative on losses, <= 2e-6 absolute on parameters and BatchNorm buffers).
"""

from __future__ import annotations

import copy
import dataclasses

import pytest
import torch

import tpu_inductor.report as report

from models import MODELS  # tests/ is on sys.path (pytest rootdir-relative import)

SINGLE_STEP = dict(rtol=1e-4, atol=1e-5)
LOOP = dict(rtol=1e-3, atol=1e-4)
LOOP_STEPS = 20

# conftest.py's autouse fixture resets Dynamo and tpu_inductor.report around
# every test, so each test's report holds only its own graphs.


def _options(cache_dir) -> dict:
    # A private cache directory per compile region: no files in ~/.cache, and
    # a private support table, so an op learned unsupported in one test does
    # not silently move ops to eager in another. eager_kernels off: these tests
    # hold the device's lowering (conv included) to eager's numbers, and the
    # partition must not depend on a timing (tests/test_kernel_choice.py).
    return {"cache_dir": str(cache_dir), "eager_kernels": False}


def _compile(model, cache_dir):
    return torch.compile(model, backend="tpu", options=_options(cache_dir))


def _describe_fallbacks(graphs) -> str:
    return "\n".join(
        f"  {g.kind} graph {g.graph_id}: {f.op} ({f.reason}) at {f.source}"
        for g in graphs
        for f in g.fallbacks
    )


def _assert_ran_on_device(graphs, kinds) -> None:
    """Every graph of the given kinds was compiled into device islands, none fell back."""
    graphs = [g for g in graphs if g.kind in kinds]
    assert {g.kind for g in graphs} == set(kinds), f"expected {kinds} graphs, got {graphs}"
    for g in graphs:
        assert g.islands, f"{g.kind} graph {g.graph_id} has no device islands"
    assert not any(g.fallbacks for g in graphs), (
        "ops ran eagerly instead of on the device:\n" + _describe_fallbacks(graphs)
    )


# --------------------------------------------------------------------------- inference


@pytest.mark.parametrize("name", MODELS)
def test_inference_matches_eager(name, tmp_path):
    model, inputs, _, _ = MODELS[name]()
    model.eval()
    compiled = _compile(model, tmp_path)
    with torch.no_grad():
        expected = model(*inputs)
        actual = compiled(*inputs)
        again = compiled(*inputs)  # second call: cached executable, same answer
    torch.testing.assert_close(actual, expected, **SINGLE_STEP)
    torch.testing.assert_close(again, actual, rtol=0, atol=0)
    _assert_ran_on_device(report.current().graphs, kinds=("inference",))


@pytest.mark.parametrize("name", MODELS)
def test_inference_through_copies_matches_eager(name, tmp_path):
    """The path a TPU always takes (``zero_copy=False``): inputs copied in,
    parameters uploaded once and kept resident on the device."""
    from tpu_inductor.runtime import executable, platform

    model, inputs, _, _ = MODELS[name]()
    model.eval()
    compiled = torch.compile(model, backend="tpu", options={**_options(tmp_path), "zero_copy": False})
    with torch.no_grad():
        expected = model(*inputs)
        for _ in range(3):
            torch.testing.assert_close(compiled(*inputs), expected, **SINGLE_STEP)
    _assert_ran_on_device(report.current().graphs, kinds=("inference",))
    resident = executable.resident_buffers(platform.get_platform("cpu", zero_copy=False))
    uploads = [resident.uploads[id(p)] for p in model.parameters()]
    assert max(uploads) == 1, f"parameters uploaded more than once in 3 calls: {uploads}"


# --------------------------------------------------------------------------- one training step


@dataclasses.dataclass
class TrainingStep:
    eager: torch.nn.Module
    compiled: torch.nn.Module
    eager_loss: torch.Tensor
    compiled_loss: torch.Tensor
    graphs: list


_training_steps: dict[str, TrainingStep] = {}


def _training_step(name, tmp_path_factory) -> TrainingStep:
    """One forward + backward per model, shared by the numeric and device tests."""
    if name not in _training_steps:
        torch._dynamo.reset()
        report.reset()
        model, inputs, targets, loss_fn = MODELS[name]()
        model.train()
        eager, module = copy.deepcopy(model), copy.deepcopy(model)
        compiled = _compile(module, tmp_path_factory.mktemp(f"cache_{name}"))
        eager_loss = loss_fn(eager(*inputs), targets)
        eager_loss.backward()
        compiled_loss = loss_fn(compiled(*inputs), targets)
        compiled_loss.backward()
        _training_steps[name] = TrainingStep(
            eager, module, eager_loss.detach(), compiled_loss.detach(),
            list(report.current().graphs),
        )
    return _training_steps[name]


@pytest.mark.parametrize("name", MODELS)
def test_training_gradients_match_eager(name, tmp_path_factory):
    step = _training_step(name, tmp_path_factory)
    torch.testing.assert_close(step.compiled_loss, step.eager_loss, **SINGLE_STEP)
    eager_params = dict(step.eager.named_parameters())
    for pname, param in step.compiled.named_parameters():
        expected = eager_params[pname].grad
        assert param.grad is not None, f"{pname}: no gradient"
        torch.testing.assert_close(param.grad, expected, **SINGLE_STEP, msg=lambda m: f"{pname}.grad: {m}")
    # Train-mode BatchNorm updates its running statistics in the forward graph.
    eager_buffers = dict(step.eager.named_buffers())
    for bname, buf in step.compiled.named_buffers():
        torch.testing.assert_close(buf, eager_buffers[bname], **SINGLE_STEP, msg=lambda m: f"{bname}: {m}")


@pytest.mark.parametrize("name", MODELS)
def test_training_runs_on_device(name, tmp_path_factory):
    step = _training_step(name, tmp_path_factory)
    _assert_ran_on_device(step.graphs, kinds=("forward", "backward"))


# --------------------------------------------------------------------------- 20-step loops


def _optimizer(kind: str, params):
    if kind == "sgd":
        return torch.optim.SGD(params, lr=0.05, momentum=0.9)
    return torch.optim.AdamW(params, lr=1e-2, weight_decay=0.01)


def _batches(name: str, steps: int, distinct: int = 4):
    """``steps`` batches cycling over ``distinct`` fixed ones (learnable: the loss falls)."""
    batches = [MODELS[name](seed=1000 + i)[1:3] for i in range(distinct)]
    return [batches[step % distinct] for step in range(steps)]


@pytest.mark.parametrize("optim", ["sgd", "adamw"])
@pytest.mark.parametrize("name", ["mlp", "cnn"])
def test_training_loop_tracks_eager(name, optim, tmp_path):
    model, _, _, loss_fn = MODELS[name]()
    model.train()
    eager, module = copy.deepcopy(model), copy.deepcopy(model)
    tracked_before = {k: int(v) for k, v in model.named_buffers() if k.endswith("num_batches_tracked")}
    compiled = _compile(module, tmp_path)
    opt_eager = _optimizer(optim, eager.parameters())
    opt_compiled = _optimizer(optim, module.parameters())

    eager_losses, compiled_losses = [], []
    for inputs, targets in _batches(name, LOOP_STEPS):
        for net, opt, losses in (
            (eager, opt_eager, eager_losses),
            (compiled, opt_compiled, compiled_losses),
        ):
            opt.zero_grad(set_to_none=True)
            loss = loss_fn(net(*inputs), targets)
            loss.backward()
            opt.step()  # eager optimizer updates the compiled model's parameters in place
            losses.append(loss.item())

    torch.testing.assert_close(
        torch.tensor(compiled_losses), torch.tensor(eager_losses), **LOOP,
        msg=lambda m: f"per-step losses diverge: {m}",
    )
    # Sanity check of the test itself: the loop trains (the last pass over the
    # four batches has a lower loss than the first).
    assert sum(eager_losses[-4:]) < sum(eager_losses[:4]), eager_losses
    for (pname, p_compiled), p_eager in zip(module.named_parameters(), eager.parameters()):
        torch.testing.assert_close(p_compiled, p_eager, **LOOP, msg=lambda m: f"{pname}: {m}")
    # BatchNorm running_mean / running_var / num_batches_tracked are mutated
    # inputs of the compiled forward graph: they must have been written back.
    buffers = dict(module.named_buffers())
    for bname, b_eager in eager.named_buffers():
        torch.testing.assert_close(buffers[bname], b_eager, **LOOP, msg=lambda m: f"{bname}: {m}")
    for bname, before in tracked_before.items():
        assert int(buffers[bname]) == before + LOOP_STEPS, bname

    graphs = report.current().graphs
    # Parameters change in place every step; that must not cause recompiles.
    assert [g.kind for g in graphs].count("forward") == 1, [g.kind for g in graphs]
    assert [g.kind for g in graphs].count("backward") == 1, [g.kind for g in graphs]
    assert all(g.islands for g in graphs), "a graph of the loop ran no device islands"
    # Op coverage of these same graphs is asserted by test_training_runs_on_device;
    # here the forward graph (BatchNorm's in-place buffer updates) must be on device.
    assert not any(g.fallbacks for g in graphs if g.kind == "forward"), _describe_fallbacks(graphs)
