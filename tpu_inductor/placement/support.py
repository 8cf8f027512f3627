"""Which ATen nodes lower to StableHLO: the support table placement reads.

A node is lowered unless one of these says no, in this order:

1. its tensors carry a dtype outside :data:`SUPPORTED_DTYPES`;
2. its input or output shape depends on data (unbacked symbols: nonzero,
   masked_select, and everything computed from their results);
3. its op is in :data:`KNOWN_UNSUPPORTED` (torch-mlir cannot lower it) or in
   :data:`EAGER_ONLY` (random ops, whose results must come from torch's own
   generator to match eager);
4. a lowering of it failed before (learned at run time, remembered in memory
   and in the cache directory so later processes skip the failed attempt).

Each "no" is a :class:`~tpu_inductor.placement.placement.Decision`, which
placement (placement/placement.py) puts beside its other sources.

``tests/test_ops.py`` keeps the table honest: every op it calls supported
lowers and matches eager on OpInfo sample inputs.
"""

from __future__ import annotations

import operator
from pathlib import Path
from typing import Optional

import torch
import torch.fx
from torch.fx.experimental.symbolic_shapes import free_unbacked_symbols

from tpu_inductor.dynamic import SYMBOLIC_TYPES
from tpu_inductor.decompositions.table import ATTENTION_OPS
from tpu_inductor.analysis.tie_sensitive_ops import tie_order_reason
from tpu_inductor.passes.conditionals_as_selects import EAGER_REASON as COND_EAGER_REASON
from tpu_inductor.placement.placement import Decision


aten = torch.ops.aten

SUPPORTED_DTYPES = frozenset(
    {
        torch.float32,
        torch.float16,
        torch.bfloat16,
        torch.float64,
        torch.int8,
        torch.int16,
        torch.int32,
        torch.int64,
        torch.uint8,
        torch.bool,
    }
)

# torch-mlir has no StableHLO lowering for these (checked with torch-mlir 20261001).
KNOWN_UNSUPPORTED = frozenset(
    {
        "aten._fft_r2c",
        "aten._fft_c2r",
        "aten._fft_c2c",
        "aten.nonzero",
        "aten.masked_select",
        "aten._unique2",
        "aten.unique_dim",
        "aten.unique_consecutive",
        "aten._local_scalar_dense",
        "aten.i0",
        # No torch-mlir op at all (imported as an opaque torch.operator) or no
        # StableHLO conversion for any input: found by the OpInfo sweep behind
        # tests/test_ops.py (see tests/ops_not_lowered.md).
        "aten._batch_norm_with_update_functional",
        "aten._cdist_forward",
        "aten._histogramdd_bin_edges",
        "aten._histogramdd_from_bin_cts",
        "aten._linalg_eigh",
        "aten._linalg_slogdet",
        "aten._linalg_solve_ex",
        "aten._linalg_svd",
        "aten._pdist_forward",
        "aten._upsample_bilinear2d_aa",
        "aten.addmv",
        "aten.angle",
        "aten.cholesky",
        "aten.cholesky_inverse",
        "aten.cholesky_solve",
        "aten.cummax",
        "aten.cummin",
        "aten.digamma",
        "aten.dist",
        "aten.erfc",
        "aten.erfinv",
        "aten.fractional_max_pool2d",
        "aten.fractional_max_pool3d",
        "aten.frexp",
        "aten.gcd",
        "aten.geqrf",
        "aten.grid_sampler_3d",
        "aten.histc",
        "aten.histogram",
        "aten.hypot",
        "aten.igamma",
        "aten.igammac",
        "aten.index_reduce",
        "aten.lcm",
        "aten.lgamma",
        "aten.linalg_cholesky_ex",
        "aten.linalg_householder_product",
        "aten.linalg_inv_ex",
        "aten.linalg_ldl_factor_ex",
        "aten.linalg_ldl_solve",
        "aten.linalg_lu",
        "aten.linalg_lu_factor_ex",
        "aten.linalg_lu_solve",
        "aten.linalg_matrix_exp",
        "aten.linalg_pinv",
        "aten.linalg_qr",
        "aten.linalg_solve_triangular",
        "aten.lu_unpack",
        "aten.median",
        "aten.mode",
        "aten.nanmedian",
        "aten.narrow_copy",
        "aten.nextafter",
        "aten.ormqr",
        "aten.polygamma",
        "aten.put",
        "aten.searchsorted",
        "aten.segment_reduce",
        "aten.special_airy_ai",
        "aten.special_bessel_j0",
        "aten.special_bessel_j1",
        "aten.special_bessel_y0",
        "aten.special_bessel_y1",
        "aten.special_chebyshev_polynomial_t",
        "aten.special_chebyshev_polynomial_u",
        "aten.special_chebyshev_polynomial_v",
        "aten.special_chebyshev_polynomial_w",
        "aten.special_erfcx",
        "aten.special_hermite_polynomial_h",
        "aten.special_hermite_polynomial_he",
        "aten.special_i0e",
        "aten.special_i1",
        "aten.special_i1e",
        "aten.special_laguerre_polynomial_l",
        "aten.special_legendre_polynomial_p",
        "aten.special_modified_bessel_i0",
        "aten.special_modified_bessel_i1",
        "aten.special_modified_bessel_k0",
        "aten.special_modified_bessel_k1",
        "aten.special_ndtri",
        "aten.special_scaled_modified_bessel_k0",
        "aten.special_scaled_modified_bessel_k1",
        "aten.special_shifted_chebyshev_polynomial_t",
        "aten.special_shifted_chebyshev_polynomial_u",
        "aten.special_shifted_chebyshev_polynomial_v",
        "aten.special_shifted_chebyshev_polynomial_w",
        "aten.special_spherical_bessel_j0",
        "aten.special_zeta",
        "aten.triangular_solve",
        # Found by trying models as users write them (2026-12-07): each failed
        # a lowering, with a warning and a reproducer, on its first call.
        "aten.linalg_det",
        "aten._linalg_det",
        "aten._upsample_bilinear2d_aa",
        "aten._upsample_bilinear2d_aa_backward",
        "aten._upsample_bicubic2d_aa",
        "aten._upsample_bicubic2d_aa_backward",
        "aten.median",
        "aten.nanmedian",
        "aten.kthvalue",
    }
)

