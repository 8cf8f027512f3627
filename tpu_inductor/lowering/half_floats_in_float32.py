"""Compute each bfloat16/float16 op of an island in float32 and round its result once, as eager does.

Why: PyTorch's kernels compute half-precision ops in float32 (``opmath_type``)
and round each result to the op's dtype once; Inductor's generated code does
the same. torch-mlir lowers an op on ``bf16``/``f16`` tensors in that type:
a reduction accumulates in it, and a composite op rounds every step. Found
by OpInfo's float16 samples and then measured against a float32 reference
(the inputs upcast, eager in float32), relative error, eager / tpu before:

* ``avg_pool2d`` over 32x32 windows, bfloat16: 3e-3 / 0.51 (a sum that stops
  growing once its bf16 ulp passes the next term: half the answer);
  ``avg_pool1d`` 3.9e-3 / 7e-2, ``lp_pool2d`` 4.7e-3 / 2.7e-2;
* ``gelu`` (exact and tanh) on [-4, 4]: 2.6e-2 / 0.77 (``1 + erf(x)`` cancels
  in bf16); ``elu`` 3.7e-3 / 3.2e-2;
* ``linalg.vector_norm``: float16 ``ord=3.5`` overflowed to ``inf`` where
  eager gave 8.48 (``|x|^3.5`` in float16); bfloat16 ``ord=1`` 3.9e-3 / 1.2e-2.

Here every op of an island with a half-precision float result and operand
gets its half operands converted to float32, runs in float32, and has its
half results converted back: eager's one rounding per op. A result that
only the next such op reads stays in float32 (:func:`_unrounded`): one
rounding per fused chain, as Inductor's generated code does. Left as
they are: ops that only move, select or compare values (no rounding to
gain: :data:`EXACT`), matmuls and convolutions without a bias (XLA
accumulates their products in float32 on every platform, and a TPU's MXU
takes bf16 operands: :data:`ACCUMULATE_IN_FLOAT32`), random draws (their
bits are the draw) and in-place ops. A matmul or convolution that adds a
bias (:data:`BIAS_ARGUMENT`) computes in float32 like the rest. An op asked
for a half ``dtype`` (``sum(x, dtype=bf16)``) is asked for float32 and its
result rounded. XLA fuses the conversions into the ops' loops. This
replaced per-op decompositions of ``sum``, ``mean`` and ``cumsum`` that did
the same for those three.

Applied at lowering, to the island's graph (static and symbolic paths):
placement, kernel choice and the reports see the graph as traced. Converting
the whole island in place is safe to repeat (a rewritten op no longer has a
half operand) and to run eagerly (it is eager's arithmetic, or closer to
float32 where a chain skips a rounding).

Before: ``%g = gelu(%x)`` with ``%x: bf16``;
after: ``%x32 = convert(%x, f32); %g32 = gelu(%x32); %g = convert(%g32, bf16)``.
"""

from __future__ import annotations

import contextlib
import operator
from typing import Any, Optional

import torch
import torch.fx

from tpu_inductor.half_precision import HALF_FLOATS, is_half
from tpu_inductor.torch_api import detect_fake_mode

