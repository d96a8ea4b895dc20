"""One usage sample of a device as the usage metrics read it (observability/metrics.py): the figures every GPU
reports, whoever read them. NVML's sample (`nvml.types.DeviceUtilisation`, a layer above) is one, with the raw
clock-event mask the throttling is derived from. None: the device cannot report it — absent, never zero."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class UsageSample:
    """One usage sample of a device; None where NVML cannot tell."""

    gpu_utilization_percent: int | None = None  # SM busy time over the last sample period, 0-100
    memory_utilization_percent: int | None = None  # memory-controller busy time, 0-100
    memory_used_bytes: int | None = None
    memory_total_bytes: int | None = None
    power_watts: float | None = None
    temperature_celsius: int | None = None
    sm_clock_hertz: int | None = None
    ecc_corrected_total: int | None = None  # volatile (since the driver loaded)
    ecc_uncorrected_total: int | None = None

    @property
    def throttling(self) -> tuple[str, ...] | None:
        """The reasons the device runs slower than asked for; None: it cannot tell."""
        return None
