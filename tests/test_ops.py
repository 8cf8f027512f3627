"""Op suite: ``torch.compile(backend="tpu")`` against eager on OpInfo samples.

Every op named below is *claimed*: on the first samples PyTorch's OpInfo
database gives for it, nothing falls back to eager (``strict=True`` raises
:class:`UnsupportedOpError` on any fallback, and ``fullgraph=True`` forbids
graph breaks, so nothing runs in Python either), at least one device island
is compiled whenever the op computes anything (``NO_ISLAND`` lists the pure
view ops, which stay in eager by design), and the results match eager within
the tolerances documented in ``TOLERANCES``.

The claim lists (``opinfo_claims.py``) were produced by sweeping the whole ``op_db``; ops that do
not lower or do not match are listed, with reasons, in ``ops_not_lowered.md``.
The default run covers ``FAST_*`` (a representative part of every family);
``pytest -m slow tests/test_ops.py`` runs the rest of the claim.
"""

from __future__ import annotations

import contextlib
import functools
from typing import Any, Callable, Iterator

import pytest
import torch

from opinfo_claims import (
    BFLOAT16_OPS,
    COMPLEX64_OPS,
    FAST_BFLOAT16,
    FAST_COMPLEX64,
    FAST_FLOAT32,
    FAST_INT64,
    FLOAT32_OPS,
    INT64_OPS,
    NO_ISLAND,
    NO_ISLAND_COMPLEX64,
    NO_ISLAND_FOR,
)
from torch_versions import TORCH
import torch._dynamo
from torch.utils._pytree import tree_flatten, tree_unflatten

from tpu_inductor import report
from tpu_inductor.errors import UnsupportedOpError
from tpu_inductor.process_state import STATE

common_methods_invocations = pytest.importorskip(
    "torch.testing._internal.common_methods_invocations",
    reason="PyTorch's OpInfo database needs the 'expecttest' package (pip install -e .[test])",
)

# eager_kernels off: these claims are about the device's lowering, so no op
# may be routed to PyTorch's kernel for speed (convolutions would be).
OPTIONS = {"strict": True, "cache": False, "eager_kernels": False}

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
#  complex64: each part is float32 arithmetic (passes/complex_as_real_pairs.py).
#  float16/float64 only appear as explicit casts in samples; torch's defaults.
#  Integers and bool: exact.
TOLERANCES = {
    torch.float32: (1e-4, 1e-5),
    torch.complex64: (1e-4, 1e-5),
    torch.bfloat16: (3e-2, 3e-2),
    torch.float16: (1e-3, 1e-5),
    torch.float64: (1e-7, 1e-7),
}

SAMPLES_PER_OP = 2


def op_id(op) -> str:
    """``name`` or ``name.variant``: the OpInfo entry the claim lists speak in."""
    return f"{op.name}.{op.variant_test_name}" if op.variant_test_name else op.name


@functools.cache
def opinfos() -> dict[str, Any]:
    return {op_id(op): op for op in common_methods_invocations.op_db}


def _tensor_leaves(sample) -> list[torch.Tensor]:
    leaves, _ = tree_flatten((sample.input, sample.args, sample.kwargs))
    return [leaf for leaf in leaves if isinstance(leaf, torch.Tensor)]


def _usable(sample, complex_allowed: bool = False) -> bool:
    """Dense tensors only (the device has no sparse dtypes), complex ones only
    in a complex sweep (``complex_allowed``: elsewhere a sample's complex tensor
    would test passes/complex_as_real_pairs.py instead of the op), and not only
    0-d ones: scalar-only arithmetic runs eagerly by design (a PJRT call costs
    more than it saves), so such a sample would test nothing here."""
    tensors = _tensor_leaves(sample)
    for t in tensors:
        if t.layout != torch.strided or (t.is_complex() and not complex_allowed) or t.is_quantized:
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
            if not _usable(sample, complex_allowed=dtype.is_complex):
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


def compile_and_compare(op, sample, dtype: torch.dtype) -> report.Report:
    """Assert the compiled ``op`` matches eager on ``sample``; return the report."""
    fn, tensors = as_function(op, sample)
    compiled = torch.compile(fn, backend="tpu", options=OPTIONS, dynamic=False, fullgraph=True)
    with plain_opinfo_calls():
        expected = fn(*[t.clone() for t in tensors])
        record = report.reset()
        actual = compiled(*[t.clone() for t in tensors])
    assert_matches(actual, expected)
    return record


