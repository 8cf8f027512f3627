"""``embedding_bag`` on the device in every mode, forward and backward
(decompositions/embedding_bags.py), against eager."""

from __future__ import annotations

import pytest
import torch

import tpu_inductor.report as report

F = torch.nn.functional
# Kernel choice off: these claims are about the lowering.
OPTIONS = {"cache": False, "eager_kernels": False}


def _on_device(fn, *args):
    got = torch.compile(fn, backend="tpu", options=OPTIONS)(*args)
    assert report.current().fallbacks() == [] and report.current().islands()
    return got


def _weight(rows=20, width=6, requires_grad=False):
    weight = torch.randn(rows, width, generator=torch.Generator().manual_seed(0))
    weight[3] = weight[5]  # two distinct rows that tie everywhere (max keeps the first)
    return weight.requires_grad_(requires_grad)


INDICES = torch.tensor([1, 3, 3, 5, 7, 9, 0, 2, 5, 3, 11, 19])
OFFSETS = {
    # name: (offsets, include_last_offset)
    "empty_bags": ([0, 3, 3, 6, 12], False),  # an empty bag inside and one past the end
    "last_offset": ([0, 2, 2, 7, 12], True),  # CSR: the last offset is the end
    "one_bag": ([0], False),
}


def _cases():
    """Every mode, padding and weighting over bags with empty ones; the other
    offsets once a mode in the default run, the rest under ``-m slow``."""
    for mode in ("sum", "mean", "max"):
        for offsets in OFFSETS:
            for padding_idx in (None, 3):
                for weighted in (False, True) if mode == "sum" else (False,):
                    default = offsets == "empty_bags" or (padding_idx is None and not weighted)
                    yield pytest.param(mode, offsets, padding_idx, weighted,
                                       id=f"{mode}-{offsets}-pad{padding_idx}" + ("-weighted" if weighted else ""),
                                       marks=() if default else pytest.mark.slow)


def _bag_fn(mode, offsets, padding_idx, weighted):
    positions, include_last_offset = OFFSETS[offsets]
    offsets_tensor = torch.tensor(positions)
    per_sample = torch.rand(len(INDICES), generator=torch.Generator().manual_seed(1)) if weighted else None

    def fn(weight):
        return F.embedding_bag(INDICES, weight, offsets_tensor, mode=mode, per_sample_weights=per_sample,
                               include_last_offset=include_last_offset, padding_idx=padding_idx)

    return fn


@pytest.mark.parametrize("mode, offsets, padding_idx, weighted", list(_cases()))
def test_embedding_bag_runs_on_the_device(mode, offsets, padding_idx, weighted):
    """Forward and backward: the gradient reaches each looked-up row (for
    max, the first of tied rows, as eager's)."""
    fn = _bag_fn(mode, offsets, padding_idx, weighted)
    weight, twin = _weight(requires_grad=True), _weight(requires_grad=True)
    got, expected = _on_device(fn, weight), fn(twin)
    # Bags of at most 6 rows summed in another order: a few ulps; max exactly.
    torch.testing.assert_close(got, expected, rtol=1e-6, atol=1e-6)
    cotangent = torch.randn(expected.shape, generator=torch.Generator().manual_seed(2))
    (got * cotangent).sum().backward()
    (expected * cotangent).sum().backward()
    assert report.current().fallbacks() == []  # the backward too
    torch.testing.assert_close(weight.grad, twin.grad, rtol=1e-6, atol=1e-6)


def test_embedding_bag_module_runs_on_the_device():
    """``nn.EmbeddingBag``'s defaults (``mean``) over a 2-d input, trained a step."""
    bag, twin = torch.nn.EmbeddingBag(20, 4), torch.nn.EmbeddingBag(20, 4)
    twin.load_state_dict(bag.state_dict())
    x = torch.randint(0, 20, (3, 5), generator=torch.Generator().manual_seed(1))
    got = _on_device(bag, x)
    expected = twin(x)
    torch.testing.assert_close(got, expected, rtol=1e-6, atol=1e-6)
    got.square().sum().backward()
    expected.square().sum().backward()
    torch.testing.assert_close(bag.weight.grad, twin.weight.grad, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize(
    "offsets, include_last_offset",
    [([0, 3, 5, 7, 9, 10, 15], False), ([0, 3, 3, 7, 18], True), ([0, 2], False)],
    ids=["bags", "empty_bag_last_offset", "two_bags"],
)
@pytest.mark.parametrize("op", [torch.ops.aten._embedding_bag, torch.ops.aten._embedding_bag_forward_only])
def test_embedding_bag_op_sum_runs_on_the_device(op, offsets, include_last_offset):
    """``_embedding_bag`` called directly, index outputs and all, on eager's sum fast path."""
    if op is torch.ops.aten._embedding_bag_forward_only and include_last_offset:
        pytest.skip("kept as the op: eager's max_indices differs from its meta shape")
    weight = torch.randn(100, 10, generator=torch.Generator().manual_seed(0))
    indices = torch.tensor([0, 1, 2, 2, 0, 2, 1, 3, 20, 50, 99, 2, 4, 5, 6, 7, 34, 54])
    fn = lambda w, i, o: op(w, i, o, False, 0, False, None, include_last_offset)  # noqa: E731
    got, expected = _on_device(fn, weight, indices, torch.tensor(offsets)), fn(weight, indices, torch.tensor(offsets))
    # Bags of at most 8 rows summed in another order: a few ulps; the index outputs exactly.
    torch.testing.assert_close(got[0], expected[0], rtol=1e-6, atol=1e-6)
    for g, e in zip(got[1:], expected[1:]):
        torch.testing.assert_close(g, e, rtol=0, atol=0)


@pytest.mark.parametrize("mode", ["mean", "max"])
def test_embedding_bag_index_outputs_stay_eager_values(mode):
    """A program that reads ``offset2bag``/``bag_size``/``max_indices`` gets eager's."""
    offsets = torch.tensor([0, 3, 3, 6])
    fn = lambda w: torch.embedding_bag(w, INDICES[:8], offsets, False, ["sum", "mean", "max"].index(mode))  # noqa: E731
    weight = _weight()
    got = torch.compile(fn, backend="tpu", options=OPTIONS)(weight)
    for g, e in zip(got, fn(weight)):
        torch.testing.assert_close(g, e, rtol=1e-6, atol=1e-6)


def test_embedding_bags_run_on_pytorchs_kernels_on_the_cpu_client():
    """The CPU client's default: left whole for PyTorch's kernel, forward and
    backward, reported as a choice (no fallback, no torch-mlir attempt)."""
    bag, twin = torch.nn.EmbeddingBag(20, 4, mode="max"), torch.nn.EmbeddingBag(20, 4, mode="max")
    twin.load_state_dict(bag.state_dict())
    x = torch.randint(0, 20, (3, 5), generator=torch.Generator().manual_seed(1))
    got = torch.compile(bag, backend="tpu", options={"cache": False})(x)
    expected = twin(x)
    torch.testing.assert_close(got, expected, rtol=0, atol=0)
    got.sum().backward()
    expected.sum().backward()
    torch.testing.assert_close(bag.weight.grad, twin.weight.grad, rtol=0, atol=0)
    record = report.current()
    assert record.fallbacks() == [] and not record.repros
    chosen = [k.op for graph in record.graphs for k in graph.eager_kernels]
    assert any("_embedding_bag" in op for op in chosen) and any("_embedding_bag_backward" in op for op in chosen), chosen
