"""glibc's malloc thresholds, fixed where glibc's own adjustment ends, when the CPU client starts.

Why: XLA:CPU allocates an executable's outputs (and temporaries) through
malloc at every call. glibc serves a block above its mmap threshold with
fresh pages, and hands free memory above its trim threshold at the top of
the heap back to the system, so a block freed after one call and allocated
again at the next comes back as new pages: a page fault per 4 KiB, each page
zeroed by the kernel, on whichever thread first writes it (YNNPACK's, for a
matmul result). glibc raises both thresholds as large blocks are freed, up
to 32 MiB and 64 MiB, but where it stands at any moment depends on what the
process freed before. perf.py's MLP training step, whose weight gradients
are three new 4 MiB results a step, took 1,860-2,770 page faults and
3.6-5.5 ms of kernel time a step (2 cores, default settings, four
processes); with the thresholds fixed at those ceilings, 0-17 faults and
0.15-0.55 ms, and the step 12.4-14.4 ms -> 10.1-13.9 ms (median 13.7 ->
11.3); perf.py's step against Inductor's went from 0.83x-0.89x to 1.21x,
1.08x and 0.92x in three runs.

So :func:`pin` sets them where glibc's adjustment would end (``mallopt``),
once, when our CPU client starts. It is process-wide: up to 64 MiB of
freed memory stays with the process instead of going back to the system,
and blocks up to 32 MiB come from the heap. It is the environment's to turn
off (``TPU_INDUCTOR_PIN_MALLOC_THRESHOLDS=0``), and thresholds a user set
(glibc's ``MALLOC_*_`` variables or ``GLIBC_TUNABLES``) are left alone, as
is any C library that is not glibc.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import logging
import os
import sys
from typing import Mapping

log = logging.getLogger(__name__)

MMAP_THRESHOLD = 32 << 20
"""glibc's ``DEFAULT_MMAP_THRESHOLD_MAX`` on 64-bit: where its raising of the mmap threshold stops."""

TRIM_THRESHOLD = 2 * MMAP_THRESHOLD
"""What glibc sets the trim threshold to when it raises the mmap threshold."""

_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD = -1, -3  # malloc.h

USER_SETTINGS = ("MALLOC_MMAP_THRESHOLD_", "MALLOC_TRIM_THRESHOLD_", "MALLOC_TOP_PAD_", "MALLOC_MMAP_MAX_")
"""glibc's environment variables for the same thresholds."""


def user_chose(environ: Mapping[str, str]) -> bool:
    """Whether the environment already sets glibc's malloc thresholds."""
    return any(name in environ for name in USER_SETTINGS) or "glibc.malloc." in environ.get("GLIBC_TUNABLES", "")


@functools.cache
def pin() -> dict[str, object]:
    """Fix glibc's mmap and trim thresholds at :data:`MMAP_THRESHOLD` and
    :data:`TRIM_THRESHOLD` (once a process); what was done, for logs and benchmarks."""
    if sys.platform != "linux" or user_chose(os.environ):
        return {"pinned": False, "why": "not linux" if sys.platform != "linux" else "set by the environment"}
    name = ctypes.util.find_library("c")
    libc = ctypes.CDLL(name) if name else None
    if libc is None or not hasattr(libc, "mallopt") or not hasattr(libc, "gnu_get_libc_version"):
        return {"pinned": False, "why": "not glibc"}
    if not (libc.mallopt(_M_MMAP_THRESHOLD, MMAP_THRESHOLD) and libc.mallopt(_M_TRIM_THRESHOLD, TRIM_THRESHOLD)):
        return {"pinned": False, "why": "mallopt refused"}
    log.debug("tpu_inductor: glibc malloc thresholds pinned (mmap %d, trim %d)", MMAP_THRESHOLD, TRIM_THRESHOLD)
    return {"pinned": True, "mmap_threshold": MMAP_THRESHOLD, "trim_threshold": TRIM_THRESHOLD}
