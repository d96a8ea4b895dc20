"""Named points in prepare/unprepare where tests can crash the plugin on purpose.

`DRA_DRIVER_CRASH_AT=<point>[,<point>...]` makes the process SIGKILL itself when it reaches the point
(the first time, or the N-th with `<point>#N`). Production never sets it; the points cost one set lookup.
"""

from __future__ import annotations

from dra_driver.kubeletplugin.faults import ENV_VAR
from dra_driver.kubeletplugin.faults import FaultPoints as _LayerFaultPoints

__all__ = ["ALL_POINTS", "ENV_VAR", "FaultPoints"]

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
# KEP-5304 device metadata (kubeletplugin/metadata.py), after the driver's PrepareCompleted checkpoint.
METADATA_POINTS = (
    "metadata:after-file",
    "metadata:after-spec",
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
# vGPU (plugin/vgpu.py): once per vGPU created (the VF recorded, its type written) or destroyed.
VGPU_POINTS = (
    "vgpu:after-record",
    "vgpu:after-create",
    "vgpu:after-destroy",
)
# Fabric Manager partitions (plugin/fmpartition.py): once per partition activated (the intent recorded, FM's answer)
# or deactivated; its member GPUs' binds fire the vfio points.
FM_PARTITION_POINTS = (
    "fmpartition:after-record",
    "fmpartition:after-activate",
    "fmpartition:after-deactivate",
)
# The device-plugin API beside DRA (dra_driver/deviceplugin/): Allocate's ownership record written before its
# answer; the claim guard's reservation written before the engine runs; a reconcile's release recorded before
# ListAndWatch and the slices hear of it.
DEVICE_PLUGIN_POINTS = (
    "deviceplugin:allocate-after-record",
    "deviceplugin:guard-after-reserve",
    "deviceplugin:release-after-record",
)
ALL_POINTS = (
    PREPARE_POINTS + UNPREPARE_POINTS + MIG_POINTS + SHARING_POINTS + METADATA_POINTS + VFIO_POINTS + VGPU_POINTS
    + FM_PARTITION_POINTS + DEVICE_PLUGIN_POINTS
)


class FaultPoints(_LayerFaultPoints):
    """The GPU driver's points (the mechanism is the kubelet-plugin layer's, shared with the compute-domain
    plugin)."""

    KNOWN = ALL_POINTS
