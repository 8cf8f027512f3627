"""PJRT runtime: clients per platform, compile, executable cache, transfers.

Owns every byte that crosses host <-> device and every on-disk artifact.
"""

from tpu_inductor.runtime.executable import DeviceExecutable, compile_stablehlo
from tpu_inductor.runtime.platform import Platform, get_platform, select_platform

__all__ = ["DeviceExecutable", "Platform", "compile_stablehlo", "get_platform", "select_platform"]
