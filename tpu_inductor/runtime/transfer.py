"""torch <-> PJRT buffer conversion.

On the CPU client torch and XLA share host memory, so tensors cross through
DLPack without copies in either direction. Only what XLA cannot alias is
copied: broadcast (stride-0) or otherwise non-dense layouts are made
contiguous first, and XLA itself copies buffers whose data pointer is not
suitably aligned (storage offsets). :class:`HostViews` keeps the view of a
tensor that comes back call after call (parameters, buffers, a reused
input), :func:`result_handler` turns outputs into arrays in C++ and
:func:`host_tensor` hands them to torch: together they take an executable
call from ~15 us to ~6 us on a tiny graph. CUDA tensors cross to jax's CUDA
client through DLPack too (:func:`to_device`), after torch's stream has
finished producing them.

Where memory is not shared (a TPU, or any client with ``zero_copy=False``),
tensors are uploaded, and :class:`ResidentBuffers` keeps the device copy of
each tensor for as long as the tensor is alive and unchanged: parameters and
buffers cross once, and again only after an in-place update (an optimizer
step, BatchNorm's running stats) bumps their version counter, unless the
update was a graph's write whose new value the device computed and kept
(runtime/resident_writes.py: a KV cache crosses once, not every step). A
result keeps the buffer the device computed it in as its device copy
(:meth:`ResidentBuffers.remember`), so what the device made never crosses
back up: a forward's saved activations, read by its backward. A write that
bumps no version counter (through ``.data``, or through a numpy view) is not
seen: the device keeps its copy. On the CPU client these uploads are real
copies too (:func:`jaxlib_api.device_put`), so ``zero_copy=False`` behaves
there as it does on an accelerator.
"""

from __future__ import annotations

import collections
import ctypes
import threading
import weakref
from typing import Any, Callable, Hashable, Optional

import numpy as np
import torch
from torch.utils.dlpack import to_dlpack

from tpu_inductor import torch_api
from tpu_inductor.runtime import jaxlib_api
from tpu_inductor.runtime.platform import Platform


class ResidentBuffers:
    """Device copies of host tensors, reused while the tensor is unchanged.

    Keyed by the tensor object (held weakly: an entry dies with its tensor)
    and by how it lies on the devices (one device, or split or copied over a
    mesh's: ``layout``), and validated by the tensor's version counter and
    data pointer, which change on every in-place write of the tensor and
    ``.data`` swap (a write through ``.data`` itself changes neither).
    """

    def __init__(self) -> None:
        self._entries: dict[tuple[int, Hashable], tuple[weakref.ref, int, int, Any]] = {}
        self.uploads: collections.Counter[int] = collections.Counter()
        """Uploads per live tensor (by id), for tests and reports."""

    def get(self, tensor: torch.Tensor, platform: Platform) -> Any:
        return self.kept(tensor, (), lambda: upload(tensor, platform.device))

    def kept(self, tensor: torch.Tensor, layout: Hashable, make: Callable[[], Any]) -> Any:
        """The device value ``make()`` uploads for ``tensor`` laid out as
        ``layout`` (``()``: on one device), made again only after it changed."""
        value = self.current(tensor, layout)
        if value is not None:
            return value
        value = make()
        if version_of(tensor) is not None:  # inference tensors have no version counter: never kept
            self.uploads[id(tensor)] += 1
            self.remember(tensor, layout, value)
        return value

    def current(self, tensor: torch.Tensor, layout: Hashable) -> Optional[Any]:
        """The device value kept for ``tensor`` laid out as ``layout``, if ``tensor`` is unchanged since."""
        version = version_of(tensor)
        entry = self._entries.get((id(tensor), layout))
        if version is None or entry is None:
            return None
        ref, seen_version, seen_ptr, value = entry
        if ref() is tensor and seen_version == version and seen_ptr == tensor.data_ptr():
            return value
        return None

    def remember(self, tensor: torch.Tensor, layout: Hashable, value: Any) -> None:
        """``value`` holds ``tensor``'s current values on the devices (an upload,
        or a result the device computed): an island that reads ``tensor`` laid
        out as ``layout`` takes it instead of an upload, while the tensor is unchanged."""
        version = version_of(tensor)
        if version is None:
            return
        key = (id(tensor), layout)
        self._entries[key] = (weakref.ref(tensor, lambda _, key=key: self._forget(key)), version, tensor.data_ptr(), value)

    def written(self, tensor: torch.Tensor, version_before: int, buffer: Any, bumps_after: int = 0) -> bool:
        """``tensor`` was just written in place (its version was ``version_before``)
        and ``buffer`` holds its new value on the device: where the device copy was
        current before the write, ``buffer`` becomes the copy, instead of an upload
        of the whole tensor at the next call. ``bumps_after``: version bumps the
        caller knows follow before the next read (AOTAutograd's copy of a returned
        input into itself, a no-op that counts). Returns whether it was kept."""
        key = (id(tensor), ())
        entry = self._entries.get(key)
        if entry is None:
            return False
        ref, seen_version, seen_ptr, _ = entry
        if ref() is not tensor or seen_version != version_before or seen_ptr != tensor.data_ptr():
            return False  # stale before this write: the next call uploads it anyway
        self._entries[key] = (ref, tensor._version + bumps_after, seen_ptr, buffer)
        return True

    def _forget(self, key: tuple[int, Hashable]) -> None:
        """The tensor died: its id may be reused, so drop its entry and count."""
        self._entries.pop(key, None)
        self.uploads.pop(key[0], None)