EXACT = frozenset({
    # views and copies
    "alias", "as_strided", "clone", "contiguous", "copy", "detach", "expand", "expand_copy", "lift_fresh_copy",
    "narrow", "permute", "permute_copy", "reshape", "select", "slice", "squeeze", "t", "transpose", "unbind",
    "unfold", "unsqueeze", "view", "view_copy", "_unsafe_view", "_to_copy", "diagonal", "movedim",
    # placing, gathering and scattering whole values
    "cat", "stack", "split", "split_with_sizes", "chunk", "constant_pad_nd", "flip", "roll", "repeat",
    "index", "index_select", "gather", "embedding", "take", "masked_fill", "where", "index_copy", "index_fill",
    "index_put", "scatter", "select_scatter", "slice_scatter", "diagonal_scatter", "as_strided_scatter",
    "tril", "triu", "pixel_shuffle", "pixel_unshuffle", "im2col", "fill", "full_like", "zeros_like",
    "ones_like", "empty_like", "new_zeros", "new_ones", "new_full", "new_empty", "resize",
    # picking one of the values, or an exact function of one
    "relu", "neg", "abs", "sign", "ceil", "floor", "trunc", "maximum", "minimum", "fmax", "fmin",
    "clamp", "clamp_min", "clamp_max", "hardtanh", "amax", "amin", "max", "min", "aminmax", "argmax", "argmin",
    "sort", "topk", "kthvalue", "max_pool2d_with_indices", "max_pool3d_with_indices",
    "adaptive_max_pool2d", "adaptive_max_pool3d", "cummax", "cummin", "copysign",
})
"""Ops whose result is one of their operands' values (or an exact function of
one): computing them in float32 and rounding back gives the same bits."""

ACCUMULATE_IN_FLOAT32 = frozenset({
    "mm", "bmm", "addmm", "baddbmm", "addbmm", "addmv", "mv", "dot", "vdot", "matmul", "linear",
    "convolution", "convolution_backward", "_convolution",
})
"""Products XLA accumulates in float32 for half operands on every platform
(its dots and convolutions take a float32 accumulator), whose operands a TPU
wants in bf16."""

BIAS_ARGUMENT = {"addmm": 0, "addmv": 0, "addbmm": 0, "baddbmm": 0, "linear": 2, "convolution": 2, "_convolution": 2}
"""Where the products above that add a bias take it. Eager adds the bias to
the float32 accumulator and rounds once; a half-precision dot rounds the
product first, which is up to 10 ulps of the result where product and bias
cancel (float16 ``linear`` in OpInfo). These compute in float32 like any
other op; ``narrow_dot_operands.py`` hands the dot its half operands again
on the platforms whose matmul units want them, keeping the float32 result."""

RANDOM = frozenset({
    "rand_like", "randn_like", "randint_like", "bernoulli", "normal", "uniform", "exponential", "geometric",
    "cauchy", "log_normal", "native_dropout", "rrelu_with_noise", "multinomial",
})
"""Draws: computing a draw in float32 and rounding it is a different draw."""

_LEFT_ALONE = EXACT | ACCUMULATE_IN_FLOAT32 | RANDOM

_ROUNDED_BACK = "tpu_inductor_rounded_back"
"""Meta key of the conversions back to half precision this rewrite adds."""


def compute_half_floats_in_float32(gm: torch.fx.GraphModule) -> int:
    """Rewrite ``gm`` in place (see the module docstring); returns how many ops now compute in float32."""
    rewritten = 0
    for node in list(gm.graph.nodes):
        if _computes_in_half(node):
            _in_float32(gm.graph, node)
            rewritten += 1
    if rewritten:
        gm.recompile()
    return rewritten


def _packet_name(target: Any) -> Optional[str]:
    if not isinstance(target, torch._ops.OpOverload) or target.namespace != "aten":
        return None
    return target.overloadpacket.__name__


def _computes_in_half(node: torch.fx.Node) -> bool:
    if node.op != "call_function":
        return False
    name = _packet_name(node.target)
    if name is None or name.endswith("_"):
        return False
    if name in _LEFT_ALONE and not _adds_a_bias(node, name):
        return False
    value = node.meta.get("val")
    results = value if isinstance(value, (tuple, list)) else (value,)
    if not any(is_half(result) for result in results):
        return False
    asked_for_half = node.kwargs.get("dtype") in HALF_FLOATS
    return asked_for_half or any(is_half(arg.meta.get("val")) for arg in node.all_input_nodes)


def _adds_a_bias(node: torch.fx.Node, name: str) -> bool:
    position = BIAS_ARGUMENT.get(name)
    if position is None:
        return False
    bias = node.args[position] if len(node.args) > position else node.kwargs.get("bias")
    return isinstance(bias, torch.fx.Node) and is_half(bias.meta.get("val"))


