"""The CPU client fixes glibc's malloc thresholds (runtime/malloc_thresholds.py):
results of repeated calls reuse freed memory instead of faulting in new pages;
the environment can turn it off, and thresholds a user set stand."""

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
    import json, resource, torch
    from tpu_inductor.runtime import malloc_thresholds

    def step(x, w):
        return torch.relu(x @ w)  # a new 16 MiB result at every call

    x, w = torch.randn(2048, 128), torch.randn(128, 2048)
    compiled = torch.compile(step, backend="tpu", options={"cache": False, "strict": True})
    for _ in range(5):
        result = compiled(x, w)
    del result
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    for _ in range(20):
        result = compiled(x, w)
        del result
    faults = (resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before) / 20
    pinned = malloc_thresholds.pin.cache_info().currsize and malloc_thresholds.pin()["pinned"]
    print(json.dumps({"faults_per_call": faults, "pinned": bool(pinned)}))
    """
)


def _probe(**environ: str) -> dict:
    env = {**os.environ, **environ}
    done = subprocess.run([sys.executable, "-c", _PROBE], env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_repeated_results_reuse_memory():
    probe = _probe()
    assert probe["pinned"]
    # A 16 MiB result is 4,096 pages. Unpinned, this probe measured 1,022-1,116
    # faults a call (glibc hands part of the freed result back each time);
    # pinned, 0.
    assert probe["faults_per_call"] < 256, probe


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
