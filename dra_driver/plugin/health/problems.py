"""A device's health problems (the taints the health monitor and keeper publish), and which NVML Xid errors are the
application's, not the GPU's.

Apart from `monitor.py` so that what is built before the kubelet sockets (the settings, the node's devices, the
driver-reload watcher, the health keeper) does not load the NVML event monitor, which is built and started after
them (docs/perf-findings.md "Start-up").
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

# Xids caused by the application, not the GPU (NVIDIA's device plugin and DRA driver ignore the same set).
DEFAULT_IGNORED_XIDS = frozenset({13, 31, 43, 45, 68, 109})


def parse_xid_list(text: str) -> frozenset[int]:
    """`"48, 63"` -> {48, 63}; a clear error for anything else."""
    xids = set()
    for part in filter(None, (p.strip() for p in text.split(","))):
        if not part.isdigit():
            raise ValueError(f"--ignore-xids: {part!r} is not an Xid number; write e.g. 48,63")
        xids.add(int(part))
    return frozenset(xids)


@dataclass(frozen=True)
class DeviceProblem:
    """A health problem of a device, published as a taint on it in the ResourceSlices (and as UNHEALTHY on the
    kubelet's health stream unless it is informational)."""

    key: str  # taint key, e.g. "gpu.dra.dev/xid"
    value: str  # taint value, e.g. "79"
    effect: str  # "NoSchedule" or "None" (informational)
    message: str

    @property
    def unhealthy(self) -> bool:
        return self.effect != "None"

    def taint(self) -> dict[str, str]:
        return {"key": self.key, "value": self.value, "effect": self.effect}


def lost_problem(driver_name: str) -> DeviceProblem:
    """The problem of a GPU NVML reports lost (`GPU_IS_LOST`)."""
    return DeviceProblem(f"{driver_name}/gpu-lost", "true", "NoSchedule", "GPU fell off the bus (GPU_IS_LOST)")


def merge(
    current: Mapping[str, DeviceProblem], names: Iterable[str], problem: DeviceProblem
) -> dict[str, DeviceProblem]:
    """A device keeps its worst problem: an informational one never hides an unhealthy one. Pure."""
    out = dict(current)
    for name in names:
        old = out.get(name)
        if old is None or problem.unhealthy or not old.unhealthy:
            out[name] = problem
    return out
