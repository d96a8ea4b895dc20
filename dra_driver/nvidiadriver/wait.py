"""Waiting for the node's NVIDIA driver before the plugin registers (docs/kubelet-plugin.md "The NVIDIA driver's
lifecycle").

On a GPU Operator node the plugin often starts before the Operator's driver container has installed the driver
(NVIDIA/k8s-dra-driver-gpu#1008). Exiting would crash-loop the pod; registering would offer the kubelet a plugin
that cannot prepare anything; publishing would write an empty ResourceSlice over the node's good one. So the plugin
waits here, before anything else touches the node, and says on the DriverStatusBoard why it is not ready.

Each round checks, in order, and the first that fails is the reason (one line naming what to fix):
1. the driver root: `libnvidia-ml.so.1` under `--driver-root` (where the real backend loads NVML from);
2. the kernel module: `<proc>/driver/nvidia/version` or `<sys>/module/nvidia`;
3. the control device: `<dev-root>/nvidiactl` (or `<driver-root>/dev/nvidiactl`), a character device;
4. `nvml.init()`, then NVML must list at least one GPU.
The checks only explain; init decides: a round whose checks fail still tries init (NVML may find its library
through the loader path, or create its device nodes itself), and a working init is ready. For the fake backend
only step 4 applies. Between rounds the wait backs off exponentially up to `max_interval` (`--driver-wait-max-
interval`, the chart's `driverWait.intervalSeconds`), and a stop request (SIGTERM) ends it at once.
"""

from __future__ import annotations

import os
import platform
import stat
import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import structlog

from dra_driver.backoff import Backoff, Retries
from dra_driver.nvidiadriver.state import DriverState, DriverStatusBoard
from dra_driver.nvml.backend import NvmlBackend
from dra_driver.nvml.types import NvmlError, NvmlUnavailableError

log = structlog.get_logger(__name__)

INITIAL_INTERVAL_S = 0.5
DRIVER_ROOT_FIX = (
    "set the chart value driverRoot (--host-driver-root; mounted as --driver-root) to where the driver is installed "
    "on the node: /run/nvidia/driver with the GPU Operator (then wait for its driver pod), / for a host install"
)
MODULE_FIX = (
    "load it on the node (modprobe nvidia, or wait for the GPU Operator's driver pod to be Ready); a node without "
    "NVIDIA GPUs should not run this pod (chart values nodeSelector/affinity)"
)


@dataclass(frozen=True)
class DriverPaths:
    """Where this process sees the host's driver files, /proc, /sys and /dev (flags of the same names)."""

    driver_root: Path
    host_driver_root: Path
    dev_root: Path = Path("/dev")
    proc_root: Path = Path("/proc")
    sys_root: Path = Path("/sys")
    machine: str = ""  # platform.machine(); "" reads it


@dataclass(frozen=True)
class DriverWaitSettings:
    max_interval: float  # the backoff cap, seconds (--driver-wait-max-interval)
    paths: DriverPaths | None = None  # None: a fake backend, only nvml.init() is checked
    initial_interval: float = INITIAL_INTERVAL_S


def check_driver_files(paths: DriverPaths) -> str | None:
    """Why NVML's library is not under the driver root, or None when it is."""
    # Imported here: `dra_driver.nvml.real` pulls in pynvml, which a fake backend never needs.
    from dra_driver.nvml.real.loader import SONAME, driver_library_dirs

    machine = paths.machine or platform.machine()
    dirs = driver_library_dirs(str(paths.driver_root), machine)
    dangling = ""
    for directory in dirs:
        candidate = Path(directory) / SONAME
        if candidate.is_file():
            return None
        if candidate.is_symlink() and not dangling:
            # e.g. an absolute link that resolves on the host but not under the mount
            dangling = f"{candidate} is a dangling symlink (-> {os.readlink(candidate)}); "
    where = _where(paths)
    return (
        f"{SONAME} not found under the driver root {where}; {dangling}looked in "
        + ", ".join(d.removeprefix(str(paths.driver_root)).lstrip("/") or "." for d in dirs)
        + f". Fix: {DRIVER_ROOT_FIX}"
    )


def check_kernel_module(paths: DriverPaths) -> str | None:
    """Why the nvidia kernel module is not loaded, or None when it is."""
    version = paths.proc_root / "driver/nvidia/version"
    module = paths.sys_root / "module/nvidia"
    if version.exists() or module.is_dir():
        return None
    return f"the nvidia kernel module is not loaded (no {version}, no {module}). Fix: {MODULE_FIX}"


