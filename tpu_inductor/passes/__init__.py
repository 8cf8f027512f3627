"""ATen graph passes: one pass a file, each ``gm -> gm``, each saying why.

:func:`run_passes` runs the cleanup pipeline under PyTorch's
``GraphTransformObserver``, so a diff per pass is one flag away
(``torch._inductor.config.trace.log_url_for_graph_xform``).
"""

from __future__ import annotations

import logging
from typing import Callable

import torch.fx
from torch.fx.passes.graph_transform_observer import GraphTransformObserver

from tpu_inductor.passes.as_strided_as_gather import as_strided_as_gather
from tpu_inductor.passes.clamp_slice_bounds import clamp_slice_bounds
from tpu_inductor.passes.cleanup import remove_dead_code
from tpu_inductor.passes.complex_as_real_pairs import complex_as_real_pairs
from tpu_inductor.passes.conditionals_as_selects import conditionals_as_selects
from tpu_inductor.passes.cuda_attention import cuda_attention_as_cpu_attention
from tpu_inductor.passes.empty_as_zeros import empty_as_zeros
from tpu_inductor.passes.empty_slices_at_the_end import empty_slices_at_the_end
from tpu_inductor.passes.flex_attention_as_math import flex_attention_as_math
from tpu_inductor.passes.inline_subgraph_calls import inline_subgraph_calls
from tpu_inductor.passes.mask_index_put_as_where import mask_index_put_as_where
from tpu_inductor.passes.pad_into_convolution import pad_into_convolution
from tpu_inductor.passes.scalar_tensor_as_full import scalar_tensor_as_full
from tpu_inductor.passes.splat_constants import splat_constants
from tpu_inductor.passes.true_divide_as_div import true_divide_as_div
from tpu_inductor.passes.wrap_negative_indices import wrap_negative_indices

log = logging.getLogger(__name__)

GraphPass = Callable[[torch.fx.GraphModule], torch.fx.GraphModule]

# Correctness rewrites first (each works around a wrong lowering), then
# simplification and cleanup.
PIPELINE: tuple[GraphPass, ...] = (
    # First, each a call of a subgraph made plain ATen ops, which the
    # rewrites after them then see (a region's body or a branch may hold a
    # flex_attention).
    inline_subgraph_calls,
    conditionals_as_selects,
    flex_attention_as_math,
    cuda_attention_as_cpu_attention,
    scalar_tensor_as_full,
    splat_constants,
    true_divide_as_div,
    empty_as_zeros,
    mask_index_put_as_where,
    wrap_negative_indices,
    clamp_slice_bounds,
    empty_slices_at_the_end,
    as_strided_as_gather,
    # After the rewrites that make complex fills (empty, scalar_tensor) and
    # gathers (as_strided), which it then rewrites in turn.
    complex_as_real_pairs,
    pad_into_convolution,
    remove_dead_code,
)


def run_passes(gm: torch.fx.GraphModule) -> torch.fx.GraphModule:
    for graph_pass in PIPELINE:
        with GraphTransformObserver(gm, graph_pass.__name__, subsystem="tpu_inductor"):
            gm = graph_pass(gm)
    return gm


__all__ = ["PIPELINE", "run_passes"]
