"""NVML through nvidia-ml-py (`pynvml`): the backend for real GPUs."""

from dra_driver.nvml.real.backend import RealNvml

__all__ = ["RealNvml"]
