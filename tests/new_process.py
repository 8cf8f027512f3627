"""What a test does to stand for a new process: forget what this one traced,
compiled and reported, and keep the disk cache (tests/ is on sys.path)."""

from __future__ import annotations

import torch

import tpu_inductor
import tpu_inductor.report as report
from tpu_inductor.process_state import STATE


def fresh_process() -> None:
    tpu_inductor.wait_for_background_compiles()  # a compile of this "process" finishes in it
    torch._dynamo.reset()
    STATE.reset()
    report.reset()