def assert_matches(actual: Any, expected: Any) -> None:
    """Same structure, dtypes and shapes; values within the output dtype's tolerance."""
    got, got_spec = tree_flatten(actual)
    want, want_spec = tree_flatten(expected)
    assert got_spec == want_spec, f"output structure {got_spec} != eager's {want_spec}"
    for index, (a, e) in enumerate(zip(got, want)):
        dtype = e.dtype if isinstance(e, torch.Tensor) else torch.float32
        exact = not ((dtype.is_floating_point or dtype.is_complex) and isinstance(e, (torch.Tensor, float, complex)))
        # Float dtypes without a tolerance of ours (float16, float8) get torch's defaults.
        rtol, atol = (0.0, 0.0) if exact else TOLERANCES.get(dtype, (None, None))
        torch.testing.assert_close(
            a, e, rtol=rtol, atol=atol, equal_nan=True, msg=lambda m: f"output {index}: {m}"
        )


def has_compute(record: report.Report) -> bool:
    return any(island.num_nodes > 0 for island in record.islands())


def _params(claimed: tuple[str, ...], fast: frozenset[str]) -> list:
    return [
        pytest.param(name, id=name, marks=() if name in fast else pytest.mark.slow)
        for name in claimed
    ]


def _island_expected(name: str, dtype: torch.dtype, index: int) -> bool:
    if name in NO_ISLAND or NO_ISLAND_FOR.get((name, dtype)) == "all":
        return False
    if dtype == torch.complex64 and name in NO_ISLAND_COMPLEX64:
        return False
    return index not in NO_ISLAND_FOR.get((name), ())


@pytest.fixture(autouse=True)
def fresh_backend_state(monkeypatch):
    """Each op compiles from scratch and cannot inherit another op's learned
    failures (the in-memory support table is per process when cache=False)."""
    torch._dynamo.reset()
    monkeypatch.setattr(STATE, "support_tables", {})
    yield
    torch._dynamo.reset()


def check_op(name: str, dtype: torch.dtype) -> None:
    op = opinfos()[name]
    found = list(samples(op, dtype))
    assert found, f"{name}: OpInfo gives no usable {dtype} sample any more; drop the claim"
    for index, sample in enumerate(found):
        torch._dynamo.reset()
        # strict=True: any eager fallback raises UnsupportedOpError in here.
        record = compile_and_compare(op, sample, dtype)
        assert not record.fallbacks(), record.fallbacks()
        assert record.graphs, f"{name}: the backend was never called"
        if _island_expected(name, dtype, index):
            assert has_compute(record), (
                f"{name} sample {index}: no device island was compiled, so the op did not run "
                f"on the device: {record.graphs}"
            )


@pytest.mark.parametrize("name", _params(FLOAT32_OPS, FAST_FLOAT32))
def test_op_float32(name):
    check_op(name, torch.float32)


@pytest.mark.parametrize("name", _params(INT64_OPS, FAST_INT64))
def test_op_int64(name):
    check_op(name, torch.int64)


@pytest.mark.parametrize("name", _params(BFLOAT16_OPS, FAST_BFLOAT16))
def test_op_bfloat16(name):
    check_op(name, torch.bfloat16)


@pytest.mark.parametrize("name", _params(COMPLEX64_OPS, FAST_COMPLEX64))
def test_op_complex64(name):
    """Complex values run as their float32 parts (passes/complex_as_real_pairs.py)."""
    check_op(name, torch.complex64)


# The harness itself ----------------------------------------------------------


@pytest.mark.skipif(TORCH < (2, 13), reason="the claims are pinned to torch 2.13's OpInfo database")
def test_claims_name_real_opinfos():
    known = opinfos()
    for claimed, fast in (
        (FLOAT32_OPS, FAST_FLOAT32),
        (INT64_OPS, FAST_INT64),
        (BFLOAT16_OPS, FAST_BFLOAT16),
        (COMPLEX64_OPS, FAST_COMPLEX64),
    ):
        assert len(set(claimed)) == len(claimed)
        assert set(claimed) <= set(known), set(claimed) - set(known)
        assert fast <= set(claimed), fast - set(claimed)
    assert not {n for n in FLOAT32_OPS + INT64_OPS + BFLOAT16_OPS + COMPLEX64_OPS if "dropout" in n} - {
        "native_dropout_backward"
    }


def _causes(error: BaseException) -> Iterator[BaseException]:
    while error is not None:
        yield error
        error = getattr(error, "inner_exception", None) or error.__cause__


