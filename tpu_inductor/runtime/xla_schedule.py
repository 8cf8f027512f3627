"""XLA:CPU's instruction scheduler, chosen per executable.

Why: XLA:CPU orders a program's thunks with its concurrency-optimized
scheduler by default, breadth first, so that independent work becomes ready
together for its intra-op pool to run side by side. That also keeps more
intermediate values alive at once. For a program of many steps that do not
each fill the cores, the memory-optimized scheduler is faster. Measured on 2
cores, default threads, one process per run:

- the generation benchmark's Llama decode step (83 thunks, 7.4 KB of
  temporaries by default, 2.2 KB memory-optimized): 175-187 us an island
  call against 148-150 us;
- the MobileNet-style model (13.5 MB against 4.5 MB): its island 5.7-5.8 ms
  against 5.1-5.2 ms.

The quickstart's transformer goes the other way. Memory-optimized, it needs
more temporaries (786 KB against 655 KB) and ran 3.2-3.8 ms a call against
2.7-2.9 ms when the scheduler was set process-wide. perf.py's MLP, decoder
and ResNet-style CNN islands need the same temporaries either way.

So an executable XLA compiles for one CPU device is compiled with both, and
the memory-optimized one is kept where it needs at most
:data:`MAX_TEMPORARY_FRACTION` of the default's temporary memory
(:func:`kept_schedule`). Timing the two on zero-filled inputs was tried
first and dropped: it ranked MobileNet's pair the wrong way round in one run
of two (1.04x, against 0.89x inside the model), and it measured up to 25%
between two compiles that need the same memory.

The second compile waits until the executable has run :data:`HOT_CALLS`
times, and then runs in the background while the default executable keeps
running (runtime/schedule_choice.py, ``ScheduleChoice``): a first call with both
compiles took 1.12-1.18 s for perf.py's decoder against 0.85-0.97 s with
one, and an executable called a few times (a script, a test, a prefill) never
earns back a second compile. The disk cache keeps the default executable
under its own key and, once chosen, the kept one under the chosen key, so a
warm start loads the choice and compiles nothing.

The choice is ``xla_cpu_scheduler_type`` among the compile options'
``env_option_overrides``, which XLA applies per executable.
``xla_cpu_enable_concurrency_optimized_scheduler`` does the same job, but XLA
reads it only from ``XLA_FLAGS``. Where ``XLA_FLAGS`` names either flag, that
choice stands and only one compile happens. A schedule changes the order of
independent work and where buffers live, never what is computed.
"""

from __future__ import annotations

from typing import Any

from tpu_inductor.runtime import jaxlib_api

MEMORY_OPTIMIZED = ("xla_cpu_scheduler_type", "CPU_SCHEDULER_TYPE_MEMORY_OPTIMIZED")
"""The per-executable override that selects XLA:CPU's memory-optimized scheduler."""

USER_FLAGS = ("xla_cpu_scheduler_type", "xla_cpu_enable_concurrency_optimized_scheduler")
"""``XLA_FLAGS`` names that mean the user chose a scheduler."""

MAX_TEMPORARY_FRACTION = 0.75
"""The memory-optimized schedule is kept where its temporaries take at most
this fraction of the default's. Measured, it took 0.30x (decode step,
0.85x the time), 0.33x (MobileNet-style, 0.89x) and 0.73x (a Llama prefill)
where it was faster, and 1.2x for the quickstart's transformer, where it was
slower."""


HOT_CALLS = 100
"""Calls of an executable after which its schedule is chosen (the second
compile, in the background, takes CPU time beside the program's calls).
The choice saves 10-15% of a call where it changes anything (the decode
step: 27 us of 175; MobileNet-style: 0.6 ms of 5.7), and the second compile
costs 0.2-0.3 s for those programs: an
executable called fewer times loses more to the compile than it could gain.
A decode step of a 32-token ``generate()`` reaches it in the fourth call."""


def applies(platform: Any, xla_flags: str, single_device: bool) -> bool:
    """Whether an executable for ``platform`` gets the choice: the CPU client,
    one device (a mesh's program is partitioned and its collectives make it
    another trade), and no scheduler named in ``XLA_FLAGS``."""
    return platform.name == "cpu" and single_device and not any(flag in xla_flags for flag in USER_FLAGS)


def memory_optimized(options: Any) -> Any:
    """A copy of the compile ``options`` with the memory-optimized scheduler."""
    return jaxlib_api.with_option_override(options, MEMORY_OPTIMIZED)


def kept_schedule(default: Any, memory_optimized_executable: Any) -> tuple[bool, str]:
    """Whether to keep ``memory_optimized_executable`` over ``default`` (two
    loaded executables of one module), and the report's words for the choice."""
    default_bytes = default.get_compiled_memory_stats().temp_size_in_bytes
    optimized_bytes = memory_optimized_executable.get_compiled_memory_stats().temp_size_in_bytes
    keep = optimized_bytes < MAX_TEMPORARY_FRACTION * default_bytes
    chosen = "memory-optimized" if keep else "default"
    return keep, f"{chosen} (temporaries {optimized_bytes:,} bytes memory-optimized, {default_bytes:,} default)"
