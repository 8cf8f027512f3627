"""How each island's arguments are laid out over the device mesh.

Why: XLA's SPMD partitioner needs a sharding for every argument and result
of an island (``Config.mesh``). The default is data parallel: parameters
and buffers are replicated on every device, every other tensor whose dim 0
is the batch (the size of dim 0 of the region's inputs that are not
parameters or buffers) is split along it over the mesh's first axis.
Results take the sharding XLA's propagation gives them (an activation
computed per device stays split: no all-gather in the program; a backward
takes what its forward saved split the same way), except a parameter's
gradient, which is replicated, so a training step's gradients
are summed by the all-reduce XLA inserts. runtime/sharded.py puts split
results together on the host, so the graph around the island sees whole
tensors.
A :func:`tpu_inductor.shard` hint on a parameter replaces its default.

A sharding never changes the numbers a program computes, only where they
are computed and what moves between devices, so a guess that does not fit
(an activation whose dim 0 is not the batch) costs communication only.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Collection, Mapping, Optional, Sequence

import torch
import torch.fx

from tpu_inductor.errors import ConfigError
from tpu_inductor.runtime.mesh import Mesh, Spec, parse_mesh

_HINT = "_tpu_inductor_spec"


def shard(tensor: torch.Tensor, *mesh_and_spec: Any) -> torch.Tensor:
    """``shard(tensor, spec)`` or ``shard(tensor, mesh, spec)``: ask for ``tensor``
    (a parameter or an input) to be laid out over the mesh as ``spec`` says:
    per dim, the mesh axis it is split over, or None.

    ``tpu_inductor.shard(layer.weight, ("model", None))`` splits a Linear's
    output features over the ``model`` axis (tensor parallel). ``mesh``, when
    given (``{"data": 2, "model": 2}``, as the option is written), must be the
    one the graph is compiled with. Read when a graph is compiled with the
    ``mesh`` option; a dim the axis does not divide is replicated. Returns
    ``tensor``.
    """
    if len(mesh_and_spec) not in (1, 2):
        raise TypeError("shard(tensor, spec) or shard(tensor, mesh, spec)")
    spec = mesh_and_spec[-1]
    mesh = parse_mesh(mesh_and_spec[0]) if len(mesh_and_spec) == 2 else None
    if isinstance(spec, str) or not all(axis is None or isinstance(axis, str) for axis in spec):
        raise TypeError(f"a spec names a mesh axis (str) or None per dim, such as ('model', None); got {spec!r}")
    setattr(tensor, _HINT, (mesh, tuple(spec)))
    return tensor


def hints_of(example_inputs: Sequence[Any], mesh: tuple[tuple[str, int], ...]) -> dict[int, Spec]:
    """Input position -> the spec :func:`shard` put on that (real) input; a hint
    made for another mesh than ``mesh`` (``Config.mesh``) is a clear error."""
    hints = {}
    for position, tensor in enumerate(example_inputs):
        if not hasattr(tensor, _HINT):
            continue
        hinted_mesh, spec = getattr(tensor, _HINT)
        if hinted_mesh is not None and hinted_mesh != mesh:
            raise ConfigError(
                f"tpu_inductor.shard was given the mesh {dict(hinted_mesh)} for a tensor of shape "
                f"{tuple(tensor.shape)}, but the graph compiles for the mesh {dict(mesh)} (the 'mesh' "
                "option, TPU_INDUCTOR_MESH); give both the same mesh"
            )
        unknown = [axis for axis in spec if axis is not None and axis not in dict(mesh)]
        if unknown:
            raise ConfigError(
                f"tpu_inductor.shard names mesh axes {unknown} that the mesh {dict(mesh)} does not have "
                f"(a tensor of shape {tuple(tensor.shape)})"
            )
        hints[position] = spec
    return hints


def dynamo_inputs(gm: torch.fx.GraphModule, kind: str) -> dict[int, torch.fx.Node]:
    """Dynamo input position -> its placeholder in an ATen graph of ``kind``.

    An inference or forward graph's first placeholders are Dynamo's inputs
    in order (AOTAutograd's primals); a backward graph reads the primals it
    saved under their forward names (``primals_<position + 1>``), beside
    activations and tangents."""
    placeholders = gm.graph.find_nodes(op="placeholder")
    if kind != "backward":
        return dict(enumerate(placeholders))
    by_name = {node.name: node for node in placeholders}
    saved = (int(name.removeprefix("primals_")) - 1 for name in by_name if name.startswith("primals_"))
    return {position: by_name[f"primals_{position + 1}"] for position in saved}


@dataclasses.dataclass(frozen=True)
class MeshLayout:
    """How one graph's islands lie over the mesh: its parameters, hints and batch."""

    mesh: Mesh
    parameters: frozenset
    hints: Mapping[torch.fx.Node, Spec]
    batch: Any
    """The batch size (:func:`batch_size`): an int, a symbolic size's expression, or None."""
    replicated_results: frozenset = frozenset()
    """Nodes of the graph that are parameters' gradients: replicated, so that
    XLA sums them with an all-reduce (not a reduce-scatter)."""
    saved: Mapping[str, Spec] = dataclasses.field(default_factory=dict)
    """A backward's inputs that its forward saved (by name: AOTAutograd names
    a saved value's placeholder after the forward's node) -> the spec XLA gave
    that result in the forward, so the backward takes it split the same way."""

    def input_shardings(
        self,
        inputs: Sequence[torch.fx.Node],
        shapes: Sequence[tuple[int, ...]],
        sizes: Mapping[Any, int] = {},
    ) -> list[Spec]:
        """One spec per tensor input of an island (the owner graph's nodes it
        reads, in order), at ``shapes``; ``sizes``: a bucket's symbol values."""
        batch = self.batch
        if batch is not None and not isinstance(batch, int):
            batch = int(batch.xreplace(dict(sizes)))
        specs = []
        for node, shape in zip(inputs, shapes):
            if node in self.hints:
                specs.append(self.mesh.fit(self.hints[node], shape))
            elif node.op == "placeholder" and node.name in self.saved:
                specs.append(self.mesh.fit(self.saved[node.name], shape))
            elif node not in self.parameters and shape and shape[0] == batch:
                specs.append(self.mesh.fit((self.mesh.batch_axis,), shape))
            else:
                specs.append(self.mesh.fit((), shape))
        return specs


    def output_shardings(self, outputs: Sequence[torch.fx.Node], count: int) -> list[Optional[Spec]]:
        """One spec per result of an island (the owner graph's nodes it returns):
        replicated for a parameter's gradient, None (XLA chooses) for the rest.
        Replicated throughout when the island's results are not exactly its
        ``outputs`` (``count`` of them)."""
        if len(outputs) != count:
            return [()] * count
        return [() if node in self.replicated_results else None for node in outputs]


def gradients_of_parameters(gm: torch.fx.GraphModule, kind: str, parameters: Collection[int]) -> frozenset:
    """The nodes a backward graph returns as the gradients of the Dynamo inputs
    at ``parameters`` (a backward returns one gradient per forward input, in order)."""
    if kind != "backward":
        return frozenset()
    returned = gm.graph.output_node().args[0]
    return frozenset(
        returned[i] for i in parameters if i < len(returned) and isinstance(returned[i], torch.fx.Node)
    )


def batch_size(inputs: Sequence[torch.fx.Node], parameters: Collection[torch.fx.Node]) -> Any:
    """The size of dim 0 that a graph's Dynamo inputs other than parameters and
    buffers share (``input_ids`` and ``labels``): an int, or a symbolic size's
    expression; None when they disagree."""
    from tpu_inductor.analysis.padding_safety import expr_of

    sizes = set()
    for node in inputs:
        value = node.meta.get("val")
        if node not in parameters and isinstance(value, torch.Tensor) and value.dim() > 0:
            size = value.shape[0]
            sizes.add(int(size) if isinstance(size, int) else expr_of(size))
    return sizes.pop() if len(sizes) == 1 else None


def tensor_inputs(island: Any) -> list[torch.fx.Node]:
    """The island's inputs that are tensors (its executable's arguments), in order."""
    return [n for n in island.inputs if isinstance(n.meta.get("val"), torch.Tensor)]