def test_strict_run_rejects_an_op_that_falls_back():
    """The suite's device check can fail: i0 has no lowering, so strict raises."""
    op = opinfos()["i0"]
    sample = next(samples(op, torch.float32))
    with pytest.raises(Exception) as info:  # Dynamo wraps it in BackendCompilerFailed
        compile_and_compare(op, sample, torch.float32)
    assert any(isinstance(e, UnsupportedOpError) for e in _causes(info.value)), info.value


def _compiled(fn):
    return torch.compile(fn, backend="tpu", options=OPTIONS, dynamic=False, fullgraph=True)


# Silent wrong numbers the sweep found in torch-mlir's lowerings, each pinned
# by a regression test. Some are fixed by a rewrite before lowering, so the op
# stays on the device (checked under strict); the others are routed to eager,
# so the default run matches and strict refuses them by name.
FIXED_ON_DEVICE = {
    "negative_index": (lambda x, i: x[i], (torch.arange(5.0), torch.tensor([-1, -2, 0]))),
    "negative_index_2d": (
        lambda x, i, j: x[i, j],
        (torch.arange(12.0).reshape(3, 4), torch.tensor([-1, 0]), torch.tensor([-4, 3])),
    ),
    "take_negative": (torch.take, (torch.arange(9.0).reshape(3, 3), torch.tensor([-7, -4, -1]))),
    "index_put_negative": (
        lambda x, i: x.index_put((i,), torch.tensor([7.0, 1.0]), accumulate=True),
        (torch.zeros(5), torch.tensor([-1, -1])),
    ),
    "remainder_negative": (lambda x: x % 3.0, (torch.tensor([-7.0, 7.0, -36.0, 5.0]),)),
    "remainder_int_by_float": (lambda x: x % -2.5, (torch.tensor([-7, 7, -36, 5]),)),
    "sign_of_constant": (lambda x: x * torch.scalar_tensor(3.0).sign(), (torch.tensor([-7.0, 7.0]),)),
    # torch-mlir ignored avg_pool3d's override (divided by the window); decompositions/avg_pool_counts.py
    "avg_pool3d_divisor_override": (
        lambda x: torch.nn.functional.avg_pool3d(x, 2, stride=1, padding=1, divisor_override=2),
        (torch.linspace(-3, 3, 64).reshape(1, 1, 4, 4, 4),),
    ),
    "compare_constant": (
        lambda x: torch.where(torch.scalar_tensor(0.5) > 0, x, -x),
        (torch.tensor([-7.0, 7.0]),),
    ),
    # torch-mlir's log(cumsum(exp(x))) overflowed to inf; decompositions/missing_lowerings.py scans stably.
    "logcumsumexp_large": (lambda x: torch.logcumsumexp(x, 0), (torch.tensor([100.0, 50.0]),)),
}

ROUTED_TO_EAGER = {
    # Tied values' indices come in the order of eager's std::nth_element (tests/test_tie_order.py).
    "topk_indices": (
        lambda x: torch.topk(x, 4, dim=-1),
        (torch.zeros(3, 8),),
        "aten.topk",
    ),
}


@pytest.mark.parametrize("case", sorted(FIXED_ON_DEVICE))
def test_wrong_lowering_fixed_on_device(case):
    fn, args = FIXED_ON_DEVICE[case]
    assert_matches(_compiled(fn)(*args), fn(*args))


@pytest.mark.parametrize("case", sorted(ROUTED_TO_EAGER))
def test_wrong_lowering_routed_to_eager(case):
    fn, args, op = ROUTED_TO_EAGER[case]
    default = torch.compile(fn, backend="tpu", options={"cache": False}, dynamic=False)
    assert_matches(default(*args), fn(*args))
    torch._dynamo.reset()
    with pytest.raises(Exception, match=op):
        _compiled(fn)(*args)


def test_comparison_rejects_a_wrong_number():
    expected = (torch.tensor([1.0, 2.0]), torch.tensor([3, 4]))
    assert_matches((expected[0] * (1 + 1e-5), expected[1]), expected)  # within 1e-4
    with pytest.raises(AssertionError):
        assert_matches((expected[0] * 1.001, expected[1]), expected)
    with pytest.raises(AssertionError):
        assert_matches((expected[0], expected[1] + 1), expected)  # ints are exact
    with pytest.raises(AssertionError):
        assert_matches((expected[0].double(), expected[1]), expected)  # dtype too