def _in_float32(graph: torch.fx.Graph, node: torch.fx.Node) -> None:
    fake_mode = detect_fake_mode([node.meta.get("val")]) or contextlib.nullcontext()

    def convert(value: torch.fx.Node, dtype: torch.dtype) -> torch.fx.Node:
        converted = graph.call_function(torch.ops.prims.convert_element_type.default, (value, dtype))
        with fake_mode:
            converted.meta["val"] = torch.ops.prims.convert_element_type.default(value.meta["val"], dtype)
        converted.meta["stack_trace"] = node.meta.get("stack_trace") or ""
        return converted

    upcast: dict[torch.fx.Node, torch.fx.Node] = {}
    skipped_roundings = []
    with graph.inserting_before(node):
        for arg in node.all_input_nodes:
            if is_half(arg.meta.get("val")) and arg not in upcast:
                unrounded = _unrounded(arg)
                if unrounded is not None:
                    skipped_roundings.append(arg)
                upcast[arg] = unrounded or convert(arg, torch.float32)
    node.args, node.kwargs = torch.fx.node.map_arg((node.args, node.kwargs), lambda n: upcast.get(n, n))
    for rounding in skipped_roundings:
        graph.erase_node(rounding)  # a rounding of ours that only this op read
    if node.kwargs.get("dtype") in HALF_FLOATS:  # sum(x, dtype=bf16): accumulate in float32 all the same
        node.kwargs = {**node.kwargs, "dtype": torch.float32}

    value = node.meta["val"]
    with fake_mode:
        node.meta["val"] = _as_float32(value)
    node.meta.pop("tensor_meta", None)
    if not isinstance(value, (tuple, list)):
        _round_back(graph, node, value.dtype, convert)
        return
    for user in list(node.users):
        if user.target is operator.getitem and is_half(user.meta.get("val")):
            dtype = user.meta["val"].dtype
            with fake_mode:
                user.meta["val"] = _as_float32(user.meta["val"])
            user.meta.pop("tensor_meta", None)
            _round_back(graph, user, dtype, convert)


def _round_back(graph: torch.fx.Graph, node: torch.fx.Node, dtype: torch.dtype, convert) -> None:
    """``node``'s users read its result converted back to ``dtype``."""
    users = list(node.users)
    with graph.inserting_after(node):
        rounded = convert(node, dtype)
    rounded.meta[_ROUNDED_BACK] = True
    for user in users:
        user.replace_input_with(node, rounded)


def _unrounded(value: torch.fx.Node) -> Optional[torch.fx.Node]:
    """The float32 result that ``value``, a rounding of ours, rounds, where the
    op being rewritten is its only reader; else None.

    Such a pair is one of XLA's fused loops (a producer fused into its one
    reader), and Inductor's generated code keeps a fused chain in float32 and
    rounds once, where it stores: so does this. PyTorch's ``addcdiv(x, a, b,
    value=v)`` reaches the backend as Dynamo's ``x + (a / b) * v``, and
    ``mean`` as a sum and a division: rounding after each put float16's
    OpInfo samples of ``addcdiv`` 2.7 ulps and of
    ``multilabel_soft_margin_loss`` 5 ulps from float32, where eager's
    kernels round once. A value read twice (a residual stream) is rounded,
    as eager and Inductor store it.
    """
    if not value.meta.get(_ROUNDED_BACK) or len(value.users) != 1:
        return None
    return value.args[0]


def _as_float32(value: Any) -> Any:
    """``value`` (a FakeTensor or a tuple of them) with its half tensors as float32."""
    if isinstance(value, (tuple, list)):
        return type(value)(_as_float32(v) for v in value)
    if not is_half(value):
        return value
    return torch.empty_strided(value.shape, value.stride(), dtype=torch.float32, device=value.device)
