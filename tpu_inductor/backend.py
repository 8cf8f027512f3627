"""The ``tpu`` Dynamo backend: Dynamo graph -> AOTAutograd -> islands on PJRT.

Registered under the ``torch_dynamo_backends`` entry point, so
``torch.compile(model, backend="tpu", options={...})`` needs no import.
AOTAutograd traces forward and backward ATen graphs with our decomposition
table and handles input mutation, aliasing and autograd; each ATen graph then
goes to :func:`tpu_inductor.compiled_graph.compile_graph`.
"""

from __future__ import annotations

import functools
from typing import Any, Callable, Mapping, Optional, Sequence

import torch
from torch._dynamo.backends.common import aot_autograd

from tpu_inductor.compiled_graph import CompileContext, compile_graph
from tpu_inductor.config import Config
from tpu_inductor.passes.decompositions import decomposition_table


def tpu_backend(
    gm: torch.fx.GraphModule,
    example_inputs: Sequence[Any],
    options: Optional[Mapping[str, Any]] = None,
) -> Callable[..., Any]:
    """Compile one Dynamo graph; ``options`` come from ``torch.compile(options=...)``."""
    context = CompileContext.create(Config.load(options))

    def compiler(kind: str):
        return functools.partial(_compile_aten, kind=kind, context=context)

    return aot_autograd(
        fw_compiler=compiler("forward"),
        bw_compiler=compiler("backward"),
        inference_compiler=compiler("inference"),
        decompositions=decomposition_table(),
    )(gm, example_inputs)


def _compile_aten(gm, example_inputs, *, kind: str, context: CompileContext):
    return compile_graph(gm, example_inputs, kind, context)
