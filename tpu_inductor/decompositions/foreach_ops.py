"""``torch._foreach_*`` ops as one per-tensor op for each tensor of the list.

Why: ``torch.nn.utils.clip_grad_norm_`` takes its foreach path for CPU
tensors (``_foreach_norm``, then ``_foreach_mul_`` by the clip coefficient),
and so do optimizers built with ``foreach=True``. torch-mlir has no lowering
for any foreach op, so a compiled training step that clipped its gradients
ran the clip in eager PyTorch: on the path a TPU takes (``zero_copy=False``)
every gradient went down to the host and back, and the first compile logged
a torch-mlir failure with a reproducer. A foreach op is, by definition, its
per-tensor op applied to each tensor of its lists (the fused CUDA kernels
only batch the launches), so that is what it becomes: before,
``_foreach_mul.Tensor([g0, g1], c)``; after, ``[mul(g0, c), mul(g1, c)]``,
which XLA fuses as it likes.

The arguments of an overload are read from its schema: a ``Tensor[]`` or
``Scalar[]`` argument gives each call its own element, any other argument
is passed to every call (``_foreach_add.Tensor``'s 0-d ``other``). The
``Tensor scalars`` of ``_foreach_addcmul.Tensor``/``_foreach_addcdiv.Tensor``
holds one value per tensor and is indexed as well.
"""

from __future__ import annotations

from typing import Any, Callable

import torch

from tpu_inductor.torch_api import operator_schemas

aten = torch.ops.aten

_PREFIX = "aten::_foreach_"


def _norm(x: torch.Tensor, ord: float = 2, dtype: torch.dtype | None = None) -> torch.Tensor:
    return torch.linalg.vector_norm(x, ord, dtype=dtype)


def _powsum(x: torch.Tensor, ord: float = 2, dtype: torch.dtype | None = None) -> torch.Tensor:
    """``sum(|x| ** ord)``: the norm before its root (``_foreach_powsum``)."""
    x = x.to(dtype) if dtype is not None else x
    return x.abs().pow(ord).sum()


def _addcmul_by_tensor(x: torch.Tensor, a: torch.Tensor, b: torch.Tensor, value: torch.Tensor) -> torch.Tensor:
    return x + value * (a * b)


def _addcdiv_by_tensor(x: torch.Tensor, a: torch.Tensor, b: torch.Tensor, value: torch.Tensor) -> torch.Tensor:
    return x + value * (a / b)


_PER_TENSOR_OP: dict[str, Callable[..., Any]] = {
    "norm": _norm,
    "powsum": _powsum,
    "max": aten.max.default,
    "zero": aten.zeros_like.default,
    "copy": lambda x, src, non_blocking=False: aten.copy.default(x, src),
}
"""Foreach ops whose per-tensor op is not ``aten.<name>`` resolved by its arguments."""

_KEYWORD_ONLY_PER_TENSOR = frozenset({"value"})
"""Positional in a foreach schema, keyword-only in its per-tensor op (``addcmul``'s ``value``)."""

_PER_TENSOR_OVERLOAD: dict[tuple[str, str], Callable[..., Any]] = {
    ("addcmul", "Tensor"): _addcmul_by_tensor,
    ("addcdiv", "Tensor"): _addcdiv_by_tensor,
    # With a number, maximum and minimum are clamps (eager's foreach kernels
    # call clamp_min/clamp_max); aten.maximum takes tensors only.
    ("maximum", "Scalar"): aten.clamp_min.default,
    ("maximum", "ScalarList"): aten.clamp_min.default,
    ("minimum", "Scalar"): aten.clamp_max.default,
    ("minimum", "ScalarList"): aten.clamp_max.default,
}


def _foreach_decomposition(schema: Any, per_tensor: Callable[..., Any]) -> Callable[..., Any]:
    names = [argument.name for argument in schema.arguments]
    listed = {argument.name for argument in schema.arguments if str(argument.type) in ("List[Tensor]", "List[number]")}
    if schema.overload_name == "Tensor" and "scalars" in names:
        listed.add("scalars")

    def decomposition(*args: Any, **kwargs: Any) -> list[torch.Tensor]:
        bound = dict(zip(names, args))
        bound.update(kwargs)
        count = len(next(bound[name] for name in names if name in listed and name != "scalars"))
        positional = [name for name in names[: len(args)] if name not in _KEYWORD_ONLY_PER_TENSOR]
        keywords = [name for name in bound if name not in positional]

        def element(name: str, i: int) -> Any:
            return bound[name][i] if name in listed else bound[name]

        return [
            per_tensor(*(element(n, i) for n in positional), **{n: element(n, i) for n in keywords})
            for i in range(count)
        ]

    return decomposition


def _foreach_decompositions() -> dict[torch._ops.OpOverload, Callable[..., Any]]:
    table = {}
    for schema in operator_schemas(_PREFIX):
        if schema.is_mutable or schema.overload_name.endswith("out"):
            continue
        name = schema.name[len(_PREFIX):]
        per_tensor = _PER_TENSOR_OVERLOAD.get((name, schema.overload_name)) or _PER_TENSOR_OP.get(name)
        if per_tensor is None:
            per_tensor = getattr(aten, name, None)
            if per_tensor is None:
                continue
        overload = getattr(getattr(aten, f"_foreach_{name}"), schema.overload_name or "default")
        table[overload] = _foreach_decomposition(schema, per_tensor)
    return table


FOREACH_DECOMPOSITIONS = _foreach_decompositions()
