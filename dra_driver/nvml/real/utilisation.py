"""Usage samples of one device handle (GPU or MIG device) over pynvml; what the device cannot answer is None."""

from __future__ import annotations

from typing import Any

from dra_driver.nvml.real.calls import MISSING, nv
from dra_driver.nvml.types import DeviceUtilisation, NvmlError, NvmlReturn

NVML_TEMPERATURE_GPU = 0
NVML_CLOCK_SM = 1
NVML_MEMORY_ERROR_TYPE_CORRECTED = 0
NVML_MEMORY_ERROR_TYPE_UNCORRECTED = 1
NVML_VOLATILE_ECC = 0
# A MIG handle answers these with NOT_SUPPORTED, and also (older drivers) INVALID_ARGUMENT: "no value" too.
_MISSING_ON_MIG = MISSING | {NvmlReturn.INVALID_ARGUMENT}


def _maybe(name: str, *args: Any, missing: frozenset[NvmlReturn] = MISSING) -> Any:
    try:
        return nv(name, *args)
    except NvmlError as err:
        if err.code in missing:
            return None
        raise


def _throttle_reasons(handle: Any) -> int | None:
    # Renamed "clocks event reasons" in NVML 12.2; older drivers only have the throttle name.
    try:
        return int(nv("nvmlDeviceGetCurrentClocksEventReasons", handle))
    except NvmlError as err:
        if err.code not in MISSING:
            raise
    value = _maybe("nvmlDeviceGetCurrentClocksThrottleReasons", handle)
    return int(value) if value is not None else None


def _int(value: Any) -> int | None:
    return int(value) if value is not None else None


def sample(handle: Any, *, mig: bool) -> DeviceUtilisation:
    """One sample. A MIG device reports its memory only (NVML has no per-instance utilization, power,
    temperature, clocks, ECC or throttle reasons): those stay None rather than being asked for."""
    memory = _maybe("nvmlDeviceGetMemoryInfo", handle, missing=_MISSING_ON_MIG if mig else MISSING)
    used = _int(memory.used) if memory is not None else None
    total = _int(memory.total) if memory is not None else None
    if mig:
        return DeviceUtilisation(memory_used_bytes=used, memory_total_bytes=total)
    rates = _maybe("nvmlDeviceGetUtilizationRates", handle)
    power_mw = _maybe("nvmlDeviceGetPowerUsage", handle)
    sm_mhz = _maybe("nvmlDeviceGetClockInfo", handle, NVML_CLOCK_SM)
    return DeviceUtilisation(
        gpu_utilization_percent=_int(rates.gpu) if rates is not None else None,
        memory_utilization_percent=_int(rates.memory) if rates is not None else None,
        memory_used_bytes=used,
        memory_total_bytes=total,
        power_watts=int(power_mw) / 1000 if power_mw is not None else None,
        temperature_celsius=_int(_maybe("nvmlDeviceGetTemperature", handle, NVML_TEMPERATURE_GPU)),
        sm_clock_hertz=int(sm_mhz) * 1_000_000 if sm_mhz is not None else None,
        ecc_corrected_total=_int(
            _maybe("nvmlDeviceGetTotalEccErrors", handle, NVML_MEMORY_ERROR_TYPE_CORRECTED, NVML_VOLATILE_ECC)
        ),
        ecc_uncorrected_total=_int(
            _maybe("nvmlDeviceGetTotalEccErrors", handle, NVML_MEMORY_ERROR_TYPE_UNCORRECTED, NVML_VOLATILE_ECC)
        ),
        throttle_reasons=_throttle_reasons(handle),
    )
