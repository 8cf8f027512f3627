"""Decompose scaled-dot-product attention that was kept whole for the padding analysis.

Why: a graph with dynamic shapes is traced with the CPU attention op
(``_scaled_dot_product_flash_attention_for_cpu``) left whole, so
:mod:`~tpu_inductor.passes.padding_safety` can see ``is_causal`` instead of a
softmax over the key dim, which would look unsafe. torch-mlir cannot lower
the op itself, so right after the analysis this pass replaces it with plain
ATen ops:

* where the key dim is not padded: PyTorch's own decomposition (the same ops
  a static graph gets);
* where it is padded (a proven causal attention): causal attention that also
  zeroes the value rows past the real length, which it reads from an extra
  0-d int64 input ``valid_<symbol>`` (the real size, passed at run time). A
  real query never weighs a padded key (its probability is exactly 0), and
  with the value rows zeroed, ``0 * garbage`` cannot turn into NaN either,
  whatever the padded positions hold; one executable serves every length in
  the bucket.

Before::

    attn = aten._scaled_dot_product_flash_attention_for_cpu(q, k, v, 0.0, True)
    out = attn[0]

After (key dim ``s0`` padded)::

    valid_s0 = placeholder()                      # appended input: the real s0
    scores = bmm(q * c, k^T * c); scores = where(j <= i, scores, -inf)
    out = bmm(softmax(scores), where(arange(S) < valid_s0, v, 0))
"""

from __future__ import annotations

import functools
import math
import operator
from typing import Any, Callable, Optional, Sequence

import sympy
import torch
import torch.fx
from torch.fx.experimental.proxy_tensor import make_fx

from tpu_inductor.passes.decompositions import ATTENTION_OPS, decomposition_table
from tpu_inductor.passes.padding_safety import expr_of

aten = torch.ops.aten

VALID_LENGTH_PREFIX = "valid_"


def decompose_attention(
    gm: torch.fx.GraphModule, padded: frozenset
) -> tuple[torch.fx.GraphModule, list[sympy.Symbol]]:
    """Replace kept-whole attention; return ``gm`` and the symbols whose real
    length it now takes as extra trailing inputs (in order)."""
    graph = gm.graph
    nodes = [n for n in graph.nodes if n.op == "call_function" and n.target in ATTENTION_OPS]
    if not nodes:
        return gm, []
    length_inputs: dict[sympy.Symbol, torch.fx.Node] = {}
    for node in nodes:
        query, key, value = (a.meta["val"] for a in node.args[:3])
        key_len = expr_of(key.shape[-2])
        if isinstance(key_len, sympy.Symbol) and key_len in padded:
            valid = _length_input(gm, length_inputs, key_len, query)
            scale = node.kwargs.get("scale")
            replacement = _trace(
                lambda q, k, v, n: _attention_masking_padded_keys(q, k, v, n, scale),
                (query, key, value, valid.meta["val"]),
            )
            _inline(gm, node, replacement, [*node.args[:3], valid])
        else:
            # Every tensor argument is a traced input: attn_mask too, not only q, k, v.
            inputs = list(node.all_input_nodes)
            replacement = _trace(
                functools.partial(_decomposed, node, inputs), tuple(n.meta["val"] for n in inputs)
            )
            _inline(gm, node, replacement, inputs)
    graph.eliminate_dead_code()  # the decompositions' unused second outputs
    graph.lint()
    gm.recompile()
    return gm, list(length_inputs)


def _decomposed(node: torch.fx.Node, inputs: list[torch.fx.Node], *tensors: torch.Tensor) -> Any:
    """``node``'s op through our decomposition table, its tensor arguments replaced."""
    values = dict(zip(inputs, tensors))
    args = torch.fx.node.map_arg(node.args, values.__getitem__)
    kwargs = torch.fx.node.map_arg(node.kwargs, values.__getitem__)
    return decomposition_table()[node.target](*args, **kwargs)


