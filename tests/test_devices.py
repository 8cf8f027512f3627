"""Device selection and the copy path used where memory is not shared (TPU).

The copy path is exercised on the CPU client with ``zero_copy=False``: tensors
are uploaded, parameters stay resident on the device across calls and are
re-uploaded only after an in-place update. Results are compared with eager at
float32 defaults (identical ops, only the transfer differs).
"""

from __future__ import annotations

import copy

import pytest
import torch

from tpu_inductor.config import Config
from tpu_inductor.runtime import executable, platform as platform_module
from tpu_inductor.runtime.platform import select_platform

COPY_OPTIONS = {"cache": False, "zero_copy": False, "platform": "cpu"}


@pytest.fixture
def fake_platforms(monkeypatch):
    """Pretend libtpu / jax's CUDA plugin are (not) present."""

    def install(tpu: bool, cuda_plugin: bool) -> None:
        monkeypatch.setattr(platform_module, "_tpu_available", lambda: tpu)
        monkeypatch.setattr(platform_module, "_cuda_plugin_installed", lambda: cuda_plugin)

    return install


class FakeCudaTensor(torch.Tensor):
    """Reports a CUDA device without one: selection only reads ``.device``."""

    @property
    def device(self):
        return torch.device("cuda", 0)


def test_explicit_platform_wins(fake_platforms):
    fake_platforms(tpu=True, cuda_plugin=True)
    assert select_platform("cpu", [torch.randn(2)]) == "cpu"


def test_tpu_preferred_when_libtpu_finds_one(fake_platforms):
    fake_platforms(tpu=True, cuda_plugin=True)
    assert select_platform(None, [torch.randn(2)]) == "tpu"


def test_cuda_for_cuda_inputs_with_plugin(fake_platforms):
    fake_platforms(tpu=False, cuda_plugin=True)
    cuda_input = torch.randn(2).as_subclass(FakeCudaTensor)
    assert select_platform(None, [cuda_input]) == "cuda"
    assert select_platform(None, [torch.randn(2)]) == "cpu"


def test_cuda_inputs_without_plugin_stay_on_cpu(fake_platforms):
    fake_platforms(tpu=False, cuda_plugin=False)
    assert select_platform(None, [torch.randn(2).as_subclass(FakeCudaTensor)]) == "cpu"


def test_auto_and_unset_are_the_same():
    assert Config.load({"platform": "auto"}, environ={}).platform is None
    assert Config.load({}, environ={"TPU_INDUCTOR_PLATFORM": "cuda"}).platform == "cuda"


def make_mlp(seed: int = 0) -> torch.nn.Module:
    torch.manual_seed(seed)
    layers = []
    for _ in range(4):
        layers += [torch.nn.Linear(32, 32), torch.nn.ReLU()]
    return torch.nn.Sequential(*layers)


def uploads_per_parameter(model: torch.nn.Module) -> list[int]:
    resident = executable.resident_buffers(platform_module.get_platform("cpu", zero_copy=False))
    return [resident.uploads[id(p)] for p in model.parameters()]


def test_an_upload_is_a_copy_on_the_cpu_client_too():
    """``zero_copy=False`` stands in for an accelerator's path, so an upload
    must be a copy there too: jax's CPU client aliased an aligned array's
    memory, and a device copy kept past a write would then have read as
    current in every test of this file."""
    import numpy as np

    from tpu_inductor.runtime import transfer

    tensor = torch.ones(1024)
    uploaded = transfer.upload(tensor, platform_module.get_platform("cpu", zero_copy=False).device)
    tensor.mul_(2)
    assert np.asarray(uploaded).tolist() == [1.0] * 1024


def test_parameters_upload_once_across_100_calls():
    model = make_mlp()
    compiled = torch.compile(model, backend="tpu", options=COPY_OPTIONS)
    with torch.no_grad():
        for step in range(100):
            x = torch.randn(8, 32)
            torch.testing.assert_close(compiled(x), model(x))
    assert uploads_per_parameter(model) == [1] * 8


def test_optimizer_step_reuploads_exactly_the_changed_parameters():
    model = make_mlp()
    reference = make_mlp()
    compiled = torch.compile(model, backend="tpu", options=COPY_OPTIONS)
    # Only the last layer trains: the optimizer writes exactly those two tensors.
    trained = list(model[-2].parameters())
    optimizer = torch.optim.SGD(trained, lr=0.1)
    reference_optimizer = torch.optim.SGD(list(reference[-2].parameters()), lr=0.1)
    x = torch.randn(8, 32)
    for _ in range(3):
        optimizer.zero_grad()
        compiled(x).square().mean().backward()
        optimizer.step()
        reference_optimizer.zero_grad()
        reference(x).square().mean().backward()
        reference_optimizer.step()
    torch.testing.assert_close(compiled(x), reference(x))
    counts = dict(zip([id(p) for p in model.parameters()], uploads_per_parameter(model)))
    for parameter in model.parameters():
        changed = any(parameter is p for p in trained)
        # 3 steps: first upload, then one per in-place update, then the final call.
        assert counts[id(parameter)] == (4 if changed else 1)


def test_a_saved_activation_stays_on_the_device_for_the_backward(monkeypatch):
    """The forward's results keep their device buffers as their device
    copies: the backward reads the activations the forward saved without an
    upload. Trains against eager."""
    from tpu_inductor.runtime import transfer

    uploaded: list[tuple[int, ...]] = []
    upload = transfer.upload
    monkeypatch.setattr(transfer, "upload", lambda t, device: (uploaded.append(tuple(t.shape)), upload(t, device))[1])
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 16))
    reference = copy.deepcopy(model)
    compiled = torch.compile(model, backend="tpu", options=COPY_OPTIONS)
    x = torch.randn(8, 32)
    for _ in range(3):
        for m in (compiled, reference):
            m(x).square().mean().backward()
            with torch.no_grad():
                for p in m.parameters():
                    p -= 0.1 * p.grad
                    p.grad = None
    for got, expected in zip(model.parameters(), reference.parameters()):
        torch.testing.assert_close(got, expected)
    assert uploaded.count((8, 32)) == 1  # the input, once
    assert uploaded.count((8, 64)) == 0, uploaded  # the saved activation never crosses back


def test_in_place_buffer_update_is_reuploaded():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(6, 6), torch.nn.BatchNorm1d(6))
    reference = torch.nn.Sequential(torch.nn.Linear(6, 6), torch.nn.BatchNorm1d(6))
    reference.load_state_dict(model.state_dict())
    compiled = torch.compile(model, backend="tpu", options=COPY_OPTIONS)
    for _ in range(3):  # train mode: BatchNorm updates its running stats in place
        x = torch.randn(10, 6)
        torch.testing.assert_close(compiled(x), reference(x))
    torch.testing.assert_close(model[1].running_mean, reference[1].running_mean)
    model.eval(), reference.eval()
    x = torch.randn(10, 6)
    with torch.no_grad():
        # Eval reads the updated running stats: a stale device copy would differ.
        torch.testing.assert_close(compiled(x), reference(x))
    resident = executable.resident_buffers(platform_module.get_platform("cpu", zero_copy=False))
    assert resident.uploads[id(model[1].running_mean)] >= 2
