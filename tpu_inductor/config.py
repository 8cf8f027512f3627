"""The one place where configuration is read.

Precedence: the ``options={...}`` dict given to ``torch.compile`` wins over
``TPU_INDUCTOR_*`` environment variables, which win over the defaults below.
Every other module receives a :class:`Config`; none reads ``os.environ``.
"""

from __future__ import annotations

import dataclasses
import os
import re
from pathlib import Path
from typing import Any, Mapping, Optional

from tpu_inductor.errors import ConfigError

PLATFORMS = ("cpu", "cuda", "tpu")
_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"0", "false", "no", "off", ""}


_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([kmgt]?)(i?b?)\s*$", re.IGNORECASE)
_SIZE_UNITS = {"": 1, "k": 1024, "m": 1024**2, "g": 1024**3, "t": 1024**4}


def parse_size(raw: Any) -> int:
    """Bytes from ``2147483648``, ``500M``, ``2GiB`` or ``1.5g`` (units are powers of 1024)."""
    if isinstance(raw, bool):
        raise ValueError(f"not a size: {raw!r}")
    if isinstance(raw, int):
        return raw
    match = _SIZE.match(str(raw))
    if not match:
        raise ValueError(f"not a size: {raw!r} (use bytes or a number with K/M/G/T, e.g. 2G)")
    number, unit, _ = match.groups()
    return int(float(number) * _SIZE_UNITS[unit.lower()])


def _default_cache_dir(environ: Mapping[str, str]) -> str:
    base = environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return str(Path(base) / "tpu_inductor")