def _attention_masking_padded_keys(q, k, v, valid_keys, scale: Optional[float]):
    """Causal attention that ignores keys at or past ``valid_keys``.

    Same arithmetic as PyTorch's math attention (both sides scaled by the
    square root of the scale), with the output in the flash kernel's memory
    layout so the graph's later views stay valid.
    """
    head_dim = q.size(-1)
    if scale is not None:
        root = math.sqrt(scale)
    elif isinstance(head_dim, int):
        root = math.sqrt(1.0 / math.sqrt(head_dim))
    else:  # a symbolic head size: compute the scale on the device
        root = torch.rsqrt(torch.sqrt(torch.scalar_tensor(head_dim, dtype=q.dtype)))
    scores = (q * root) @ (k.transpose(-2, -1) * root)
    rows = torch.arange(q.size(-2), device=q.device).unsqueeze(-1)
    cols = torch.arange(k.size(-2), device=q.device).unsqueeze(0)
    scores = torch.where(cols <= rows, scores, float("-inf"))
    probs = torch.softmax(scores, dim=-1)
    real_keys = (torch.arange(k.size(-2), device=q.device) < valid_keys).unsqueeze(-1)
    out = probs @ torch.where(real_keys, v, 0)
    return out.permute(2, 0, 1, 3).contiguous().permute(1, 2, 0, 3), probs


def _length_input(
    gm: torch.fx.GraphModule,
    inputs: dict[sympy.Symbol, torch.fx.Node],
    symbol: sympy.Symbol,
    like: torch.Tensor,
) -> torch.fx.Node:
    if symbol in inputs:
        return inputs[symbol]
    graph = gm.graph
    last = [n for n in graph.nodes if n.op == "placeholder"][-1]
    with graph.inserting_after(list(inputs.values())[-1] if inputs else last):
        node = graph.placeholder(f"{VALID_LENGTH_PREFIX}{symbol}")
    with like.fake_mode:
        node.meta["val"] = torch.empty((), dtype=torch.int64, device=like.device)
    inputs[symbol] = node
    return node


def _trace(fn: Callable, fake_args: Sequence[Any]) -> torch.fx.GraphModule:
    """``fn`` as an ATen graph over ``fake_args``, symbolic sizes kept as sym_size nodes."""
    fake_mode = next(a.fake_mode for a in fake_args if hasattr(a, "fake_mode"))
    with fake_mode:
        return make_fx(fn, decomposition_table=decomposition_table())(*fake_args)


def _inline(
    gm: torch.fx.GraphModule,
    node: torch.fx.Node,
    replacement: torch.fx.GraphModule,
    args: Sequence[torch.fx.Node],
) -> None:
    """Splice ``replacement`` in place of ``node`` (whose users are getitems)."""
    graph = gm.graph
    env: dict[torch.fx.Node, Any] = {}
    placeholders = [n for n in replacement.graph.nodes if n.op == "placeholder"]
    env.update(zip(placeholders, args))
    outputs: Sequence[Any] = ()
    with graph.inserting_before(node):
        for sub in replacement.graph.nodes:
            if sub.op == "placeholder":
                continue
            if sub.op == "output":
                outputs = torch.fx.map_arg(sub.args[0], lambda x: env[x])
                break
            if sub.op == "get_attr":
                name = f"_attention_constant_{len(gm.state_dict())}_{sub.target}"
                setattr(gm, name, getattr(replacement, sub.target))
                env[sub] = graph.get_attr(name)
                env[sub].meta = dict(sub.meta)
                continue
            copied = graph.node_copy(sub, lambda x: env[x])
            for key in ("stack_trace", "nn_module_stack", "source_fn_stack"):
                if key in node.meta:
                    copied.meta[key] = node.meta[key]
            env[sub] = copied
    for user in list(node.users):
        if user.target is operator.getitem:
            user.replace_all_uses_with(outputs[user.args[1]])
            graph.erase_node(user)
    graph.erase_node(node)
