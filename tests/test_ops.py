"""Op suite: ``torch.compile(backend="tpu")`` against eager on OpInfo samples.

Every op named below is *claimed*: for the first samples PyTorch's OpInfo
database gives for it, the compiled function runs entirely on the device
(``strict=True`` raises :class:`UnsupportedOpError` on any eager fallback and
``fullgraph=True`` forbids graph breaks, so nothing runs in Python either),
at least one device island is compiled when the op computes anything, and
the results match eager within the tolerances documented in ``TOLERANCES``.

The claim lists were produced by sweeping the whole ``op_db``; ops that do
not lower or do not match are listed, with reasons, in ``ops_not_lowered.md``.
The default run covers ``FAST_*`` (a representative part of every family);
``pytest -m slow tests/test_ops.py`` runs the rest of the claim.
"""

from __future__ import annotations

import contextlib
import functools
from typing import Any, Callable, Iterator, Optional

import pytest
import torch
import torch._dynamo
from torch.utils._pytree import tree_flatten, tree_unflatten

from tpu_inductor import compiled_graph, report
from tpu_inductor.errors import UnsupportedOpError  # noqa: F401  (raised by strict mode)

common_methods_invocations = pytest.importorskip(
    "torch.testing._internal.common_methods_invocations",
    reason="PyTorch's OpInfo database needs the 'expecttest' package (pip install -e .[test])",
)

OPTIONS = {"strict": True, "cache": False}

# Tolerances (rtol, atol) by the dtype of each *output* (an int64 sample of
# tanh produces float32, compared as float32).
#  float32: XLA's CPU backend uses its own polynomial approximations for
#    transcendental functions (exp, log, tanh, erf, sin, ...) and may fuse and
#    reassociate reductions, so results differ from ATen's by a few ulp, more
#    after cancellation. torch's float32 default (rtol 1.3e-6, atol 1e-5) flags
#    those few-ulp differences; 1e-4 relative is ~800 ulp, still far below any
#    real lowering bug (wrong op, axis, broadcast or index shows up as O(1)).
#  bfloat16: one bf16 ulp is 2**-8 (~3.9e-3 relative); XLA may round
#    intermediates to bf16 at different points than ATen (which computes most
#    bf16 ops in float32 and rounds once), so allow a few ulp.
#  float16/float64 only appear as explicit casts in samples; torch's defaults.
#  Integers and bool: exact.
TOLERANCES = {
    torch.float32: (1e-4, 1e-5),
    torch.bfloat16: (3e-2, 3e-2),
    torch.float16: (1e-3, 1e-5),
    torch.float64: (1e-7, 1e-7),
}

# Per-op overrides where the default above is too tight for a reason
# explained next to the entry: {(op id, sample dtype): (rtol, atol)}.
TOLERANCE_OVERRIDES: dict[tuple[str, torch.dtype], tuple[float, float]] = {}

SAMPLES_PER_OP = 2

# Ops whose outputs uninitialized memory or randomness decides: never claimed.
NONDETERMINISTIC = frozenset(
    {"empty", "empty_like", "empty_strided", "empty_permuted", "new_empty", "new_empty_strided"}
)


def op_id(op) -> str:
    """``name`` or ``name.variant``: the OpInfo entry the claim lists speak in."""
    return f"{op.name}.{op.variant_test_name}" if op.variant_test_name else op.name


@functools.cache
def opinfos() -> dict[str, Any]:
    return {op_id(op): op for op in common_methods_invocations.op_db}


def _tensor_leaves(sample) -> list[torch.Tensor]:
    leaves, _ = tree_flatten((sample.input, sample.args, sample.kwargs))
    return [leaf for leaf in leaves if isinstance(leaf, torch.Tensor)]


def _usable(sample) -> bool:
    """Dense, non-complex tensors only (the device has no sparse or complex dtypes),
    and not only 0-d ones: scalar-only arithmetic runs eagerly by design (a PJRT
    call costs more than it saves), so such a sample would test nothing here."""
    tensors = _tensor_leaves(sample)
    for t in tensors:
        if t.layout != torch.strided or t.is_complex() or t.is_quantized:
            return False
    return not tensors or any(t.dim() > 0 for t in tensors)