@dataclasses.dataclass(frozen=True)
class Config:
    """Settings for one ``torch.compile`` region; immutable once built."""

    platform: Optional[str] = None
    """PJRT platform to run on: ``cpu`` (jaxlib's embedded client), ``cuda``
    (jax's CUDA plugin) or ``tpu`` (libtpu). Unset: ``tpu`` when libtpu finds
    a TPU, else ``cuda`` for CUDA inputs when jax's CUDA plugin is installed,
    else ``cpu`` (also spelled ``auto``). Env: ``TPU_INDUCTOR_PLATFORM``."""

    zero_copy: bool = True
    """Share memory between torch and the device through DLPack where the
    platform allows it (CPU, CUDA). ``False`` copies instead, with parameters
    kept resident on the device as on a TPU. Env: ``TPU_INDUCTOR_ZERO_COPY``."""

    strict: bool = False
    """Raise instead of running an op eagerly when it cannot be lowered; the
    error names the op, the reason and the user source line.
    Env: ``TPU_INDUCTOR_STRICT``."""

    eager_kernels: bool = True
    """On the CPU client, use PyTorch's own kernels where they are faster:
    convolutions and bfloat16/float16 matmuls timed once per shape and thread
    count on oneDNN and on XLA run where they are faster (the timing is kept
    beside the cache),
    small pointwise islands next to them run in eager too, embedding bags run on
    PyTorch's kernels (untimed: 7-20x faster than XLA:CPU's), and graphs that only update
    their inputs in place (optimizer steps) run in place. Shown in the report
    as choices, not fallbacks. Ignored on other platforms.
    Env: ``TPU_INDUCTOR_EAGER_KERNELS``."""

    choose_xla_schedule: bool = True
    """On the CPU client, once an executable has run 100 times, compile it
    with XLA:CPU's other instruction scheduler too (memory- as well as
    concurrency-optimized) and keep the memory-optimized one where it needs
    clearly less temporary memory: programs of many small steps (a decode
    step, a MobileNet) run 10-15% faster so (runtime/xla_schedule.py). Costs
    a second XLA compile, begun at the 100th call on a thread of its own
    while the calls go on; the disk cache keeps the one chosen. Ignored
    where ``XLA_FLAGS`` names a scheduler.
    Env: ``TPU_INDUCTOR_CHOOSE_XLA_SCHEDULE``."""

    fallback_random: bool = False
    """Run random ops (dropout, ``rand``, ``randn``, ``bernoulli``, ...) in eager
    PyTorch on torch's generator, drawing exactly eager's numbers. Off (as
    Inductor's option of that name): they draw on the device from a seed
    taken from torch's generator at each call, reproducible under
    ``torch.manual_seed`` but not eager's numbers. ``multinomial``,
    ``randperm`` and ops given their own ``generator`` always run eagerly.
    Env: ``TPU_INDUCTOR_FALLBACK_RANDOM``."""

    tpu_readiness: bool = False
    """Check every compiled module for what a TPU cannot run or runs badly
    (float64, shapes left dynamic, host callbacks, custom calls only one
    platform implements), list the findings in the island's report entry and
    warn about each one that is not explained (float64 the graph's own
    inputs or outputs ask for is). Always on for the ``tpu`` platform.
    Env: ``TPU_INDUCTOR_TPU_READINESS``."""

    isolate_lowering: bool = True
    """Run torch-mlir's pass pipelines, and on the CPU client XLA's compiler,
    in a helper process, so that a native crash of MLIR (an ``LLVM ERROR``
    abort) or of XLA (a ``CHECK`` failure) fails that island's lowering,
    which then runs eagerly, instead of ending the program. Costs one process
    start, begun when the backend is first called so that it overlaps
    tracing, and a few milliseconds an island (docs/performance.md).
    Env: ``TPU_INDUCTOR_ISOLATE_LOWERING``."""

    freeze_parameters: bool = False
    """Inference graphs compute what depends only on parameters and buffers
    (BatchNorm folded into convolution weights, scales, casts) once and reuse
    it while those tensors are unchanged: an in-place update (optimizer step,
    ``load_state_dict``, ``torch.no_grad()`` writes) or a replaced tensor
    recomputes it. Writes through ``.data`` bypass PyTorch's version counter
    and are not seen, hence off by default (Inductor's ``freezing`` sees
    neither). Costs memory for the kept results (on the CPU client, a
    transposed copy of each matmul weight). Env: ``TPU_INDUCTOR_FREEZE_PARAMETERS``."""

    cache: bool = True
    """Keep compiled executables in ``cache_dir`` so a later process starts
    warm. Env: ``TPU_INDUCTOR_CACHE`` (0 turns it off)."""

    cache_dir: Optional[str] = None
    """Directory of the on-disk artifact cache; ``None`` means
    ``$XDG_CACHE_HOME/tpu_inductor`` (``~/.cache/tpu_inductor``).
    Env: ``TPU_INDUCTOR_CACHE_DIR``."""

    cache_max_bytes: int = dataclasses.field(default=2 * 1024**3, metadata={"kind": "size"})
    """Size cap of ``cache_dir``; past it the least-recently-used entries are
    evicted. Bytes or a size such as ``500M`` / ``2GiB``.
    Env: ``TPU_INDUCTOR_CACHE_MAX_BYTES``."""

    report_dir: Optional[str] = None
    """Write this process's report here as it goes: ``report.json``,
    ``report.html`` and each island's StableHLO, in a subdirectory
    ``tpu_inductor-<time>-<pid>`` per process, plus reproducer bundles of
    failed lowerings. ``None``: no files. Env: ``TPU_INDUCTOR_REPORT_DIR``."""

    mesh: tuple[tuple[str, int], ...] = dataclasses.field(default=(), metadata={"kind": "mesh"})
    """A device mesh over the platform's devices, axis name to size, major
    first: ``{"data": 4}`` or ``{"data": 2, "model": 2}``. Each island then
    compiles once for all of its devices through XLA's SPMD partitioner:
    parameters replicated, other inputs split along dim 0 over the first
    axis (data parallel), results whole; ``tpu_inductor.shard`` changes a
    parameter's layout. On the CPU client the mesh's devices are made in
    the process. Empty: one device. Env: ``TPU_INDUCTOR_MESH``
    (``data=2,model=2``)."""

    bucket_sizes: tuple[int, ...] = ()
    """Sizes a dynamic dim is padded up to (e.g. ``(16, 64, 256)``); empty means
    powers of two, or multiples of ``bucket_step``. A dim is padded only where
    shape analysis proves padding cannot change the real results.
    Env: ``TPU_INDUCTOR_BUCKET_SIZES`` (comma-separated)."""

    bucket_step: Optional[int] = dataclasses.field(default=None, metadata={"kind": "count"})
    """Pad dynamic dims to multiples of this instead of powers of two.
    Env: ``TPU_INDUCTOR_BUCKET_STEP``."""

    bucket_min: int = dataclasses.field(default=2, metadata={"kind": "count"})
    """Smallest bucket: smaller sizes are padded up to it. The default 2 pads a
    size of 1 no more than any power-of-two bucket pads, and spares it an
    executable of its own. Env: ``TPU_INDUCTOR_BUCKET_MIN``."""

    bucket_max: Optional[int] = dataclasses.field(default=None, metadata={"kind": "count"})
    """Largest bucket: bigger sizes compile at their exact size.
    Env: ``TPU_INDUCTOR_BUCKET_MAX``."""

    recompile_budget: int = dataclasses.field(default=8, metadata={"kind": "count"})
    """Sizes (buckets, or exact sizes where a dim is not padding-safe) each
    dynamic dim of a graph may compile, one executable per device island for
    each combination met; the sizes it was traced at always compile. A shape
    that would give a dim one size more runs in eager PyTorch with a warning
    (or raises under ``strict``). Env: ``TPU_INDUCTOR_RECOMPILE_BUDGET``."""

    xla_flags: str = dataclasses.field(default="", metadata={"env": "XLA_FLAGS", "option": False})
    """The ``XLA_FLAGS`` environment value. XLA reads it itself when the PJRT
    client starts, so it is not an option; it is read here because flags change
    compiled code and so belong in every executable cache key."""

    pjrt_nproc: Optional[int] = dataclasses.field(
        default=None, metadata={"env": "PJRT_NPROC", "option": False, "kind": "count"}
    )
    """The ``PJRT_NPROC`` environment value: the size of XLA:CPU's intra-op
    thread pool, read when the CPU client starts (XLA's own variable, so not
    an option). Unset: as many threads as ``torch.get_num_threads()`` then,
    so that ``torch.set_num_threads`` sets both runtimes' threads."""

    pin_malloc_thresholds: bool = dataclasses.field(default=True, metadata={"option": False})
    """When our CPU client starts, fix glibc's malloc mmap and trim thresholds
    where glibc's own adjustment ends (32 MiB, 64 MiB), so that XLA's results
    reuse freed memory instead of faulting in fresh pages at every call
    (runtime/malloc_thresholds.py). Process-wide, so environment only;
    thresholds set through glibc's own variables win.
    Env: ``TPU_INDUCTOR_PIN_MALLOC_THRESHOLDS``."""

    @property
    def resolved_cache_dir(self) -> Path:
        return Path(self.cache_dir or _default_cache_dir(os.environ))

    @classmethod
    def field_names(cls) -> list[str]:
        """The names accepted in ``options={...}`` (environment-only fields excluded)."""
        return [f.name for f in dataclasses.fields(cls) if f.metadata.get("option", True)]

    @classmethod
    def load(
        cls,
        options: Optional[Mapping[str, Any]] = None,
        environ: Optional[Mapping[str, str]] = None,
    ) -> "Config":
        """Build the config from ``options`` > environment > defaults."""
        environ = os.environ if environ is None else environ
        options = dict(options or {})
        unknown = sorted(set(options) - set(cls.field_names()))
        if unknown:
            raise ConfigError(
                f"unknown tpu_inductor option(s) {unknown}; valid options are: "
                f"{', '.join(cls.field_names())}"
            )
        values: dict[str, Any] = {}
        for field in dataclasses.fields(cls):
            env_name = field.metadata.get("env", f"TPU_INDUCTOR_{field.name.upper()}")
            if field.name in options:
                raw, origin = options[field.name], f"option {field.name!r}"
            elif env_name in environ:
                raw, origin = environ[env_name], f"environment variable {env_name}"
            else:
                continue
            values[field.name] = _coerce(field, raw, origin)
        config = cls(**values)
        _check_buckets(config)
        if config.platform in ("", "auto"):
            config = dataclasses.replace(config, platform=None)
        if config.platform is not None and config.platform not in PLATFORMS:
            raise ConfigError(
                f"platform {config.platform!r} is not one of {', '.join(PLATFORMS)}, auto "
                "(set the 'platform' option or TPU_INDUCTOR_PLATFORM)"
            )
        return config