class HostViews:
    """Zero-copy PJRT views of the host tensors an executable is called with,
    kept per argument position while the same tensor comes back.

    Importing a tensor through DLPack costs ~3.7 us; a decoder with 30
    parameters paid that 30 times a call. A kept view is reused while the
    position receives the same tensor object at the same data pointer: the
    view aliases that memory, so in-place updates (an optimizer step) are
    seen, and a ``.data`` swap moves the pointer and makes a new view.

    The view is made from a detached alias of the tensor, so the kept view
    holds the storage, not the tensor itself: the tensor still dies when its
    last user drops it (a weak reference then drops the view and frees the
    memory). A position that gets a new tensor on every call (activations)
    stops keeping after ``_TURNOVER_LIMIT`` replacements of views that were
    never reused: each kept view costs ~1.5 us more to make than a plain
    one. A view reused before its tensor was replaced (a KV cache, made anew
    for each ``generate()`` and passed to every decode step) does not count.

    Such a position, when its tensor is small (a decode step's token, its
    position, its mask row), is copied instead into a buffer of ours whose
    view is kept (:class:`_Staged`): a ``memmove`` of a few bytes costs
    ~0.5 us where an import costs 5-6 us, and 20-24 us when it is the call's
    first entry into PJRT after the model's Python code. The buffer is read
    only while the call runs, so it is filled only by a call that holds
    :attr:`lock`; a call on another thread at the same time imports instead.
    """

    _TURNOVER_LIMIT = 2
    _STAGED_BYTES = 16 * 1024
    """Largest tensor copied into a staging buffer (~1 us to copy) rather than imported."""

    def __init__(self, platform: Platform) -> None:
        self._device = platform.device
        self._kept: list[Optional[tuple[weakref.ref, int, Any]]] = []
        self._turnover: list[int] = []
        self._reused: list[bool] = []
        self._staged: list[Optional[_Staged]] = []
        self.lock = threading.Lock()
        """Held by the call whose arguments are in the staging buffers, until its results are out."""

    def buffers(self, tensors: tuple[torch.Tensor, ...], staging: bool = False) -> list[Any]:
        """PJRT views of ``tensors``; ``staging``: the caller holds :attr:`lock`."""
        if len(self._kept) != len(tensors):
            count = len(tensors)
            self._kept, self._turnover, self._reused = [None] * count, [0] * count, [False] * count
            self._staged = [None] * count
        kept = self._kept
        buffers = []
        for position, tensor in enumerate(tensors):
            entry = kept[position]
            if entry is not None and entry[0]() is tensor and entry[1] == tensor.data_ptr() and tensor.is_contiguous():
                buffers.append(entry[2])
                self._reused[position] = True
            else:
                staged = self._staged[position]
                if staging and staged is not None and staged.fits(tensor):
                    buffers.append(staged.holding(tensor))
                else:
                    buffers.append(self._view(position, tensor, staging))
        return buffers

    def _view(self, position: int, tensor: torch.Tensor, staging: bool) -> Any:
        if _has_lazy_bits(tensor):
            return self._import(tensor.resolve_neg().resolve_conj().contiguous())
        if not tensor.is_contiguous():
            # The executable reads dense row-major buffers; DLPack would carry
            # the strides into a buffer of another layout, read as row-major.
            return self._import(tensor.contiguous())
        if self._turnover[position] >= self._TURNOVER_LIMIT or tensor.numel() == 0:
            if staging and 0 < tensor.nbytes <= self._STAGED_BYTES:
                staged = _Staged(tensor, self._import)
                if staged.aliased:  # else XLA copied our buffer: the copy would go stale
                    self._staged[position] = staged
                    return staged.holding(tensor)
            return self._import(tensor)
        if self._kept[position] is not None and not self._reused[position]:
            self._turnover[position] += 1
        self._reused[position] = False
        # The alias shares the storage but not the TensorImpl: a capsule that
        # held the tensor itself would keep its Python object alive (PyTorch
        # preserves it while C++ holds a reference), and the weak reference
        # below would never fire.
        buffer = self._import(tensor.detach())
        if buffer.unsafe_buffer_pointer() != tensor.data_ptr():
            # XLA copied it (a misaligned storage offset): a kept copy would go stale.
            self._turnover[position] = self._TURNOVER_LIMIT
            return buffer
        self._kept[position] = (weakref.ref(tensor, self._forget_when_dead(position)), tensor.data_ptr(), buffer)
        return buffer

    def _forget_when_dead(self, position: int) -> Callable[[weakref.ref], None]:
        # Holds the views weakly: a callback holding them would make a cycle
        # (views -> entry -> weakref -> callback -> views) that keeps the
        # kept storage alive until the garbage collector runs.
        views = weakref.ref(self)

        def forget(ref: weakref.ref) -> None:
            owner = views()
            entry = owner._kept[position] if owner is not None and position < len(owner._kept) else None
            if entry is not None and entry[0] is ref:
                owner._kept[position] = None
                owner._turnover[position] += not owner._reused[position]
                owner._reused[position] = False

        return forget

    def _import(self, tensor: torch.Tensor) -> Any:
        # to_dlpack rather than tensor.__dlpack__: the same capsule without the
        # Python-level checks (4 us less per argument); parameters that require
        # grad are fine to alias, XLA only reads them.
        return jaxlib_api.buffer_from_dlpack(to_dlpack(tensor), self._device, None)