def _clone(tree: Any) -> Any:
    leaves, spec = tree_flatten(tree)
    return tree_unflatten([l.clone() if isinstance(l, torch.Tensor) else l for l in leaves], spec)


def _eager(op, sample) -> Any:
    inp, args, kwargs = _clone((sample.input, sample.args, sample.kwargs))
    return op(inp, *args, **kwargs)


def _call(op, *args, **kwargs):
    return op(*args, **kwargs)


@contextlib.contextmanager
def plain_opinfo_calls() -> Iterator[None]:
    """OpInfo wraps some deterministic ops (scaled_dot_product_attention,
    multi_head_attention_forward, ``item``) in ``wrapper_set_seed``, which
    Dynamo cannot trace (it saves and restores the RNG state). Call them plainly;
    genuinely random ops are never claimed, so no seed is needed."""
    cmi = common_methods_invocations
    saved = cmi.wrapper_set_seed
    cmi.wrapper_set_seed = _call
    try:
        yield
    finally:
        cmi.wrapper_set_seed = saved


def samples(op, dtype: torch.dtype, count: int = SAMPLES_PER_OP) -> Iterator[Any]:
    """The first ``count`` usable OpInfo samples that eager itself accepts."""
    torch.manual_seed(0)
    found = []
    with plain_opinfo_calls():
        for sample in op.sample_inputs("cpu", dtype, requires_grad=False):
            if len(found) >= count:
                break
            if not _usable(sample):
                continue
            try:
                _eager(op, sample)
            except Exception:
                continue
            found.append(sample)
    return iter(found)


def as_function(op, sample) -> tuple[Callable[..., Any], list[torch.Tensor]]:
    """``fn(*tensors)`` computing ``op`` on ``sample``; tensors become graph inputs,
    everything else (ints, dims, dtypes, floats) is a constant of the graph."""
    leaves, spec = tree_flatten((sample.input, sample.args, sample.kwargs))
    is_tensor = [isinstance(leaf, torch.Tensor) for leaf in leaves]
    constants = [None if t else leaf for t, leaf in zip(is_tensor, leaves)]
    tensors = [leaf for t, leaf in zip(is_tensor, leaves) if t]

    def fn(*ts):
        it = iter(ts)
        full = [next(it) if t else c for t, c in zip(is_tensor, constants)]
        inp, args, kwargs = tree_unflatten(full, spec)
        return op(inp, *args, **kwargs)

    return fn, tensors


def compile_and_compare(
    op, sample, dtype: torch.dtype, tolerance: Optional[tuple[float, float]] = None
) -> report.Report:
    """Assert the compiled ``op`` matches eager on ``sample``; return the report."""
    fn, tensors = as_function(op, sample)
    compiled = torch.compile(fn, backend="tpu", options=OPTIONS, dynamic=False, fullgraph=True)
    with plain_opinfo_calls():
        expected = fn(*[t.clone() for t in tensors])
        record = report.reset()
        actual = compiled(*[t.clone() for t in tensors])
    assert_matches(actual, expected, tolerance or TOLERANCE_OVERRIDES.get((op_id(op), dtype)))
    return record


def assert_matches(actual: Any, expected: Any, tolerance: Optional[tuple[float, float]]) -> None:
    """Same structure, dtypes and shapes; values within the output dtype's tolerance."""
    got, got_spec = tree_flatten(actual)
    want, want_spec = tree_flatten(expected)
    assert got_spec == want_spec, f"output structure {got_spec} != eager's {want_spec}"
    for index, (a, e) in enumerate(zip(got, want)):
        dtype = e.dtype if isinstance(e, torch.Tensor) else torch.float32
        exact = not (dtype.is_floating_point and isinstance(e, (torch.Tensor, float)))
        rtol, atol = (0.0, 0.0) if exact else (tolerance or TOLERANCES[dtype])
        torch.testing.assert_close(
            a, e, rtol=rtol, atol=atol, equal_nan=True, msg=lambda m: f"output {index}: {m}"
        )


def has_compute(record: report.Report) -> bool:
    return any(island.num_nodes > 0 for island in record.islands())