COMPILE_MODES = {
    "default": "compile every graph for the device, choosing PyTorch's kernel where it measures faster",
    "reduce-overhead": (
        "the same as default: Inductor's mode records CUDA graphs to cut launch overhead, "
        "and an XLA executable is already one launch per island"
    ),
    "max-autotune": (
        "the same as default: kernel choice (eager vs XLA, timed per op signature) is always on; "
        "XLA does its own tuning"
    ),
    "max-autotune-no-cudagraphs": "the same as max-autotune",
}
"""``torch.compile(mode=...)`` values and what each means for this backend.

transformers' ``generate(compile_config=CompileConfig(...))`` passes
``mode="reduce-overhead"`` by default, so every mode PyTorch documents is
accepted; none changes what this backend compiles."""


def check_mode(mode: Optional[str]) -> str:
    """The ``torch.compile`` mode, checked; an unknown one is a :class:`ConfigError`."""
    mode = mode or "default"
    if mode not in COMPILE_MODES:
        raise ConfigError(
            f"torch.compile mode {mode!r} is not one the tpu backend knows; use one of "
            f"{', '.join(COMPILE_MODES)} (they behave alike here), or leave mode unset"
        )
    return mode


def _coerce(field: dataclasses.Field, raw: Any, origin: str) -> Any:
    """Turn an option or environment string into the field's type."""
    kind = field.type if isinstance(field.type, str) else field.type.__name__
    if kind == "bool":
        if isinstance(raw, bool):
            return raw
        text = str(raw).strip().lower()
        if text in _TRUE:
            return True
        if text in _FALSE:
            return False
        raise ConfigError(f"{origin} must be a boolean (1/0, true/false), got {raw!r}")
    if kind == "tuple[int, ...]":
        return _count_list(raw, origin)
    if field.metadata.get("kind") == "count":
        if raw is None or (kind.startswith("Optional") and str(raw).strip().lower() in ("", "none")):
            return None
        return _count(raw, origin)
    if field.metadata.get("kind") == "mesh":
        from tpu_inductor.runtime.mesh import parse_mesh

        try:
            return parse_mesh(raw)
        except ValueError as exc:
            raise ConfigError(f"{origin}: {exc}") from None
    if field.metadata.get("kind") == "size":
        try:
            return parse_size(raw)
        except ValueError as exc:
            raise ConfigError(f"{origin}: {exc}") from None
    if raw is None:
        return None
    return str(raw)


