"""Where libnvidia-ml.so.1 comes from, and what to tell the user when NVML cannot be opened.

pynvml always loads the library by soname (``CDLL("libnvidia-ml.so.1")``), i.e. through the
dynamic loader search (LD_LIBRARY_PATH, /etc/ld.so.cache, default dirs). In a container the host
driver usually sits under a mounted driver root instead (``/run/nvidia/driver`` with the GPU
Operator). glibc's dlopen first compares a bare soname with the DT_SONAME of every object already
loaded, so preloading the driver root's file by absolute path makes pynvml's later
``CDLL("libnvidia-ml.so.1")`` return that very object — which is how `--driver-root` works here
without patching pynvml.
"""

from __future__ import annotations

import os
from collections.abc import Sequence

from dra_driver.nvml.types import NvmlReturn

SONAME = "libnvidia-ml.so.1"
_MULTIARCH = ("x86_64-linux-gnu", "aarch64-linux-gnu")
# What glibc searches after LD_LIBRARY_PATH and the cache (64-bit dirs first on lib64 systems).
_LOADER_DEFAULT_DIRS = "/lib64, /usr/lib64, /lib, /usr/lib"
_DRIVER_ROOT_HINT = (
    "install the NVIDIA driver on this node, or set --driver-root (DRA_DRIVER_DRIVER_ROOT) to the host driver root "
    "as mounted in this container (e.g. /run/nvidia/driver with the GPU Operator)"
)


def driver_library_dirs(driver_root: str, machine: str) -> tuple[str, ...]:
    """Library dirs under a driver root, most likely first; the host's multiarch dir before the other."""
    multiarch = sorted(_MULTIARCH, key=lambda triplet: not triplet.startswith(machine + "-"))
    relative = [
        "usr/lib64",
        *(f"usr/lib/{triplet}" for triplet in multiarch),
        "lib64",
        *(f"lib/{triplet}" for triplet in multiarch),
        "usr/lib",
        "lib",
    ]
    return tuple(os.path.join(driver_root, rel) for rel in relative)


def find_driver_library(dirs: Sequence[str]) -> str | None:
    """First `<dir>/libnvidia-ml.so.1` that exists (a symlink to the versioned file is fine)."""
    for directory in dirs:
        candidate = os.path.join(directory, SONAME)
        if os.path.isfile(candidate):
            return candidate
    return None


def library_not_found_message(driver_root: str | None, searched: Sequence[str], ld_library_path: str | None) -> str:
    where = [
        f"LD_LIBRARY_PATH={ld_library_path if ld_library_path else '(unset)'}",
        "the ld.so cache (/etc/ld.so.cache)",
        f"the loader's default dirs ({_LOADER_DEFAULT_DIRS})",
    ]
    if driver_root is not None:
        where.append(f"--driver-root {driver_root}: {', '.join(searched)}")
    return f"NVML is unavailable: {SONAME} was not found; searched {'; '.join(where)}. Fix: {_DRIVER_ROOT_HINT}."


def library_load_failed_message(path: str, error: OSError) -> str:
    reason = str(error).replace("\n", " ")
    return (
        f"NVML is unavailable: found {path} but could not load it ({reason}). Fix: check that it is the NVIDIA "
        f"driver's NVML library for this CPU architecture, or point --driver-root at the right driver root."
    )


def init_failure_message(
    code: NvmlReturn,
    *,
    library: str | None,
    driver_root: str | None,
    searched: Sequence[str],
    ld_library_path: str | None,
) -> str:
    """One actionable line for a failed nvmlInit, by NVML return code."""
    if code is NvmlReturn.LIBRARY_NOT_FOUND:
        return library_not_found_message(driver_root, searched, ld_library_path)
    lib = library if library is not None else f"{SONAME} (from the dynamic loader search)"
    if code is NvmlReturn.DRIVER_NOT_LOADED:
        return (
            f"NVML is unavailable: {lib} was loaded but the NVIDIA kernel driver is not running "
            f"(NVML_ERROR_DRIVER_NOT_LOADED). Fix: load the nvidia kernel module on the host (modprobe nvidia, "
            f"or wait for the GPU Operator's driver pod to become ready) and make /dev/nvidiactl and /dev/nvidia* "
            f"visible in this container."
        )
    if code is NvmlReturn.LIB_RM_VERSION_MISMATCH:
        return (
            f"NVML is unavailable: {lib} does not match the loaded nvidia kernel module "
            f"(NVML_ERROR_LIB_RM_VERSION_MISMATCH). Fix: point --driver-root at the driver that matches the running "
            f"kernel module, or reboot the node after a driver upgrade."
        )
    if code is NvmlReturn.NO_PERMISSION:
        return (
            f"NVML is unavailable: permission denied opening the GPU device nodes through {lib} "
            f"(NVML_ERROR_NO_PERMISSION). Fix: run the plugin privileged, or expose /dev/nvidiactl and "
            f"/dev/nvidia* to it."
        )
    return f"NVML is unavailable: nvmlInit through {lib} failed with NVML_ERROR_{code.name}."


def stale_library_message(library: str | None) -> str:
    """nvmlInit after a driver upgrade, in a process that loaded the old driver's library."""
    lib = library if library is not None else f"{SONAME} (from the dynamic loader search)"
    return (
        f"the NVIDIA driver was upgraded under this process: {lib} loaded at start is the old driver's and does "
        "not match the new kernel module (NVML_ERROR_LIB_RM_VERSION_MISMATCH); a process cannot load another NVML "
        "library, so the plugin exits and the kubelet restarts its container with the new driver's library"
    )