def check_control_device(paths: DriverPaths) -> str | None:
    """Why /dev/nvidiactl is not usable, or None when it is a character device."""
    candidates = (paths.dev_root / "nvidiactl", paths.driver_root / "dev/nvidiactl")
    for candidate in candidates:
        try:
            if stat.S_ISCHR(candidate.stat().st_mode):
                return None
        except OSError:
            continue
    return (
        f"no /dev/nvidiactl character device (looked at {candidates[0]} (--dev-root) and {candidates[1]}). Fix: the "
        "module is loaded but its device nodes are missing: run nvidia-modprobe -c 0 or nvidia-smi once on the node "
        "(the GPU Operator's driver pod does), and mount the node's /dev into the plugin container"
    )


def _where(paths: DriverPaths) -> str:
    if paths.host_driver_root == paths.driver_root:
        return f"{paths.driver_root} (--driver-root)"
    return f"{paths.driver_root} (--driver-root; {paths.host_driver_root} on the node, chart value driverRoot)"


CHECKS: tuple[Callable[[DriverPaths], str | None], ...] = (
    check_driver_files,
    check_kernel_module,
    check_control_device,
)


class DriverWait:
    """Rounds of checks until NVML works (READY on the board with the driver version) or stop is requested.

    `pause(seconds)` waits between rounds and returns True when the wait should end (default: `stop.wait`); tests
    inject one that records the intervals instead of sleeping. `accept_no_gpus()`: whether an NVML listing no GPU
    is ready anyway (a GPU on vfio-pci is not in NVML's list, and recovery must run to give it back)."""

    def __init__(
        self,
        nvml: NvmlBackend,
        board: DriverStatusBoard,
        settings: DriverWaitSettings,
        *,
        stop: threading.Event,
        pause: Callable[[float], bool] | None = None,
        accept_no_gpus: Callable[[], bool] = lambda: False,
    ) -> None:
        self._nvml = nvml
        self._board = board
        self._settings = settings
        self._stop = stop
        self._pause = pause if pause is not None else stop.wait
        self._accept_no_gpus = accept_no_gpus
        self.initialised = False  # whether this wait holds an NVML reference (the plugin's stop() releases it)
        self.rounds = 0

    def wait(self) -> bool:
        """True once ready, False when stopped first."""
        # At least 10 ms: a zero interval would spin.
        cap = max(self._settings.max_interval, 0.01)
        retries = Retries(Backoff(max(0.01, min(self._settings.initial_interval, cap)), cap))
        while not self._stop.is_set():
            self.rounds += 1
            if self.attempt():
                return True
            if self._pause(retries.next()):
                break
        return False

    def attempt(self) -> bool:
        """One round: the checks, then init. Sets the board either way; True when ready."""
        reason = self._first_failing_check()
        try:
            self._nvml.init()
        except (NvmlUnavailableError, ValueError) as exc:  # ValueError: a fake node's unreadable driver file
            self._not_ready(reason or _one_line(str(exc)))
            return False
        try:
            gpus = self._nvml.gpus()
            version = self._nvml.system_info().driver_version
        except NvmlError as exc:
            self._release()
            self._not_ready(reason or f"NVML initialised but cannot list the GPUs ({exc}); retrying")
            return False
        if not gpus and not self._accept_no_gpus():
            self._release()
            self._not_ready(
                f"the NVIDIA driver {version} is loaded but NVML lists no GPU; publishing nothing rather than an "
                "empty ResourceSlice. Fix: check nvidia-smi on the node (GPUs bound to another driver, a driver "
                "still initialising), or keep this pod off nodes without GPUs (chart values nodeSelector/affinity)"
            )
            return False
        self.initialised = True
        if reason:
            log.warning("NVML works although a driver check failed; going on", check=reason)
        self._board.set(DriverState.READY, driver_version=version)
        return True

    def release(self) -> None:
        """Give back the NVML reference the wait took (at shutdown)."""
        if self.initialised:
            self.initialised = False
            self._release()

    def _release(self) -> None:
        try:
            self._nvml.shutdown()
        except NvmlError as exc:
            log.warning("NVML shutdown failed", error=str(exc))

    def _first_failing_check(self) -> str | None:
        paths = self._settings.paths
        if paths is None:
            return None
        for check in CHECKS:
            reason = check(paths)
            if reason is not None:
                return reason
        return None

    def _not_ready(self, reason: str) -> None:
        # The board notifies only on a change, so a reason that stays is reported once, not every round.
        self._board.set(DriverState.NOT_READY, reason)


def _one_line(text: str) -> str:
    return " ".join(text.split())


def wait_for_driver(wait: DriverWait | None, board: DriverStatusBoard, nvml: NvmlBackend, *, node_name: str) -> bool:
    """A plugin's start: wait until NVML works; False when stopped first. Without a wait (`None`: the caller
    initialised NVML, as tests do) the driver is ready as it is."""
    if wait is not None:
        log.info("waiting for the NVIDIA driver", node=node_name)
        return wait.wait()
    board.set(DriverState.READY, driver_version=nvml.system_info().driver_version)
    return True

