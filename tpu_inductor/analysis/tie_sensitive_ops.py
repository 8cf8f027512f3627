"""``topk`` calls whose result depends on how PyTorch's CPU kernel orders ties.

Why: eager ``topk`` on the CPU (``topk_impl_loop`` in
``aten/src/ATen/native/TopKImpl.h``) pairs every value with its index and
hands the pairs to the C++ standard library with a comparator on the value
alone: ``std::partial_sort`` when ``k * 64 <= n``, else ``std::nth_element``
followed, when ``sorted``, by ``std::sort`` of the first ``k - 1``. Neither
algorithm is stable, so among equal values the indices eager returns are
whatever libstdc++'s heap select or introselect (median-of-three pivots,
unguarded partitions) leaves in front: all-zero inputs give ``[6, 5, 4, 7]``
for ``n=8, k=4``, ``[2]`` for ``n=4, k=1`` but ``[0]`` for ``n=128, k=1``;
the device's ``topk`` gives ``[0, 1, 2, 3]`` for the first. Only running that
sequential, data-dependent algorithm reproduces it (and a PyTorch built
against another C++ library may order ties differently again), so no
decomposition can.

It matters wherever weights are initialised to a constant: a zero-initialised
router scores every expert the same (``afmoe``: eager routes every token to
experts 2 and 3, the device to 0 and 1), and the RT-DETR family's query
selection (``d_fine``, ``deimv2``, ``pp_doclayout_v3``) picks its queries by
``topk`` over encoder scores that are all equal. Every output downstream then
differs, in nearly every element.

What is safe to lower: the *values* of ``topk(sorted=True)``, which are the
``k`` largest (or smallest) in order whatever the ties, and the values of
``topk(sorted=False)`` on the ``partial_sort`` path (``k * 64 <= n``), which
eager returns sorted too. The indices, and the order of
``sorted=False`` values on the ``nth_element`` path (not sorted at all in
eager: ``topk([5, 1, 7, 3, 8, 2, 6, 4], 4, sorted=False)`` is
``[7, 8, 6, 5]``), are the kernel's; :func:`tie_order_reason` says so, and
such a node should run on PyTorch's kernel.

:func:`keep_unsorted_topk` (in the decomposition table) rewrites a
``sorted=False`` call to the sorted one only where eager sorts it too; one
eager would *not* sort keeps its flag, and runs eagerly with it.
"""

from __future__ import annotations

import operator
from typing import Optional

import torch
import torch.fx

aten = torch.ops.aten

TOPK = aten.topk.default
PARTIAL_SORT_FACTOR = 64
"""Eager uses ``std::partial_sort`` (sorted output) when ``k * 64 <= n``."""


def _topk_arguments(node: torch.fx.Node) -> tuple[object, object, int, bool, bool]:
    """``(input, k, dim, largest, sorted)`` of a ``topk`` call, defaults filled in."""
    names = ("self", "k", "dim", "largest", "sorted")
    defaults = {"dim": -1, "largest": True, "sorted": True}
    values = dict(zip(names, node.args))
    for name in names:
        if name not in values:
            values[name] = node.kwargs.get(name, defaults.get(name))
    return tuple(values[name] for name in names)  # type: ignore[return-value]


def _dim_size(source: object, dim: int) -> Optional[int]:
    """The size of the reduced dimension when it is a plain int, else None."""
    value = source.meta.get("val") if isinstance(source, torch.fx.Node) else None
    if not isinstance(value, torch.Tensor):
        return None
    if value.dim() == 0:
        return 1
    return _static_int(value.shape[dim])


def _static_int(value: object) -> Optional[int]:
    """``value`` as an int when it is one (a SymInt only when it is a constant)."""
    if isinstance(value, int):
        return value
    if isinstance(value, torch.SymInt):
        return value.node.maybe_as_int()
    return None


def _indices_used(node: torch.fx.Node) -> bool:
    """Whether anything reads the indices (output 1) of a ``topk`` node."""
    for user in node.users:
        if user.op == "call_function" and user.target is operator.getitem and len(user.args) > 1:
            if user.args[1] == 0:
                continue
            if user.args[1] == 1 and not user.users:
                continue  # a dangling getitem: dead code
        return True  # the indices, or the tuple itself (conservatively)
    return False


def unsorted_order_is_the_kernels(k: Optional[int], n: Optional[int]) -> bool:
    """Whether eager ``topk(sorted=False)`` returns ``nth_element``'s order (not sorted).

    Unknown (symbolic) sizes count as yes.
    """
    if k is None or n is None:
        return True
    return k > 1 and k * PARTIAL_SORT_FACTOR > n


def tie_order_reason(node: torch.fx.Node) -> Optional[str]:
    """Why ``node`` must run on PyTorch's CPU ``topk`` kernel, or None when it may lower.

    Any node but an ``aten.topk`` call gets None. A ``topk`` gets a reason
    when its indices are read, or when it is ``sorted=False`` with ``k * 64 >
    n`` (eager's values then come in ``nth_element``'s order). Calls with
    nothing to order (``k == 0``, ``n <= 1``) get None.
    """
    if node.op != "call_function" or node.target is not TOPK:
        return None
    source, k_arg, dim, _largest, is_sorted = _topk_arguments(node)
    k = _static_int(k_arg)
    n = _dim_size(source, dim if isinstance(dim, int) else -1)
    if k == 0 or (n is not None and n <= 1):
        return None
    if _indices_used(node):
        return (
            "topk indices: eager's CPU kernel orders tied values by libstdc++'s "
            f"{_algorithm(k, n)}, which no lowering reproduces"
        )
    if not is_sorted and unsorted_order_is_the_kernels(k, n):
        return (
            "topk(sorted=False) values: eager returns them in std::nth_element's order "
            "(k * 64 > n), not sorted"
        )
    return None


def _algorithm(k: Optional[int], n: Optional[int]) -> str:
    if k is not None and n is not None:
        return "partial_sort" if k * PARTIAL_SORT_FACTOR <= n else "nth_element and sort"
    return "partial_sort or nth_element"


def keep_unsorted_topk(x, k, dim=-1, largest=True, sorted=True):
    """``topk(sorted=False)`` as ``topk(sorted=True)`` only where eager sorts it too.

    torch-mlir cannot legalize the ``sorted=False`` flag (a bare
    ``torch.constant.bool``), and Mixture-of-Experts routers ask for it. On eager's ``partial_sort``
    path (``k * 64 <= n``) the flag changes nothing, so the rewrite is exact;
    elsewhere the call keeps ``sorted=False`` (``NotImplemented``: the op
    itself) and :func:`tie_order_reason` sends it to eager.
    """
    if sorted:
        return NotImplemented
    n = 1 if x.dim() == 0 else x.shape[dim]
    if unsorted_order_is_the_kernels(_static_int(k), _static_int(n)):
        return NotImplemented
    return aten.topk.default(x, k, dim, largest, True)