# torch-mlir lowers these to wrong numbers: never lowered.
KNOWN_WRONG = {
    "aten.logcumsumexp": "torch-mlir's lowering overflows (logcumsumexp([100., 50.]) gave inf)",
}

# Lowerable in principle, but eager semantics need torch's own RNG stream.
EAGER_ONLY = frozenset(
    {
        "aten.rand",
        "aten.rand_like",
        "aten.randn",
        "aten.randn_like",
        "aten.randint",
        "aten.randint_like",
        "aten.randperm",
        "aten.bernoulli",
        "aten.native_dropout",
        "aten.normal",
        "aten.uniform",
        "aten.exponential",
        "aten.multinomial",
        "aten.poisson",
    }
)

_ALWAYS_LOWERABLE = frozenset({operator.getitem})


def op_key(target: object) -> str:
    """``aten.add`` for ``aten.add.Tensor``: the unit the table speaks in."""
    if isinstance(target, torch._ops.OpOverload):
        return f"aten.{target._overloadpacket.__name__}" if target.namespace == "aten" else str(target)
    return getattr(target, "__name__", str(target))


def _tensors(value: object) -> list[torch.Tensor]:
    if isinstance(value, torch.Tensor):
        return [value]
    if isinstance(value, (list, tuple)):
        return [t for v in value for t in _tensors(v)]
    return []


def _draws_random_numbers(node: torch.fx.Node) -> bool:
    """PyTorch tags every op that draws from its generator; torch-mlir lowers
    some of them (``rrelu_with_noise``) with a generator of its own, whose
    numbers are not eager's. Attention ops carry the tag for their dropout,
    which passes/attention.py decomposes before anything is placed."""
    return torch.Tag.nondeterministic_seeded in node.target.tags and node.target not in ATTENTION_OPS


def _describe_tensor(tensor: torch.Tensor) -> str:
    """``float32[4]`` (rank) when every size is static, ``float32[?,_,_]`` when some are dynamic."""
    dtype = str(tensor.dtype).removeprefix("torch.")
    dynamic = [isinstance(size, torch.SymInt) for size in tensor.shape]
    if not any(dynamic):
        return f"{dtype}[{tensor.dim()}]"
    return f"{dtype}[{','.join('?' if d else '_' for d in dynamic)}]"


def _non_tensor_arguments(node: torch.fx.Node) -> list[str]:
    """``name=value`` for each argument that is not a tensor and not its default."""
    schema = getattr(node.target, "_schema", None)
    if schema is None:
        return []
    described = []
    for argument in schema.arguments:
        value = _argument(node, argument.name)
        if _holds_tensor(value) or (argument.has_default_value() and _same(value, argument.default_value)):
            continue
        described.append(f"{argument.name}={_describe_value(value)}")
    return described


def _holds_tensor(value: object) -> bool:
    if isinstance(value, torch.fx.Node):
        return isinstance(value.meta.get("val"), torch.Tensor)
    if isinstance(value, (list, tuple)):
        return any(_holds_tensor(v) for v in value)
    return False


