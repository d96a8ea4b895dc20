"""Hardware access: the NvmlBackend protocol with a real (nvidia-ml-py) and a fake implementation."""

from dra_driver.nvml.backend import NvmlBackend
from dra_driver.nvml.types import NvmlError, NvmlReturn, NvmlUnavailableError

__all__ = ["NvmlBackend", "NvmlError", "NvmlReturn", "NvmlUnavailableError"]
