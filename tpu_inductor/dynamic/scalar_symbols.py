"""Symbols that size no tensor: the graph compiles once, statically; its
numbers reach the device as 0-d tensors and its number outputs are computed
in Python.

Why: Dynamo turns a Python int that changes between calls into a graph input
(a SymInt) even when no tensor's size depends on it. transformers'
sliding-window static cache is the common case: it counts the tokens it has
seen in ``cumulative_length_int``; a decode step adds that count to an
``arange`` for the positions and returns it plus one. Sent down the bucketed
path (:mod:`.graph`), such a graph compiled one executable per bucket of a
number that pads nothing (Gemma 3 and Mistral: 3 executables for the decode
step over 32 tokens, and more on every longer prompt), and, being
"dynamic", left its cache writes to eager PyTorch after each call.

When every tensor in the graph has static sizes and strides, the graph
splits exactly: number-only nodes (a symbol and the arithmetic on it) are
evaluated in Python from the call's arguments, as Dynamo's own wrapper would,
and a tensor op that reads a symbol as a scalar operand reads it as a 0-d
tensor input instead. PyTorch's type promotion gives a 0-d tensor of the
same kind (int64 for an int, float64 for a float, bool) the result dtype a
Python number gives, and each rewritten op is checked on fake tensors before
the graph is touched. Any other use of a symbol (a size, a Scalar-only
argument) leaves the graph to the bucketed path.
"""

from __future__ import annotations

import dataclasses
import functools
import logging
from typing import Any, Callable, Optional

import torch
import torch.fx

from tpu_inductor.dynamic import SYMBOLIC_TYPES

log = logging.getLogger(__name__)

aten = torch.ops.aten

_TENSOR_FORMS = {
    **{op.Tensor: op.Tensor for op in (aten.add, aten.sub, aten.mul, aten.div)},
    **{op.Scalar: op.Tensor for op in (aten.eq, aten.ne, aten.lt, aten.le, aten.gt, aten.ge)},
    **{op.Tensor: op.Tensor for op in (aten.eq, aten.ne, aten.lt, aten.le, aten.gt, aten.ge)},
}
"""Ops that take a number where a tensor may stand, and the overload that takes the tensor."""

_DTYPES = {torch.SymInt: torch.int64, torch.SymFloat: torch.float64, torch.SymBool: torch.bool}


def _layout_symbols(value: Any) -> set:
    """The symbols in the sizes, strides and offset of the tensors in ``value``."""
    if isinstance(value, torch.Tensor):
        sizes = (*value.shape, *value.stride(), value.storage_offset())
        return {s for size in sizes if isinstance(size, torch.SymInt) for s in size.node.expr.free_symbols}
    if isinstance(value, (tuple, list)):
        return set().union(*(_layout_symbols(item) for item in value))
    return set()


@dataclasses.dataclass
class NumberSplit:
    """How a graph splits (:func:`plan`)."""

    numbers: list[torch.fx.Node]
    """Symbolic inputs that size no tensor and the arithmetic on them, in graph order."""
    read_as_tensors: list[torch.fx.Node]
    """Those inputs that tensor ops read; they become 0-d tensor inputs."""


def plan(gm: torch.fx.GraphModule) -> Optional[NumberSplit]:
    """The split of ``gm``'s number-only symbols, or None when it has none or
    one is unbacked or used other than in arithmetic on numbers and as a tensor
    operand of :data:`_TENSOR_FORMS` (the graph then stays as it is). Symbols
    that size tensors stay in the graph, for the bucketed path."""
    nodes = [node for node in gm.graph.nodes if node.op != "output"]
    sizing = set().union(*(_layout_symbols(node.meta.get("val")) for node in nodes))
    numbers: list[torch.fx.Node] = []
    number_set: set[torch.fx.Node] = set()
    read_as_tensors: dict[torch.fx.Node, None] = {}
    for node in nodes:
        value = node.meta.get("val")
        read = [source for source in node.all_input_nodes if source in number_set]
        if isinstance(value, SYMBOLIC_TYPES) and not value.node.expr.free_symbols & sizing:
            if node.op == "placeholder" and value.node.hint is None:
                return None  # unbacked: no value to trace the tensors at
            if node.op == "placeholder" or len(read) == len(node.all_input_nodes):
                numbers.append(node)
                number_set.add(node)
                continue
        if not read:
            continue
        if node.target not in _TENSOR_FORMS or node.kwargs.get("alpha") in number_set:
            return None
        if any(source.op != "placeholder" or not _same_result(node, source) for source in read):
            return None  # arithmetic on a symbol feeding a tensor op: not worth a second program
        read_as_tensors.update(dict.fromkeys(read))
    return NumberSplit(numbers, list(read_as_tensors)) if numbers else None


