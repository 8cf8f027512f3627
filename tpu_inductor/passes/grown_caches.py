"""Keep a cache grown by ``cat`` on the device between calls; fetch only its new rows.

Why: transformers' default ``DynamicCache`` grows each layer's keys and
values by ``cat([cache, new], dim=-2)`` at every decode step and hands the
result to the next step. In a padded (symbolic) graph on a client that does
not share host memory with torch (a TPU, ``zero_copy=False``) the whole new
cache came down at every token (cut back to its real length on the host),
and at the next token its padded copy went up again: at ~50M parameters,
663 KB up and 808 KB down a token for a 737 KB cache.

Here the host builds the new cache itself, ``cat([cache, new])`` of the
argument it already holds and the new rows, which are all that comes down;
and the device's new value, cut to the bucket the cache came in at (it holds
the real rows and zero padding: passes/padded_positions.py writes the new
rows at the real end), is handed on unfetched, as the padded device copy of
the host's new cache (dynamic/device_caches.py). The next call, whose cache
is one position longer and usually in the same bucket, takes that buffer
instead of a padded upload.

Before: ``%c = cat([%cache, %new], 2)``, returned (and read by attention);
after: ``%c`` still read on the device; returned instead: ``%kept =
slice(%c, 2, 0, %s)`` (``%s``: the cache's length, the bucket in a padded
call), marked :data:`DEVICE_ONLY_RESULT`, and ``%new`` as an extra output.

Only for an output that is ``cat`` of exactly a graph input, read by nothing
else, and one more part, along a dim of the input that padding may change
and whose size a ``SymInt`` input carries; the new part's length along it
must not be padded. :func:`find_grown_caches` runs before
passes/padded_positions.py realigns the ``cat`` (it must still see it);
:func:`keep_grown_caches` runs after every other stage.
"""

from __future__ import annotations

import dataclasses
from typing import Optional

import sympy
import torch
import torch.fx

from tpu_inductor.analysis.padding_safety import expr_of
from tpu_inductor.passes.input_writes_in_place import DEVICE_ONLY_RESULT, set_outputs
from tpu_inductor.passes.padded_positions import concatenation_parts
from tpu_inductor.passes.rewrite import GraphBuilder

aten = torch.ops.aten


@dataclasses.dataclass(frozen=True)
class GrownCache:
    """One output that is an input grown along ``dim`` by the output at ``new_rows``."""

    position: int
    """The graph output that is the grown cache."""
    input_index: int
    """The graph input it grows."""
    dim: int
    new_rows: int
    """The extra output holding what is appended."""
    length_input: int
    """The ``SymInt`` input that is the cache's length along ``dim``."""


@dataclasses.dataclass(frozen=True)
class GrownCaches:
    """The grown caches of one padded graph, and how many outputs are the graph's own."""

    num_outputs: int
    caches: tuple[GrownCache, ...]

    @property
    def inputs(self) -> frozenset[int]:
        """The grown inputs: a call may take their padded device copies."""
        return frozenset(c.input_index for c in self.caches)


def find_grown_caches(gm: torch.fx.GraphModule, padded: frozenset) -> tuple[torch.fx.GraphModule, Optional[GrownCaches]]:
    """Each output that grows an input by ``cat`` along a padded dim; its new
    part becomes an extra output. ``padded``: the symbols padding may change."""
    output = gm.graph.output_node()
    results = output.args[0]
    if not isinstance(results, (list, tuple)):
        return gm, None
    results = list(results)
    num_outputs = len(results)
    placeholders = list(gm.graph.find_nodes(op="placeholder"))
    lengths = {
        expr_of(node.meta["val"]): index
        for index, node in enumerate(placeholders)
        if isinstance(node.meta.get("val"), torch.SymInt) and isinstance(expr_of(node.meta["val"]), sympy.Symbol)
    }
    caches: list[GrownCache] = []
    for position, node in enumerate(results[:num_outputs]):
        found = _grown_input(node, padded, lengths)
        if found is None:
            continue
        cache, new, dim, length_input = found
        input_index = placeholders.index(cache)
        if any(c.input_index == input_index for c in caches):  # the same cat returned twice
            continue
        results.append(new)
        caches.append(GrownCache(position, input_index, dim, len(results) - 1, length_input))
    if not caches:
        return gm, None
    set_outputs(gm, results)
    return gm, GrownCaches(num_outputs, tuple(caches))


def _grown_input(
    node: object, padded: frozenset, lengths: dict[sympy.Expr, int]
) -> Optional[tuple[torch.fx.Node, torch.fx.Node, int, int]]:
    """``(input, new part, dim, length input)`` where ``node`` is ``cat([input, new], dim)``
    as :func:`find_grown_caches` takes it."""
    if not isinstance(node, torch.fx.Node) or node.target is not aten.cat.default:
        return None
    dim, parts = concatenation_parts(node)
    if len(parts) != 2 or len(node.args[0]) != 2:
        return None
    cache, new = parts
    if cache.op != "placeholder" or list(cache.users) != [node]:
        return None
    cache_val, new_val = cache.meta.get("val"), new.meta.get("val")
    if not isinstance(cache_val, torch.Tensor) or not isinstance(new_val, torch.Tensor):
        return None
    length = expr_of(cache_val.shape[dim])
    if length not in padded or length not in lengths or expr_of(new_val.shape[dim]).free_symbols & padded:
        return None
    return cache, new, dim, lengths[length]


def keep_grown_caches(gm: torch.fx.GraphModule, grown: GrownCaches) -> torch.fx.GraphModule:
    """Return each grown cache's device value cut to the input's (padded)
    length, unfetched, in place of the whole new cache."""
    graph = gm.graph
    output = graph.output_node()
    results = list(output.args[0])
    placeholders = list(graph.find_nodes(op="placeholder"))
    for cache in grown.caches:
        value = results[cache.position]
        length = placeholders[cache.length_input]
        with graph.inserting_before(output):
            cut = GraphBuilder(graph, value).call(aten.slice.Tensor, value, cache.dim, 0, length)
        cut.meta[DEVICE_ONLY_RESULT] = True
        results[cache.position] = cut
    set_outputs(gm, results)
    return gm
