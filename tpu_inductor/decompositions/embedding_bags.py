"""``embedding_bag`` in every mode as lookups and per-bag sums that lower.

Why: torch-mlir lowers ``embedding_bag`` in ``sum`` mode without per-sample
weights or a padding index only, and its backward (``_embedding_bag_backward``)
not at all. ``nn.EmbeddingBag``'s default mode is ``mean``; with
``padding_idx``, ``per_sample_weights`` or ``max``, or in any training step,
the bag ran in eager PyTorch, and the first compile logged a torch-mlir
failure with a reproducer. On a device that is a round trip to the host.

Where the device is the CPU client, PyTorch's own embedding-bag kernels are
7-20x faster than these ops on XLA:CPU, so there the backend leaves the
bags whole (``keep_embedding_bags`` in decompositions/table.py) and runs
them eagerly by choice (placement/kernel_choice.py); everywhere else:

``embedding_bag`` (both overloads) is decomposed before autograd sees it
(``torch_api.above_autograd``), so its backward is the backward of these
ops (an ``index_add`` into the weight's gradient), which lowers:

* index ``j`` is in bag ``b`` when ``offsets[b] <= j`` and the next bag
  starts after it: one mark at each bag's start, summed along the indices;
* ``sum``: ``index_add`` of the looked-up rows (times ``per_sample_weights``)
  into their bags; ``mean``: that sum over the bag's count of rows that are
  not ``padding_idx`` (an empty bag is zero, as eager's); bfloat16 and
  float16 rows are summed in float32 and rounded once, as eager's kernels do;
* ``max``: each bag's maximum by a scan by doubling over the rows of that
  bag, then the first row that holds it (eager keeps the first of equal
  rows), taken with its gradient; an empty bag is zero.

Sums over a bag's rows in another order than eager's: a few ulps. The three
index outputs (``offset2bag``, ``bag_size``, ``max_indices``) are eager's
own: PyTorch's modules drop them, so they cost nothing; a program that
reads them gets them from ``_embedding_bag`` itself (eager, or the ``sum``
fast path below). ``scale_grad_by_freq`` and ``sparse`` change the
gradient and keep the op.

``_embedding_bag`` itself (what a program that calls it directly, or reads
those outputs, traces to) in ``sum`` mode on eager's float32 fast path is
the same ``index_add``, with the auxiliary outputs that path returns (an
empty ``offset2bag``, zero ``bag_size`` and ``max_indices``).
"""

from __future__ import annotations

from typing import Optional

import torch

from tpu_inductor.half_precision import HALF_FLOATS

aten = torch.ops.aten

_SUM, _MEAN, _MAX = 0, 1, 2


def _static(*tensors: torch.Tensor) -> bool:
    return all(isinstance(n, int) for t in tensors for n in t.shape)


def _bag_of_each_index(offsets: torch.Tensor, count: int, bags: int) -> torch.Tensor:
    """``bag[j]``: how many bags start at or before index ``j``, minus one
    (-1 before the first bag). A bag starting past the end marks nothing."""
    starts = offsets[:bags].clamp(0, count)
    marks = torch.zeros(count + 1, dtype=offsets.dtype, device=offsets.device)
    marks = marks.index_add(0, starts, torch.ones_like(starts))
    return marks[:count].cumsum(0) - 1


def _segment_max(values: torch.Tensor, bag: torch.Tensor) -> torch.Tensor:
    """At each index, the largest of ``values`` from its bag's start up to it
    (bags are runs of equal ``bag``), by doubling: after the step of width
    ``w`` each row holds the maximum of the ``2w`` rows ending at it."""
    count = values.shape[0]
    width = 1
    while width < count:
        earlier = torch.cat([values[:width], values[:-width]])
        same_bag = torch.cat([torch.zeros_like(bag[:width], dtype=torch.bool), bag[width:] == bag[:-width]])
        values = torch.where(same_bag.unsqueeze(1), torch.maximum(values, earlier), values)
        width *= 2
    return values


def _first_maxima(rows: torch.Tensor, real: torch.Tensor, bag: torch.Tensor, into: torch.Tensor,
                  bags: int) -> torch.Tensor:
    """Per column, True at the first real index of each bag that holds the
    bag's maximum (eager keeps the first of equal rows and sends the
    gradient there). The maximum is the running one at the bag's last index."""
    running = _segment_max(torch.where(real.unsqueeze(1), rows, torch.finfo(rows.dtype).min), bag)
    is_last = torch.cat([bag[1:] != bag[:-1], torch.ones_like(bag[:1], dtype=torch.bool)]) & (bag >= 0)
    maxima = rows.new_zeros((bags, rows.shape[1])).index_add(0, into, torch.where(is_last.unsqueeze(1), running, 0))
    hits = (real.unsqueeze(1) & (rows == maxima.index_select(0, into))).long()
    per_bag = hits.new_zeros((bags, rows.shape[1])).index_add(0, into, hits)
    before_bag = per_bag.cumsum(0) - per_bag
    return (hits == 1) & (hits.cumsum(0) - before_bag.index_select(0, into) == 1)


