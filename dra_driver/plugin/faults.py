"""Named points in prepare/unprepare where tests can crash the plugin on purpose.

`DRA_DRIVER_CRASH_AT=<point>[,<point>...]` makes the process SIGKILL itself when it reaches the point
(the first time, or the N-th with `<point>#N`). Production never sets it; the points cost one set lookup.
"""

from __future__ import annotations

import os
import signal
import threading
from collections.abc import Mapping

ENV_VAR = "DRA_DRIVER_CRASH_AT"

PREPARE_POINTS = (
    "prepare:after-checkpoint-started",
    "prepare:after-devices",
    "prepare:after-cdi",
    "prepare:after-checkpoint-completed",
)
UNPREPARE_POINTS = (
    "unprepare:after-devices",
    "unprepare:after-cdi",
    "unprepare:after-checkpoint",
)
MIG_POINTS = (
    "mig:after-enable",
    "mig:after-gpu-instance",
    "mig:after-compute-instance",
    "mig:after-destroy-compute-instance",
    "mig:after-destroy-gpu-instance",
)
SHARING_POINTS = (
    "sharing:after-set-timeslice",
    "sharing:after-reset-timeslice",
    "sharing:after-mps-dirs",
    "sharing:after-compute-mode",
    "sharing:after-mps-start",
    "sharing:after-mps-stop",
    "sharing:after-compute-mode-reset",
)
# VFIO passthrough (plugin/vfio.py): binding fires the middle three once per function moved, releasing the
# restore ones once per function moved back.
VFIO_POINTS = (
    "vfio:after-record",
    "vfio:after-persistence-off",
    "vfio:after-override",
    "vfio:after-unbind",
    "vfio:after-bind",
    "vfio:after-restore-override",
    "vfio:after-restore-unbind",
    "vfio:after-restore-bind",
    "vfio:after-persistence-restore",
)
# KEP-5304 device metadata (kubeletplugin/metadata.py), after the driver's PrepareCompleted checkpoint.
METADATA_POINTS = (
    "metadata:after-file",
    "metadata:after-spec",
)
ALL_POINTS = PREPARE_POINTS + UNPREPARE_POINTS + MIG_POINTS + SHARING_POINTS + VFIO_POINTS + METADATA_POINTS


class FaultPoints:
    def __init__(self, spec: str = "") -> None:
        self._targets: dict[str, int] = {}
        for item in filter(None, (s.strip() for s in spec.split(","))):
            name, _, nth = item.partition("#")
            if name not in ALL_POINTS:
                raise ValueError(f"{ENV_VAR}: unknown crash point {name!r}; known: {', '.join(ALL_POINTS)}")
            self._targets[name] = int(nth or 1)
        self._hits: dict[str, int] = {}
        self._lock = threading.Lock()

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> FaultPoints:
        return cls((environ if environ is not None else os.environ).get(ENV_VAR, ""))

    def reached(self, point: str) -> None:
        if point not in self._targets:
            return
        with self._lock:
            self._hits[point] = self._hits.get(point, 0) + 1
            if self._hits[point] == self._targets[point]:
                os.kill(os.getpid(), signal.SIGKILL)
