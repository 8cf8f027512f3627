"""Decompositions of the fused kernels PyTorch's module fast paths call.

Why: in eval mode under ``no_grad``, ``nn.TransformerEncoderLayer`` and
``nn.MultiheadAttention`` call one fused native kernel for the whole layer,
which torch-mlir cannot lower, so the whole layer ran in eager PyTorch.
"""

from __future__ import annotations

import torch

aten = torch.ops.aten

FAST_PATH_DECOMPOSITIONS: dict = {}
