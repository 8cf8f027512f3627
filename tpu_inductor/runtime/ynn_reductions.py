"""Keep XLA:CPU's short reductions off YNNPACK.

Why: jaxlib's XLA:CPU hands f32 ``reduce`` ops over large operands to
YNNPACK (a "library fusion", run on its intra-op pool) as well as its dots.
For a reduce over many short rows that is slower than XLA's own loop:
measured in jax on this repository's 2-core machine (``exp(x).sum(-1)``,
three runs each), YNNPACK took 88-168 us for [4608, 16] against 62-65 us
without it, and was slower or even at [9216, 8] and [4608, 32]; from 64
elements a row it was faster (62-116 us against 95-111 for [1152, 64]).
MobileNet-style models pool their squeeze-excite inputs and their head over
4x4 and 8x8 pixels, and one such reduce, fused with the 1x1 convolution that
follows it, took 374 us of a 4 ms island. With YNNPACK's reductions off
(``xla_cpu_experimental_ynn_fusion_type`` naming its dots only) perf.py's
MobileNet-style island ran 1.09-1.13x faster, paired in one process, five
runs, and the whole model 1.10-1.12x (three runs). The same switch made the
decoder of perf.py 1-4% slower (its layer norms and softmaxes reduce rows of
128 and 256), so it is set only for a module that has a short reduction, per
executable, never process-wide.

The option lists the fusion types YNNPACK keeps: jaxlib 0.10's defaults are
its dots and its reductions (tests/test_ynn_reductions.py checks that the
list below, with reductions added back, compiles to the default's HLO).
"""

from __future__ import annotations

import logging
import math
from typing import Any, Optional, Union

from tpu_inductor.runtime import jaxlib_api

log = logging.getLogger(__name__)

USER_FLAG = "xla_cpu_experimental_ynn_fusion_type"
DOTS_ONLY = (USER_FLAG, "LIBRARY_FUSION_TYPE_INDIVIDUAL_DOT")
"""The override: YNNPACK keeps its dots, XLA's loops do the reductions."""

SHORT_ROW = 64
"""A reduce over fewer elements per result than this is short."""
OFFLOADED_ELEMENTS = 32 * 1024
"""Smaller operands stay in XLA's loops anyway (XLA's ``IsReduceOpOffloadedToYnn``)."""


def applies(platform: Any, xla_flags: str) -> bool:
    """Whether an executable for ``platform`` gets the choice: the CPU client,
    and no fusion types named in ``XLA_FLAGS``."""
    return platform.name == "cpu" and USER_FLAG not in xla_flags


def short_reduction(module: Union[bytes, str]) -> Optional[str]:
    """The first f32 ``stablehlo.reduce`` in ``module`` over fewer than
    :data:`SHORT_ROW` elements per result whose operand YNNPACK would take,
    described (``"reduce over 16 of f32[8,576,4,4]"``); None when there is none."""
    from jaxlib.mlir import ir

    found: list[str] = []

    def visit(op: Any) -> Any:
        if op.name == "stablehlo.reduce":
            operand = ir.RankedTensorType(op.operands[0].type)
            dims = list(ir.DenseI64ArrayAttr(op.attributes["dimensions"]))
            row = math.prod(operand.shape[d] for d in dims)
            if (
                str(operand.element_type) == "f32"
                and math.prod(operand.shape) >= OFFLOADED_ELEMENTS
                and 0 < row < SHORT_ROW
            ):
                found.append(f"reduce over {row} of f32[{','.join(map(str, operand.shape))}]")
                return ir.WalkResult.INTERRUPT  # the first one decides
        return ir.WalkResult.ADVANCE

    try:
        with jaxlib_api.mlir_context():
            ir.Module.parse(module).operation.walk(visit)
    except Exception as exc:  # a tuning decision: a module we cannot read compiles with XLA's defaults
        log.debug("tpu_inductor: could not read the module's reductions (%s)", exc)
        return None
    return found[0] if found else None


def dots_only(options: Any) -> Any:
    """A copy of the compile ``options`` where YNNPACK runs dots only."""
    return jaxlib_api.with_option_override(options, DOTS_ONLY)
