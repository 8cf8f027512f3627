"""torch <-> PJRT buffer conversion.

On the CPU client torch and XLA share host memory, so tensors cross through
DLPack without copies in either direction. Only what XLA cannot alias is
copied: broadcast (stride-0) or otherwise non-dense layouts are made
contiguous first, and XLA itself copies buffers whose data pointer is not
suitably aligned (storage offsets). On other platforms tensors are uploaded.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
from jaxlib import _jax
from torch.utils.dlpack import from_dlpack, to_dlpack

from tpu_inductor.runtime.platform import Platform


def to_device(tensor: torch.Tensor, platform: Platform) -> Any:
    """A PJRT buffer holding ``tensor``'s values (aliasing it where possible)."""
    if not tensor.is_contiguous():
        tensor = tensor.contiguous()
    if platform.shares_host_memory and tensor.device.type == "cpu":
        # to_dlpack rather than tensor.__dlpack__: the same capsule without the
        # Python-level checks (4 us less per argument); parameters that require
        # grad are fine to alias, XLA only reads them.
        return _jax.dlpack_managed_tensor_to_buffer(to_dlpack(tensor), platform.device, None)
    import jax

    host = tensor.detach().cpu()
    if host.dtype == torch.bfloat16:
        import ml_dtypes

        array = host.view(torch.int16).numpy().view(ml_dtypes.bfloat16)
    else:
        array = host.numpy()
    return jax.device_put(array, platform.device)


def to_torch(buffer: Any, platform: Platform) -> torch.Tensor:
    """A torch tensor holding ``buffer``'s values (aliasing it where possible)."""
    if platform.shares_host_memory:
        # The capsule straight from jaxlib: jax.Array.__dlpack__ costs 4 us more.
        # Taking it waits until the computation that defines the buffer is done.
        return from_dlpack(_jax.buffer_to_dlpack_managed_tensor(buffer))
    array = np.asarray(buffer)
    if str(array.dtype) == "bfloat16":
        return torch.from_numpy(array.view(np.int16)).view(torch.bfloat16)
    return torch.from_numpy(array)
