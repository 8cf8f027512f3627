"""What the torch and jaxlib versions under test change in the tests' expectations
(torch 2.11 to 2.13, jaxlib 0.10 to 0.11 supported; docs/versions.md)."""

from __future__ import annotations

import jaxlib.version
import pytest
import torch

TORCH = tuple(int(part) for part in torch.__version__.split("+")[0].split(".")[:2])
JAXLIB = tuple(int(part) for part in jaxlib.version.__version__.split(".")[:2])

needs_torch_2_12 = pytest.mark.skipif(
    TORCH < (2, 12), reason="PyTorch decomposes this op from 2.12 on; before, it runs eagerly (docs/versions.md)"
)


def dynamo_breaks_on_deepcopy() -> bool:
    """Dynamo before 2.12 cannot trace ``copy.deepcopy`` (transformers' config
    copies in T5, BART and Whisper): a graph break there, with eager's numbers."""
    return TORCH < (2, 12)


def xla_aborts_on_extent_overflow() -> bool:
    """XLA:CPU aborts the process compiling a broadcast to more elements than
    an int64 counts ("overflow in static extent product") in jaxlib 0.10;
    jaxlib 0.11's raises an INVALID_ARGUMENT error instead (0.10.2 and 0.11.2
    measured)."""
    return JAXLIB < (0, 11)
