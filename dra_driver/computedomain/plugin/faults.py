"""The compute-domain plugin's crash points (tests only; the mechanism: dra_driver/kubeletplugin/faults.py)."""

from __future__ import annotations

from dra_driver.kubeletplugin.faults import ENV_VAR
from dra_driver.kubeletplugin.faults import FaultPoints as _LayerFaultPoints

__all__ = ["ALL_POINTS", "ENV_VAR", "PREPARE_POINTS", "UNPREPARE_POINTS", "CdFaultPoints"]

PREPARE_POINTS = (
    "cd-prepare:after-checkpoint-started",
    "cd-prepare:after-node-label",
    "cd-prepare:after-daemon-dir",
    "cd-prepare:after-cdi",
    "cd-prepare:after-checkpoint-completed",
)
UNPREPARE_POINTS = (
    "cd-unprepare:after-checkpoint-started",
    "cd-unprepare:after-daemon-dir",
    "cd-unprepare:after-node-label",
    "cd-unprepare:after-cdi",
    "cd-unprepare:after-checkpoint",
    "cd-unprepare:after-abort",  # PrepareAborted written (an unprepare of a claim still PrepareStarted)
)
ALL_POINTS = PREPARE_POINTS + UNPREPARE_POINTS


class CdFaultPoints(_LayerFaultPoints):
    KNOWN = ALL_POINTS