def _same(value: object, default: object) -> bool:
    if isinstance(value, (list, tuple)) and isinstance(default, (list, tuple)):
        return list(value) == list(default)
    try:
        return bool(value == default) and type(value) is type(default)
    except Exception:  # a SymInt compared with a default: not the same
        return False


def _describe_value(value: object) -> str:
    """A sizes list, a flag, a dtype; ``?`` for a symbolic size (it is read at run time)."""
    if isinstance(value, torch.fx.Node) or isinstance(value, SYMBOLIC_TYPES):
        return "?"
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(_describe_value(v) for v in value) + "]"
    return str(value)


def _known_bad_lowering(node: torch.fx.Node, key: str) -> Optional[str]:
    """Argument patterns that torch-mlir lowers to a wrong result or a crash, or not at all."""
    if node.target is torch.ops.aten.sort.stable:
        # Left by decompositions/stable_sort.py for 64-bit values only;
        # torch-mlir imports sort.default alone, so it would fail to compile.
        return "torch-mlir has no lowering for sort(stable=True) of 64-bit values"
    schema_args = {a.name for a in node.target._schema.arguments}
    first = node.args[0] if node.args else None
    first_value = first.meta.get("val") if isinstance(first, torch.fx.Node) else None
    keeps_dims = {"dim", "keepdim"} <= schema_args and _argument(node, "keepdim") is True
    if keeps_dims and isinstance(first_value, torch.Tensor) and first_value.dim() == 0:
        # x.sum(0, keepdim=True) on a 0-d tensor segfaults inside torch-mlir
        # (without keepdim it lowers fine).
        return "keepdim reduction of a 0-d tensor crashes torch-mlir"
    if key in ("aten.avg_pool2d", "aten.avg_pool3d") and _argument(node, "ceil_mode") is True:
        spatial = first_value.shape[-3 if key == "aten.avg_pool3d" else -2 :] if isinstance(first_value, torch.Tensor) else ()
        if any(isinstance(size, torch.SymInt) for size in spatial):
            # Static ones are decomposed (decompositions/avg_pool_counts.py); with dynamic
            # sizes torch-mlir's executable returned one window fewer per dim.
            return "torch-mlir sizes ceil_mode windows wrongly when the pooled sizes are dynamic"
    return None


def _argument(node: torch.fx.Node, name: str) -> object:
    for position, argument in enumerate(node.target._schema.arguments):
        if argument.name == name:
            if name in node.kwargs:
                return node.kwargs[name]
            return node.args[position] if position < len(node.args) else argument.default_value
    return None


_OUT_OF_MEMORY = ("bad_alloc", "MemoryError", "out of memory")


