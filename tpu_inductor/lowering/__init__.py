"""ATen FX island -> StableHLO through torch-mlir; knows which ops lower."""

from tpu_inductor.lowering.stablehlo import LoweredModule, lower_to_stablehlo
from tpu_inductor.lowering.support import SupportTable

__all__ = ["LoweredModule", "SupportTable", "lower_to_stablehlo"]