def _bag_output(weight, indices, offsets, mode, per_sample_weights, include_last_offset, padding_idx):
    count, bags = indices.shape[0], offsets.shape[0] - (1 if include_last_offset else 0)
    bag = _bag_of_each_index(offsets, count, bags)
    real = bag >= 0  # eager refuses offsets that do not start at 0
    if include_last_offset:
        real = real & (torch.arange(count, device=indices.device) < offsets[bags])
    if padding_idx is not None and padding_idx >= 0:
        real = real & (indices != padding_idx)
    into = bag.clamp_min(0)
    rows = weight.index_select(0, indices)
    if mode == _MAX:
        zeros = weight.new_zeros((bags, weight.shape[1]))
        return zeros.index_add(0, into, torch.where(_first_maxima(rows.detach(), real, bag, into, bags), rows, 0))
    # Half floats are summed in float32 and rounded once, as eager's kernels do.
    rows = rows.float() if weight.dtype in HALF_FLOATS else rows
    if per_sample_weights is not None:
        rows = rows * per_sample_weights.unsqueeze(1).to(rows.dtype)
    summed = rows.new_zeros((bags, weight.shape[1])).index_add(0, into, torch.where(real.unsqueeze(1), rows, 0))
    if mode == _MEAN:
        sizes = rows.new_zeros((bags,)).index_add(0, into, real.to(rows.dtype))
        summed = summed / sizes.clamp_min(1).unsqueeze(1)
    return summed.to(weight.dtype)


def _embedding_bag(weight, indices, offsets, scale_grad_by_freq=False, mode=_SUM, sparse=False,
                   per_sample_weights=None, include_last_offset=False, padding_idx: Optional[int] = None):
    """``aten.embedding_bag`` (``.default`` and ``.padding_idx``), before autograd."""
    supported = (
        not scale_grad_by_freq and not sparse and mode in (_SUM, _MEAN, _MAX)
        and (per_sample_weights is None or mode == _SUM)
        and weight.dim() == 2 and indices.dim() == 1 and offsets.dim() == 1
        and weight.dtype.is_floating_point and _static(weight, indices, offsets)
        and offsets.shape[0] >= (2 if include_last_offset else 1)
    )
    if not supported:
        return NotImplemented
    output = _bag_output(weight, indices, offsets, mode, per_sample_weights, include_last_offset, padding_idx)
    # Eager's index outputs, from the op itself on a weight with no gradient:
    # unused (as by every PyTorch module) they are dead code and go.
    auxiliary = aten._embedding_bag.default(
        weight.detach(), indices, offsets, False, mode, False, per_sample_weights, include_last_offset,
        -1 if padding_idx is None else padding_idx,
    )
    return (output, *auxiliary[1:])


def _embedding_bag_sum(forward_only: bool):
    """``_embedding_bag(..., mode=0)`` on eager's float32 fast path (float32
    rows of unit stride, no per-sample weights, no padding index), whose
    auxiliary outputs are fixed: ``offset2bag`` empty, ``bag_size`` and
    ``max_indices`` zeros, shaped as its meta function says. Every other
    case keeps the op."""

    def decomposition(weight, indices, offsets, scale_grad_by_freq=False, mode=0, sparse=False,
                      per_sample_weights=None, include_last_offset=False, padding_idx=-1):
        fast_path = (
            mode == _SUM and per_sample_weights is None and (padding_idx is None or padding_idx < 0)
            and weight.dtype == torch.float32 and weight.dim() == 2 and weight.stride(1) == 1
            and indices.dim() == 1 and offsets.dim() == 1
        )
        if not fast_path or not _static(weight, indices, offsets):
            return NotImplemented
        bags = offsets.shape[0] - 1 if include_last_offset else offsets.shape[0]
        if bags < 0 or (forward_only and include_last_offset):
            # forward_only's max_indices with include_last_offset: eager's has
            # one more row than its meta function says; keep the op.
            return NotImplemented
        output = _bag_output(weight, indices, offsets, _SUM, None, include_last_offset, None)
        offset2bag = offsets.new_zeros((0,))
        bag_size = offsets.new_zeros((offsets.shape[0] if forward_only else bags,))
        max_indices = offsets.new_zeros((bags,))
        return output, offset2bag, bag_size, max_indices

    return decomposition


ABOVE_AUTOGRAD_DECOMPOSITIONS: dict = {
    aten.embedding_bag.default: _embedding_bag,
    aten.embedding_bag.padding_idx: _embedding_bag,
}
"""Composite ops decomposed before autograd records them (``torch_api.above_autograd``)."""

EMBEDDING_BAG_DECOMPOSITIONS: dict = {
    aten._embedding_bag.default: _embedding_bag_sum(forward_only=False),
    aten._embedding_bag_forward_only.default: _embedding_bag_sum(forward_only=True),
}
