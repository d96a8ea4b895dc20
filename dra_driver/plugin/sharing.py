"""Time-slicing: the compute-policy time-slice of a physical GPU, set for the claims that ask for it.

The time-slice is per physical GPU and applies to every process on it, so:
- on MIG devices `TimeSlicing` has nothing to apply: accepted without an interval (as NVIDIA's driver does; a Normal
  Event on the claim says so), an explicit interval is refused at decode;
- the checkpoint is the reference count: every prepared (or half-prepared) device records the interval it
  wants (`timeSlice`), and a GPU goes back to Default only when the last record naming it is gone. Today only
  one claim holds a whole GPU; claims sharing one GPU (consumable capacity) add records for the same GPU, and
  one that asks for another interval than the GPU already runs for another claim is refused.
"""

from __future__ import annotations

from collections.abc import Iterable

import structlog

from dra_driver.claimconfig.api import DeviceConfig, SharingStrategy, TimeSliceInterval
from dra_driver.inventory.catalog import AllocatableDevice
from dra_driver.nvml.backend import NvmlBackend
from dra_driver.nvml.types import NvmlError, NvmlReturn, TimeSlice
from dra_driver.plugin.actuator import PrepareError
from dra_driver.plugin.checkpoint import ClaimRecord
from dra_driver.plugin.faults import FaultPoints

log = structlog.get_logger(__name__)


def wanted_time_slice(device: AllocatableDevice, config: DeviceConfig) -> str | None:
    """The interval (`Default|Short|Medium|Long`) a device's resolved config asks for, None without time-slicing
    and on a MIG device: `TimeSlicing` alone on a MIG device is accepted with nothing to apply (NVIDIA's
    `simple-mig-ts`; the time-slice is a setting of the whole physical GPU, and the claim's containers share the
    MIG device anyway). An explicit interval on a MIG device never gets here: the decoder refuses it."""
    sharing = config.sharing
    if sharing.strategy is not SharingStrategy.TIME_SLICING or not device.kind.whole_gpu:
        return None
    return str(sharing.time_slice_interval or TimeSliceInterval.DEFAULT)


def time_slicing_notes(devices: Iterable[AllocatableDevice], configs: Iterable[DeviceConfig]) -> tuple[str, ...]:
    """What to tell the user when TimeSlicing was asked for where there is nothing to apply (MIG devices)."""
    mig = [d.name for d, c in zip(devices, configs, strict=True)
           if c.sharing.strategy is SharingStrategy.TIME_SLICING and not d.kind.whole_gpu]
    if not mig:
        return ()
    return (
        f"sharing strategy TimeSlicing on MIG device(s) {', '.join(mig)}: nothing to apply (the time-slice is a "
        "setting of the whole physical GPU); the claim's containers share the MIG device as with Exclusive",
    )


def time_slice_intervals(records: Iterable[ClaimRecord], gpu_uuid: str, *, excluding: str) -> dict[str, str]:
    """Claim (namespace/name) -> interval, for every other record that holds a time-slice on this GPU."""
    out: dict[str, str] = {}
    for record in records:
        if record.uid == excluding:
            continue
        for device in (*record.devices, *record.allocated):
            if device.gpu_uuid == gpu_uuid and device.time_slice is not None:
                out[f"{record.namespace}/{record.name}"] = device.time_slice
    return out


class TimeSlicer:
    """Sets and resets the time-slice of physical GPUs through NVML."""

    def __init__(self, nvml: NvmlBackend, faults: FaultPoints | None = None) -> None:
        self._nvml = nvml
        self._faults = faults or FaultPoints()

    def apply(self, gpu_uuid: str, device_name: str, interval: str) -> None:
        value = TimeSlice[interval.upper()]
        try:
            self._nvml.set_time_slice(gpu_uuid, value)
        except NvmlError as exc:
            if exc.code is NvmlReturn.NOT_SUPPORTED:
                raise PrepareError(
                    f"GPU {device_name} ({gpu_uuid}) does not support setting a time-slice ({exc}); "
                    "use strategy Exclusive for it or remove the sharing config"
                ) from None
            raise PrepareError(f"setting the time-slice of GPU {device_name} ({gpu_uuid}) failed: {exc}") from None
        self._faults.reached("sharing:after-set-timeslice")
        log.info("time-slice set", gpu_uuid=gpu_uuid, time_slice=interval)

    def reset(self, gpu_uuid: str, *, set_by_us: bool = False) -> bool:
        """Back to Default. Idempotent. Where the time-slice cannot be read (real GPUs: nvidia-smi sets it, nothing
        reads it), it is set to Default only when `set_by_us` (a record says this plugin set it); otherwise nothing
        proves it is ours to touch. A GPU that cannot set it has none to reset. True when something was changed."""
        try:
            try:
                if self._nvml.time_slice(gpu_uuid) is TimeSlice.DEFAULT:
                    return False
            except NvmlError as exc:
                if exc.code is not NvmlReturn.NOT_SUPPORTED or not set_by_us:
                    raise
            self._nvml.set_time_slice(gpu_uuid, TimeSlice.DEFAULT)
        except NvmlError as exc:
            if exc.code is NvmlReturn.NOT_SUPPORTED:
                return False
            raise PrepareError(f"resetting the time-slice of GPU {gpu_uuid} to Default failed: {exc}") from None
        self._faults.reached("sharing:after-reset-timeslice")
        log.info("time-slice reset to Default", gpu_uuid=gpu_uuid)
        return True

    def current(self, gpu_uuid: str) -> str | None:
        """The GPU's interval now, None where it cannot be read."""
        try:
            return self._nvml.time_slice(gpu_uuid).label
        except NvmlError:
            return None