def _count(raw: Any, origin: str) -> int:
    """A non-negative integer from an int or a decimal string."""
    if isinstance(raw, bool):
        raise ConfigError(f"{origin} must be a non-negative integer, got {raw!r}")
    try:
        value = int(str(raw).strip()) if not isinstance(raw, int) else raw
    except ValueError:
        raise ConfigError(f"{origin} must be a non-negative integer, got {raw!r}") from None
    if value < 0:
        raise ConfigError(f"{origin} must be a non-negative integer, got {raw!r}")
    return value


def _count_list(raw: Any, origin: str) -> tuple[int, ...]:
    """Sorted positive sizes from a list/tuple of ints or a string like ``"16,64,256"``."""
    if isinstance(raw, str):
        items: Any = [part for part in re.split(r"[,\s]+", raw.strip()) if part]
    elif isinstance(raw, (list, tuple)):
        items = raw
    else:
        raise ConfigError(f"{origin} must be a list of sizes such as [16, 64, 256], got {raw!r}")
    sizes = sorted({_count(item, origin) for item in items})
    if sizes and sizes[0] == 0:
        raise ConfigError(f"{origin}: bucket sizes must be positive, got {raw!r}")
    return tuple(sizes)


def _check_buckets(config: "Config") -> None:
    if config.bucket_step == 0:
        raise ConfigError("bucket_step must be positive (or unset for powers of two)")
    if config.bucket_max is not None and config.bucket_max < max(config.bucket_min, 1):
        raise ConfigError(
            f"bucket_max ({config.bucket_max}) is smaller than bucket_min ({config.bucket_min})"
        )