def _fake_zero_d(number: Any, reader: torch.Tensor) -> torch.Tensor:
    """A fake 0-d tensor standing for the symbolic ``number``, in the fake mode
    of ``reader`` (the fake value of a tensor op that reads it)."""
    with reader.fake_mode:
        return torch.empty((), dtype=_DTYPES[type(number)])


def _same_result(node: torch.fx.Node, number: torch.fx.Node) -> bool:
    """Whether ``node`` with ``number`` as a 0-d tensor gives the dtype and
    shape it gave with the number (checked on fake tensors)."""
    expected = node.meta.get("val")
    if not isinstance(expected, torch.Tensor):
        return False
    if getattr(expected, "fake_mode", None) is None:
        return False
    zero_d = _fake_zero_d(number.meta["val"], expected)
    with expected.fake_mode:

        def value_of(arg: Any) -> Any:
            if arg is number:
                return zero_d
            return arg.meta["val"] if isinstance(arg, torch.fx.Node) else arg

        args = torch.fx.node.map_aggregate(node.args, value_of)
        kwargs = torch.fx.node.map_aggregate(node.kwargs, value_of)
        try:
            got = _TENSOR_FORMS[node.target](*args, **kwargs)
        except Exception:  # noqa: BLE001 - any failure means "do not rewrite"
            return False
    return got.dtype == expected.dtype and tuple(got.shape) == tuple(expected.shape)


class NumbersBeside:
    """AOTAutograd's boxed callable for a graph split by :func:`split`: the
    tensor part's compiled graph, the numbers computed in Python."""

    def __init__(self, tensors: Callable[[list], Any], numbers: Callable[..., tuple], number_inputs: list[int],
                 positions: list[int], tensor_inputs: dict[int, torch.dtype]) -> None:
        self._boxed_call = True
        self.tensors = tensors
        self.numbers = numbers
        self.number_inputs = number_inputs
        self.positions = positions
        self.tensor_inputs = tensor_inputs
        self.record = getattr(tensors, "record", None)

    def __call__(self, args: list[Any]) -> Any:
        numbers = self.numbers(*[args[i] for i in self.number_inputs])  # before the boxed call frees args
        for i, dtype in self.tensor_inputs.items():
            args[i] = torch.tensor(args[i], dtype=dtype)
        outputs = list(self.tensors(args))
        for position, value in zip(self.positions, numbers):
            outputs[position] = value
        return outputs


def split(gm: torch.fx.GraphModule, found: NumberSplit) -> Callable[[Callable[[list], Any]], NumbersBeside]:
    """Cut ``found.numbers`` out of ``gm``, in place: number outputs become
    None, symbolic inputs that tensor ops read become 0-d tensor inputs, the
    others take the value they were traced at. Returns what wraps the
    compiled ``gm`` into the graph's callable (:class:`NumbersBeside`)."""
    placeholders = list(gm.graph.find_nodes(op="placeholder"))
    number_set = set(found.numbers)
    output = gm.graph.output_node()
    results = output.args[0]
    single = not isinstance(results, (tuple, list))
    results = [results] if single else list(results)
    positions = [i for i, value in enumerate(results) if value in number_set]

    program = torch.fx.Graph()
    copied: dict[torch.fx.Node, torch.fx.Node] = {}
    number_inputs = []
    for node in found.numbers:
        if node.op == "placeholder":
            number_inputs.append(placeholders.index(node))
        copied[node] = program.node_copy(node, lambda n: copied[n])
    program.output(tuple(copied[results[i]] for i in positions))
    numbers = torch.fx.GraphModule(torch.nn.Module(), program).forward

    log.debug("symbols %s size no tensor: compiled once, %d read as 0-d tensors, %d output(s) computed in Python",
              [str(n.meta["val"]) for n in found.numbers if n.op == "placeholder"], len(found.read_as_tensors),
              len(positions))
    for i in positions:
        results[i] = None
    output.args = (results[0] if single else type(output.args[0])(results),)
    tensor_inputs: dict[int, torch.dtype] = {}
    for node in found.read_as_tensors:
        value = node.meta["val"]
        tensor_inputs[placeholders.index(node)] = _DTYPES[type(value)]
        reader = next(u for u in node.users if isinstance(u.meta.get("val"), torch.Tensor))
        node.meta["val"] = _fake_zero_d(value, reader.meta["val"])
        for user in list(node.users):
            if user.op == "call_function" and user.target in _TENSOR_FORMS:
                user.target = _TENSOR_FORMS[user.target]
    for node in reversed(found.numbers):
        if node.op != "placeholder":
            gm.graph.erase_node(node)
        elif node not in found.read_as_tensors:
            node.meta["val"] = node.meta["val"].node.hint
    gm.recompile()
    return functools.partial(NumbersBeside, numbers=numbers, number_inputs=number_inputs, positions=positions,
                             tensor_inputs=tensor_inputs)
