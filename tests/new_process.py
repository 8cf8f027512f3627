"""What a test does to stand for a new process: forget what this one traced,
compiled and reported, and keep the disk cache (tests/ is on sys.path)."""

from __future__ import annotations

import torch

import tpu_inductor.report as report
from tpu_inductor.process_state import STATE


def fresh_process() -> None:
    torch._dynamo.reset()
    STATE.reset()
    report.reset()