class _Staged:
    """A buffer of ours, with its PJRT view, that one argument position's
    small tensors are copied into, call after call (:class:`HostViews`)."""

    def __init__(self, like: torch.Tensor, import_view: Callable[[torch.Tensor], Any]) -> None:
        self._host = torch.empty(like.shape, dtype=like.dtype)
        self._shape, self._dtype, self._nbytes = like.shape, like.dtype, like.nbytes
        self._address = self._host.data_ptr()
        self._view = import_view(self._host)
        self.aliased = self._view.unsafe_buffer_pointer() == self._address
        """The view reads our buffer (torch's allocations are aligned as XLA wants)."""

    def fits(self, tensor: torch.Tensor) -> bool:
        return (
            tensor.dtype is self._dtype
            and tensor.shape == self._shape
            and tensor.is_contiguous()
            and not _has_lazy_bits(tensor)
        )

    def holding(self, tensor: torch.Tensor) -> Any:
        """The view, with ``tensor``'s values copied in."""
        ctypes.memmove(self._address, tensor.data_ptr(), self._nbytes)
        return self._view


def _has_lazy_bits(tensor: torch.Tensor) -> bool:
    """``tensor`` is a negative or conjugate view, whose values are its stored
    ones negated or conjugated. DLPack carries neither bit (XLA would read
    ``torch._neg_view(x)`` as ``x``) and numpy refuses them: resolve first."""
    return tensor.is_neg() or tensor.is_conj()


