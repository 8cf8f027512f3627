"""What the torch version under test changes in the tests' expectations (2.11 to 2.13 supported)."""

from __future__ import annotations

import pytest
import torch

TORCH = tuple(int(part) for part in torch.__version__.split("+")[0].split(".")[:2])

needs_torch_2_12 = pytest.mark.skipif(
    TORCH < (2, 12), reason="PyTorch decomposes this op from 2.12 on; before, it runs eagerly (docs/versions.md)"
)


def dynamo_breaks_on_deepcopy() -> bool:
    """Dynamo before 2.12 cannot trace ``copy.deepcopy`` (transformers' config
    copies in T5, BART and Whisper): a graph break there, with eager's numbers."""
    return TORCH < (2, 12)
