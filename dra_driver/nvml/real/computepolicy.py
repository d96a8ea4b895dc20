"""The compute-policy time-slice of a GPU, through `nvidia-smi compute-policy`.

NVML has no call for it (its "timeslice" functions are the vGPU scheduler's, which answer NOT_SUPPORTED outside
vGPU host mode), so this is the one place the driver runs a program: the host driver's `nvidia-smi` under the
driver root, with the libnvidia-ml the plugin itself loaded preloaded, an argument list (no shell) and a timeout.
`nvidia-smi` exits 3 when the GPU does not support the setting (e.g. Pascal parts): that becomes NOT_SUPPORTED,
a per-claim error, never a crash loop. There is no query: the value the plugin set is what it recorded.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Callable, Sequence

from dra_driver.nvml.types import NvmlError, NvmlReturn, TimeSlice

# Where the driver's tools live below the driver root: a host install, and the GPU Operator's driver container.
NVIDIA_SMI_DIRS = ("usr/bin", "bin", "usr/local/bin", "usr/local/nvidia/bin")
NOT_SUPPORTED_EXIT = 3
TIMEOUT_S = 30.0

Runner = Callable[..., "subprocess.CompletedProcess[str]"]


def find_nvidia_smi(driver_root: str | None) -> str | None:
    if driver_root is None:
        return shutil.which("nvidia-smi")
    for rel in NVIDIA_SMI_DIRS:
        path = os.path.join(driver_root, rel, "nvidia-smi")
        if os.path.isfile(path) and os.access(path, os.X_OK):
            return path
    return None


def set_time_slice_command(nvidia_smi: str, gpu_uuid: str, value: TimeSlice) -> list[str]:
    return [nvidia_smi, "compute-policy", "-i", gpu_uuid, "--set-timeslice", str(int(value))]


def set_time_slice(
    nvidia_smi: str | None,
    gpu_uuid: str,
    value: TimeSlice,
    *,
    library_path: str | None,
    run: Runner = subprocess.run,
    searched: Sequence[str] = (),
) -> None:
    call = "set_time_slice"
    if nvidia_smi is None:
        where = ", ".join(searched) or "PATH"
        raise NvmlError(NvmlReturn.NOT_SUPPORTED, call=call, detail=f"nvidia-smi not found (looked in {where})")
    env = {"PATH": "/usr/bin:/bin"}
    if library_path:
        env["LD_PRELOAD"] = library_path  # the same libnvidia-ml the plugin uses, whatever the container's paths
    command = set_time_slice_command(nvidia_smi, gpu_uuid, value)
    try:
        done = run(command, capture_output=True, text=True, timeout=TIMEOUT_S, check=False, env=env)
    except subprocess.TimeoutExpired:
        raise NvmlError(
            NvmlReturn.TIMEOUT, call=call, detail=f"nvidia-smi did not answer in {TIMEOUT_S:.0f} s"
        ) from None
    except OSError as exc:
        raise NvmlError(NvmlReturn.UNKNOWN, call=call, detail=f"running {nvidia_smi} failed: {exc}") from None
    if done.returncode == 0:
        return
    said = " ".join((done.stderr or done.stdout or "").split())[:300] or f"exit status {done.returncode}"
    code = NvmlReturn.NOT_SUPPORTED if done.returncode == NOT_SUPPORTED_EXIT else NvmlReturn.UNKNOWN
    raise NvmlError(code, call=call, detail=f"nvidia-smi compute-policy: {said}")