def result_handler(shape: tuple[int, ...], dtype: torch.dtype, platform: Platform) -> Any:
    """A C++ handler that wraps one output buffer as a jax array.

    ``disassemble_into_single_device_arrays`` builds each result's sharding by
    calling back into Python (~1 us an output); a handler made once per
    executable does not. The handler does not check the buffer against the
    aval: the exported tensor takes shape and dtype from the buffer itself.
    """
    return jaxlib_api.single_device_result_handler(
        jaxlib_api.shaped_array(shape, numpy_dtype(dtype)), platform.device
    )


def numpy_dtype(dtype: torch.dtype) -> np.dtype:
    name = str(dtype).removeprefix("torch.")
    try:
        return np.dtype(name)
    except TypeError:  # bfloat16, float8_*: numpy has them through ml_dtypes
        import ml_dtypes

        return np.dtype(getattr(ml_dtypes, name))


def host_tensor(array: Any) -> torch.Tensor:
    """The torch view of a host-memory result array.

    The capsule straight from jaxlib (``jax.Array.__dlpack__`` costs 4 us
    more); taking it waits until the computation that defines the array is
    done."""
    return torch_api.tensor_from_dlpack(jaxlib_api.dlpack_from_buffer(array))


def version_of(tensor: torch.Tensor) -> Optional[int]:
    """``tensor``'s version counter; None for an inference tensor, which has none."""
    if tensor.is_inference():
        return None
    return tensor._version


def to_device(tensor: torch.Tensor, platform: Platform, resident: Optional[ResidentBuffers] = None) -> Any:
    """A PJRT buffer holding ``tensor``'s values on a client that does not share
    host memory with torch (the CPU client's arguments go through :class:`HostViews`).
    A device value handed on in a tensor's place (a kept padded cache:
    dynamic/device_caches.py) is already there."""
    if not isinstance(tensor, torch.Tensor):
        return tensor
    if _has_lazy_bits(tensor):
        tensor = tensor.resolve_neg().resolve_conj()
    if not tensor.is_contiguous():
        tensor = tensor.contiguous()
    if platform.shares_cuda_memory and tensor.device.type == "cuda":
        # XLA runs on its own stream: wait until torch's stream has written the data.
        torch.cuda.current_stream(tensor.device).synchronize()
        device = platform.client.local_devices()[tensor.device.index or 0]
        return jaxlib_api.buffer_from_dlpack(to_dlpack(tensor), device, None)
    if resident is not None:
        return resident.get(tensor, platform)
    return upload(tensor, platform.device)


def upload(tensor: torch.Tensor, device: Any) -> Any:
    """A copy of ``tensor`` in a buffer on ``device``."""
    host = tensor.detach().cpu()
    if host.dtype == torch.bfloat16:
        import ml_dtypes

        array = host.view(torch.int16).numpy().view(ml_dtypes.bfloat16)
    else:
        array = host.numpy()
    return jaxlib_api.device_put(array, device)


def to_torch(buffer: Any, platform: Platform) -> torch.Tensor:
    """A torch tensor holding ``buffer``'s values, from a client that does not
    share host memory with torch (the CPU client's results: :func:`host_tensor`)."""
    if platform.shares_cuda_memory:
        # torch.from_dlpack passes torch's current stream, so jax makes it wait
        # for the XLA computation before torch reads the result.
        return torch.from_dlpack(buffer)
    # A private, writable host copy: torch may update outputs in place
    # (gradient accumulation), which a view of the device buffer must not see.
    array = np.array(buffer, copy=True)
    if str(array.dtype) == "bfloat16":
        return torch.from_numpy(array.view(np.int16)).view(torch.bfloat16)
    return torch.from_numpy(array)