class SupportTable:
    """Decides per node whether it lowers; learns from failed lowerings.

    A learned entry is keyed by :meth:`signature`. One learned from another
    process is trusted once it has failed again here (:meth:`confirm`), and
    forgotten when it lowers (:meth:`forget`): callers re-probe such entries
    (:meth:`needs_recheck`) before they partition, one op at a time.
    """

    def __init__(self, learned_path: Optional[Path] = None) -> None:
        from tpu_inductor.runtime.persisted_dict import PersistedDict

        self._learned = PersistedDict(learned_path)
        self._checked: set[str] = set()  # learned or confirmed by this process

    @staticmethod
    def signature(node: torch.fx.Node) -> str:
        """``aten.avg_pool2d(float32[4]; kernel_size=[2, 2], divisor_override=3)``.

        What decides whether torch-mlir lowers a call: the op, each tensor
        input's dtype and rank (``?`` marks a dynamic dim: ``float32[?,_]``),
        and every non-tensor argument that differs from the schema's default.
        A failure of ``avg_pool2d(divisor_override=3)`` says nothing about a
        plain ``AvgPool2d(2)``, nor a depthwise convolution's about a dense one.
        """
        inputs = [_describe_tensor(t) for a in node.all_input_nodes for t in _tensors(a.meta.get("val"))]
        arguments = _non_tensor_arguments(node)
        text = ",".join(inputs) + (f"; {', '.join(arguments)}" if arguments else "")
        return f"{op_key(node.target)}({text})"

    def learn(self, signature: str, reason: str) -> None:
        """Remember that ``signature`` failed to lower alone, here and for later processes.

        Not for later processes when the failure was memory running out: that
        says nothing about the op (every probe after a ``bad_alloc`` failed
        too, mm and add included), and a persisted entry would keep it off
        the device for good.
        """
        transient = any(marker in reason for marker in _OUT_OF_MEMORY)
        self._checked.add(signature)
        self._learned.put(signature, {"reason": reason, "confirmed": False}, persist=not transient)

    def needs_recheck(self, node: torch.fx.Node) -> bool:
        """A failure another process learned for this call, not yet seen here twice."""
        if not self._learned:  # the usual case: no signature to build, per node per compile
            return False
        signature = self.signature(node)
        entry = self._learned.get(signature)
        return entry is not None and not entry["confirmed"] and signature not in self._checked

    def confirm(self, signature: str) -> None:
        """It failed again: trusted from now on, without probing."""
        entry = self._learned.get(signature)
        self._checked.add(signature)
        if entry is not None:
            self._learned.put(signature, {**entry, "confirmed": True}, replace=True)

    def forget(self, signature: str) -> None:
        """It lowers after all (another input, another version of us): drop it."""
        self._checked.add(signature)
        self._learned.pop(signature)

    def learned(self) -> dict[str, dict]:
        """Every learned signature with its reason and whether it was confirmed."""
        return self._learned.items()

    def decide(self, node: torch.fx.Node) -> Optional[Decision]:
        """None when ``node`` lowers; else why not, for placement, reports and errors."""
        if node.op != "call_function":
            return Decision("unsupported", "not an ATen op call")
        if node.target in _ALWAYS_LOWERABLE:
            return None
        if not isinstance(node.target, torch._ops.OpOverload):
            reason = node.meta.get(COND_EAGER_REASON) or f"Python callable {op_key(node.target)} is not an ATen op"
            return Decision("unsupported", reason)
        if node.target.namespace not in ("aten", "prims"):
            # A library's own op: torch-mlir imports it as an opaque operator.
            return Decision(
                "unsupported", f"custom op of '{node.target.namespace}': only ATen and prims ops lower to StableHLO"
            )
        key = op_key(node.target)
        # Sizes of a graph with dynamic shapes (view(x, [s0, 4])) lower as scalar
        # arguments that shape refinement turns into constants.
        inputs = [a.meta.get("val") for a in node.all_input_nodes]
        inputs = [v for v in inputs if not isinstance(v, (torch.SymInt, torch.SymFloat))]
        for value in [node.meta.get("val")] + inputs:
            if value is not None and not isinstance(value, (torch.Tensor, list, tuple)):
                return Decision("unsupported", f"takes or produces a non-tensor value ({type(value).__name__})")
            for tensor in _tensors(value):
                if tensor.dtype not in SUPPORTED_DTYPES:
                    return Decision("unsupported", f"dtype {tensor.dtype} is not supported on the device")
        if free_unbacked_symbols(node.meta.get("val")) or any(
            free_unbacked_symbols(a.meta.get("val")) for a in node.all_input_nodes
        ):
            return Decision("data-dependent", "shape depends on the data")
        if key in KNOWN_UNSUPPORTED:
            return Decision("unsupported", "torch-mlir has no StableHLO lowering for it")
        if key in KNOWN_WRONG:
            return Decision("unsupported", KNOWN_WRONG[key])
        hazard = _known_bad_lowering(node, key)
        if hazard:
            return Decision("unsupported", hazard)
        if key in EAGER_ONLY or _draws_random_numbers(node):
            return Decision("random", "random op: runs in eager to use torch's generator")
        if not self._learned:
            return None
        entry = self._learned.get(self.signature(node))
        return Decision("learned failure", entry["reason"]) if entry is not None else None


class GraphSupport:
    """The shared table plus what one graph keeps off the device by itself.

    What one graph learns here (ops that fail only together, or only with its
    dynamic shapes) is never written to the shared table. On the CPU client
    eager's kernel is the reference and costs no copy, so a ``topk`` whose
    result depends on how that kernel orders ties runs on it
    (analysis/tie_sensitive_ops.py); elsewhere it lowers, and ties come in
    XLA's order (lowest index first).
    """

    def __init__(self, base: SupportTable, platform_name: str = "cpu") -> None:
        self.base = base
        self.local: dict[torch.fx.Node, str] = {}
        self._ties_follow_eager = platform_name == "cpu"

    def decide(self, node: torch.fx.Node) -> Optional[Decision]:
        """None when ``node`` lowers in this graph; else why not."""
        decision = self.base.decide(node)
        if decision is None and node in self.local:
            decision = Decision("fails in this graph", self.local[node])
        if decision is None and self._ties_follow_eager:
            tie_order = tie_order_reason(node)
            decision = Decision("tie order", tie_order) if tie_order else None
        return decision

    def lowers(self, node: torch.fx.Node) -> bool:
        return self.decide(node) is None
