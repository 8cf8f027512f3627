"""The CPU client's call path: argument views kept between calls, outputs
through C++ result handlers (runtime/transfer.py ``HostViews``)."""

from __future__ import annotations

import gc

import pytest
import torch
from torch.fx.experimental.proxy_tensor import make_fx

from tpu_inductor.lowering.stablehlo import lower_to_stablehlo
from tpu_inductor.runtime import DeviceExecutable, compile_stablehlo, get_platform


def _executable(fn, *examples: torch.Tensor) -> DeviceExecutable:
    platform = get_platform("cpu")
    lowered = lower_to_stablehlo(make_fx(fn)(*examples))
    loaded, _ = compile_stablehlo(lowered.module, platform, None, input_specs=lowered.input_specs)
    return DeviceExecutable(loaded, platform, lowered.output_specs, "test", lowered.input_specs)


def _weighted(x: torch.Tensor, w: torch.Tensor) -> tuple[torch.Tensor]:
    return (x @ w + 1,)


def _kept(executable: DeviceExecutable, position: int):
    entry = executable._host_views._kept[position]
    return None if entry is None else entry[2]


def test_same_tensor_reuses_its_view_and_sees_in_place_updates():
    x, w = torch.randn(4, 8), torch.randn(8, 3)
    executable = _executable(_weighted, x, w)
    (first,) = executable(x, w)
    torch.testing.assert_close(first, x @ w + 1)
    kept = _kept(executable, 1)
    assert kept is not None and kept.unsafe_buffer_pointer() == w.data_ptr()
    with torch.no_grad():
        w.mul_(2)  # an optimizer step: same tensor, same memory
    (second,) = executable(x, w)
    assert _kept(executable, 1) is kept
    torch.testing.assert_close(second, x @ w + 1)


def test_data_swap_makes_a_new_view():
    x, w = torch.randn(4, 8), torch.nn.Parameter(torch.randn(8, 3))
    executable = _executable(_weighted, x, w.detach())
    executable(x, w)
    w.data = torch.randn(8, 3)
    (out,) = executable(x, w)
    torch.testing.assert_close(out, x @ w.detach() + 1)


def test_non_contiguous_inputs_are_read_in_their_logical_order():
    # A transposed weight was once read as its row-major bytes (a wrong number).
    x, w = torch.randn(4, 8), torch.randn(3, 8).t()
    executable = _executable(_weighted, x, w.contiguous())
    for _ in range(3):
        (out,) = executable(x, w)
        torch.testing.assert_close(out, x @ w + 1)


def test_negative_views_are_read_as_their_values():
    # DLPack exports a negative view's stored values: x + 1 once came back for -x + 1.
    x = torch.randn(4)
    executable = _executable(lambda v: (v + 1,), x.clone())
    for _ in range(4):  # the first calls import, later ones copy into a kept buffer
        negative = torch._neg_view(torch.randn(4))
        (out,) = executable(negative)
        torch.testing.assert_close(out, negative + 1)


def test_misaligned_storage_offsets_are_not_kept():
    base = torch.randn(4 * 8 + 1)
    x, w = base[1:].view(4, 8), torch.randn(8, 3)
    executable = _executable(_weighted, x.clone(), w)
    executable(x, w)
    if _kept(executable, 0) is not None:  # XLA aliased it after all: then it is the same memory
        assert _kept(executable, 0).unsafe_buffer_pointer() == x.data_ptr()
    base.add_(1)
    (out,) = executable(x, w)
    torch.testing.assert_close(out, x @ w + 1)


def test_a_view_dies_with_its_tensor():
    x, w = torch.randn(4, 8), torch.randn(8, 3)
    executable = _executable(_weighted, x, w)
    executable(x, w)
    assert _kept(executable, 0) is not None
    del x
    gc.collect()
    assert _kept(executable, 0) is None


def test_positions_that_get_new_tensors_every_call_stop_keeping():
    w = torch.randn(8, 3)
    executable = _executable(_weighted, torch.randn(4, 8), w)
    for _ in range(5):
        x = torch.randn(4, 8)
        (out,) = executable(x, w)
        torch.testing.assert_close(out, x @ w + 1)
    assert _kept(executable, 0) is None  # an activation: no longer kept
    assert _kept(executable, 1) is not None  # the weight: still kept


@pytest.mark.parametrize(
    "value",
    [
        torch.tensor([2**40 + 3, -5]),  # int64 must not come back as int32
        torch.tensor([True, False]),
        torch.randn(3).bfloat16(),
        torch.tensor(2.5),
    ],
    ids=["int64", "bool", "bfloat16", "scalar"],
)
def test_outputs_keep_dtype_and_shape(value):
    executable = _executable(lambda v: (v.clone(),), value)
    (out,) = executable(value)
    assert out.dtype == value.dtype and out.shape == value.shape
    assert torch.equal(out, value)


def _staged(executable: DeviceExecutable, position: int):
    views = executable._host_views
    return views._staged[position] if position < len(views._staged) else None


def test_small_new_tensors_are_copied_into_a_kept_buffer():
    # A decode step's token and position: new tensors every call, a few bytes each.
    w = torch.randn(8, 3)
    executable = _executable(_weighted, torch.randn(1, 8), w)
    outputs = []
    for step in range(6):
        x = torch.full((1, 8), float(step))
        (out,) = executable(x, w)
        torch.testing.assert_close(out, x @ w + 1)
        outputs.append((x, out))
    staged = _staged(executable, 0)
    assert staged is not None and staged._address not in {x.data_ptr() for x, _ in outputs}
    # Each result is its own memory: later calls, which refill the buffer, leave it alone.
    for x, out in outputs:
        torch.testing.assert_close(out, x @ w + 1)


def test_a_copied_input_never_comes_back_as_an_output():
    executable = _executable(lambda v: (v.clone(),), torch.zeros(4))
    results = [executable(torch.full((4,), float(step)))[0] for step in range(5)]
    assert _staged(executable, 0) is not None
    for step, out in enumerate(results):
        assert torch.equal(out, torch.full((4,), float(step)))


def test_large_new_tensors_are_imported_not_copied():
    w = torch.randn(2048, 3)
    executable = _executable(_weighted, torch.randn(4, 2048), w)  # 32 KiB a call
    for _ in range(4):
        x = torch.randn(4, 2048)
        (out,) = executable(x, w)
        torch.testing.assert_close(out, x @ w + 1, rtol=1e-5, atol=1e-4)  # sums of 2048 products
    assert _staged(executable, 0) is None


def test_a_call_that_finds_the_buffer_in_use_imports_its_arguments():
    w = torch.randn(8, 3)
    executable = _executable(_weighted, torch.randn(1, 8), w)
    for step in range(4):
        executable(torch.full((1, 8), float(step)), w)
    staged = _staged(executable, 0)
    before = staged._host.clone()
    with executable._host_views.lock:  # another thread's call is between its copy and its results
        x = torch.randn(1, 8)
        (out,) = executable(x, w)
    torch.testing.assert_close(out, x @ w + 1)
    assert torch.equal(staged._host, before)

