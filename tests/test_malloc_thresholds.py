"""The CPU client fixes glibc's malloc thresholds (runtime/malloc_thresholds.py):
blocks up to 32 MiB (results of repeated calls) come from glibc's heap and are
reused instead of faulted in anew; the environment can turn it off, and
thresholds a user set stand."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest

from tpu_inductor.runtime import malloc_thresholds

pytestmark = pytest.mark.skipif(sys.platform != "linux", reason="glibc's mallopt")

_PROBE = textwrap.dedent(
    """
    import ctypes, ctypes.util, json, torch
    from tpu_inductor.runtime import malloc_thresholds

    def step(x, w):
        return torch.relu(x @ w)

    compiled = torch.compile(step, backend="tpu", options={"cache": False, "strict": True})
    compiled(torch.randn(64, 32), torch.randn(32, 64))  # the CPU client starts here

    # Where glibc serves a 16 MiB block now: from its heap (reused across
    # calls) or from fresh mmap'd pages (faulted in at every call).
    class MallInfo2(ctypes.Structure):
        _fields_ = [(name, ctypes.c_size_t) for name in (
            "arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks", "uordblks", "fordblks", "keepcost")]

    libc = ctypes.CDLL(ctypes.util.find_library("c"))
    libc.mallinfo2.restype = MallInfo2
    libc.malloc.restype = ctypes.c_void_p
    mapped_before = libc.mallinfo2().hblkhd
    block = libc.malloc(16 << 20)
    mapped = libc.mallinfo2().hblkhd - mapped_before >= 16 << 20
    libc.free(ctypes.c_void_p(block))
    pinned = malloc_thresholds.pin.cache_info().currsize and malloc_thresholds.pin()["pinned"]
    print(json.dumps({"mapped": mapped, "pinned": bool(pinned)}))
    """
)


def _probe(**environ: str) -> dict:
    env = {**os.environ, **environ}
    done = subprocess.run([sys.executable, "-c", _PROBE], env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_blocks_below_32_mib_come_from_the_heap():
    # Fresh mmap'd pages are what faulted at every call: the MLP training
    # step's three 4 MiB gradients cost 1,860-2,770 page faults a step
    # (docs/performance.md); from the heap they are reused.
    probe = _probe()
    assert probe["pinned"] and not probe["mapped"], probe


def test_the_environment_turns_it_off():
    assert not _probe(TPU_INDUCTOR_PIN_MALLOC_THRESHOLDS="0")["pinned"]


def test_thresholds_a_user_set_stand():
    assert not _probe(MALLOC_TRIM_THRESHOLD_="1048576")["pinned"]


@pytest.mark.parametrize(
    "environ, chose",
    [
        ({}, False),
        ({"MALLOC_MMAP_THRESHOLD_": "65536"}, True),
        ({"GLIBC_TUNABLES": "glibc.malloc.trim_threshold=1048576"}, True),
        ({"GLIBC_TUNABLES": "glibc.pthread.rseq=0"}, False),
    ],
)
def test_user_settings_are_recognised(environ, chose):
    assert malloc_thresholds.user_chose(environ) is chose
