"""PT2E's quantize / dequantize ops as the ATen arithmetic they are defined by.

Why: a model quantized through ``torch.ao`` (PT2E, ``quantized_decomposed``
ops between every layer) reached the partitioner as custom ops of the
``quantized_decomposed`` library, which only ATen ops get past, so every
quantize and dequantize ran in eager PyTorch. PyTorch's own reference
implementations (``torch/ao/quantization/fx/_decomposed.py``) are plain
``round``/``clamp``/casts: traced as decompositions they lower, and they
are eager's values by construction.
"""

from __future__ import annotations

import torch

_REFERENCE_IMPLEMENTATIONS = (
    "quantize_per_tensor",
    "dequantize_per_tensor",
    "quantize_per_channel",
    "dequantize_per_channel",
    "quantize_per_token",
    "dequantize_per_token",
)


def quantize_decompositions() -> dict:
    """``quantized_decomposed.<op>.default`` -> PyTorch's reference implementation."""
    from torch.ao.quantization.fx import _decomposed  # registers the ops

    ops = torch.ops.quantized_decomposed
    return {getattr(ops, name).default: getattr(_decomposed, name) for name in _REFERENCE_IMPLEMENTATIONS}
