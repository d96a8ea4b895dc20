"""NVML through nvidia-ml-py (`pynvml`): the backend for real GPUs (`backend.RealNvml`).

Nothing is imported here: the plugin reads the driver library's location (`loader`) on every node, the fake NVML's
included, and importing the backend with it would load pynvml (≈ 1 MiB of RSS, ≈ 30 ms of start) where no real GPU
is opened."""
