"""Grouped matmuls (Mixture-of-Experts experts) as static-shape dense math.

Why: a grouped matmul multiplies each row block of ``input`` (rows sorted by
expert) by its expert's weight, where ``offs`` holds the running row count per
expert. The block sizes are data, so the op has no static-shape lowering, and
libraries wrap their loop over blocks in an opaque custom op
(``transformers::grouped_mm_fallback`` for every float32 MoE model in
transformers). It ran in eager, splitting each expert layer off the device.

XLA wants static shapes, so we compute every expert for every row and keep
each row's own result, the way ``jax.lax.ragged_dot`` lowers on CPU and GPU:

    before: out = grouped_mm_fallback(input[S, K], weight[E, K, N], offs[E])
    after:  group[r] = #{e : offs[e] <= r}                 # row r's expert
            every = bmm(input broadcast over E, weight)    # [E, S, N]
            out = where(group == e, every, 0).sum(E)

It costs E times the grouped matmul's multiplies, which is what XLA's own
ragged dot pays off TPU. Its backward holds the other form, offsets over
the contracted dim (``_grouped_mm(input.T, grad, offs)``, each expert's
weight gradient from its own rows): masked the same way, a batched matmul
(:func:`grouped_mm_over_k`); bfloat16 MoE models (which call
``aten._grouped_mm``) train on the device with it. Masking with ``where``
(not a multiply by 0/1) keeps an inf or NaN in one expert's result out of
every other row, and the sum over E adds exact zeros, so each row equals
eager's single matmul. Rows past the last offset belong to no expert and
stay zero, as in the eager loop.
"""

from __future__ import annotations

from typing import Callable

import torch

aten = torch.ops.aten

# Libraries' opaque grouped matmuls with aten._grouped_mm's 2-D x 3-D
# semantics: (op name, its backward's name or None).
LIBRARY_GROUPED_MATMULS: tuple[tuple[str, str | None], ...] = (
    ("transformers::grouped_mm_fallback", "transformers::grouped_mm_fallback_backward"),
)


def _row_experts(rows: int, offs: torch.Tensor, device: torch.device) -> torch.Tensor:
    """A ``[E, S]`` bool mask: row ``r`` belongs to expert ``e``."""
    row = torch.arange(rows, device=device)
    expert_of_row = (row.unsqueeze(1) >= offs.unsqueeze(0)).sum(1)  # [S], E for rows past the end
    experts = torch.arange(offs.shape[0], device=device)
    return expert_of_row.unsqueeze(0) == experts.unsqueeze(1)


def grouped_mm(input: torch.Tensor, weight: torch.Tensor, offs: torch.Tensor) -> torch.Tensor:
    """``out[r] = input[r] @ weight[expert(r)]`` for ``input [S, K]``, ``weight [E, K, N]``."""
    owned = _row_experts(input.shape[0], offs, input.device).unsqueeze(-1)  # [E, S, 1]
    every = torch.bmm(input.unsqueeze(0).expand(weight.shape[0], -1, -1), weight)  # [E, S, N]
    return torch.where(owned, every, 0).sum(0)


def grouped_mm_over_k(input: torch.Tensor, other: torch.Tensor, offs: torch.Tensor) -> torch.Tensor:
    """``out[e] = input[:, k in group e] @ other[k in group e]`` for ``input
    [M, K]``, ``other [K, N]``: ``[E, M, N]``, the terms of other groups
    masked to exact zeros (a group with no ``k`` gives zeros)."""
    owned = _row_experts(input.shape[1], offs, input.device).unsqueeze(1)  # [E, 1, K]
    own_input = torch.where(owned, input.unsqueeze(0), 0)  # [E, M, K]
    return torch.bmm(own_input, other.unsqueeze(0).expand(offs.shape[0], -1, -1))


def grouped_mm_backward(
    input: torch.Tensor, weight: torch.Tensor, offs: torch.Tensor, grad_output: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """Gradients of :func:`grouped_mm`: each row's through its expert only."""
    grad_input = grouped_mm(grad_output, weight.transpose(1, 2), offs)
    grad_weight = grouped_mm_over_k(input.t(), grad_output, offs)  # [E, K, N]
    return grad_input, grad_weight


def _aten_grouped_mm(self, mat2, offs=None, bias=None, out_dtype=None):
    """``aten._grouped_mm`` in its MoE forms: 2-D rows by 3-D experts (the
    forward and the input gradient) and 2-D by 2-D over the contracted dim
    (the weight gradient), with offsets."""
    if offs is None or bias is not None or self.dim() != 2 or mat2.dim() not in (2, 3):
        return NotImplemented
    out = grouped_mm(self, mat2, offs) if mat2.dim() == 3 else grouped_mm_over_k(self, mat2, offs)
    return out if out_dtype is None else out.to(out_dtype)


def _library_op(qualified_name: str) -> torch._ops.OpOverload | None:
    namespace, name = qualified_name.split("::")
    packet = getattr(getattr(torch.ops, namespace), name, None)
    return None if packet is None else packet.default


def grouped_matmul_decompositions() -> dict[torch._ops.OperatorBase, Callable]:
    """Decompositions for ``aten._grouped_mm`` and the library ops registered now.

    A library registers its op when it is imported, so callers look this up
    per compile rather than once per process.
    """
    table: dict[torch._ops.OperatorBase, Callable] = {aten._grouped_mm.default: _aten_grouped_mm}
    for forward_name, backward_name in LIBRARY_GROUPED_MATMULS:
        forward = _library_op(forward_name)
        if forward is not None:
            table[forward] = grouped_mm
        backward = _library_op(backward_name) if backward_name else None
        if backward is not None:
            table[backward] = grouped_mm_backward
    return table
