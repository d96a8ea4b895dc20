"""Usage samples: the real backend over patched pynvml (real ctypes structs, real NVMLError codes), and the fake's
load model and state-file overrides."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pynvml
import pytest

from dra_driver.errors import DecodeError
from dra_driver.nvml.fake.backend import FakeNvml, FakeSettings
from dra_driver.nvml.fake.state import FakeStateError, read_fake_state, usage_from_dict
from dra_driver.nvml.real.backend import RealNvml
from dra_driver.nvml.types import THROTTLE_REASONS, DeviceUtilisation, NvmlError, NvmlReturn, Placement
from tests.nvml.test_real import MIB, U0, U1, Fake, FakeGpu, backend, fake, gpus, memory, new_handle, raises, sysfs

__all__ = ["backend", "fake", "gpus", "sysfs"]  # the harness' fixtures, used by name below

MIG = "MIG-5a1e7c1c-7d0e-5b8e-9a53-1a2b3c4d0001"


def utilization(gpu: int, mem: int) -> Any:
    u = pynvml.c_nvmlUtilization_t()
    u.gpu, u.memory = gpu, mem
    return u


def test_a_gpu_sample_reads_every_counter(backend: RealNvml, fake: Fake, gpus: list[FakeGpu]) -> None:
    fake.on("nvmlDeviceGetUtilizationRates", lambda h: utilization(87, 41))
    fake.on("nvmlDeviceGetPowerUsage", lambda h: 312_500)  # milliwatts
    fake.on("nvmlDeviceGetTemperature", lambda h, sensor: 64 if sensor == pynvml.NVML_TEMPERATURE_GPU else -1)
    fake.on("nvmlDeviceGetClockInfo", lambda h, clock: 1755 if clock == pynvml.NVML_CLOCK_SM else -1)
    ecc = {pynvml.NVML_MEMORY_ERROR_TYPE_CORRECTED: 3, pynvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED: 0}
    fake.on("nvmlDeviceGetTotalEccErrors", lambda h, kind, counter: ecc[kind] if counter == 0 else -1)
    fake.on("nvmlDeviceGetCurrentClocksEventReasons", lambda h: 0x4 | 0x40)
    usage = backend.device_usage(U0)
    assert usage == DeviceUtilisation(
        gpu_utilization_percent=87,
        memory_utilization_percent=41,
        memory_used_bytes=81559 * MIB - (81559 * MIB) // 2,
        memory_total_bytes=81559 * MIB,
        power_watts=312.5,
        temperature_celsius=64,
        sm_clock_hertz=1_755_000_000,
        ecc_corrected_total=3,
        ecc_uncorrected_total=0,
        throttle_reasons=0x44,
    )
    assert usage.throttling == ("sw_power_cap", "hw_thermal_slowdown")


def test_what_a_gpu_cannot_report_is_none_and_old_drivers_use_the_throttle_name(backend: RealNvml, fake: Fake) -> None:
    for name in ("nvmlDeviceGetUtilizationRates", "nvmlDeviceGetPowerUsage", "nvmlDeviceGetTotalEccErrors"):
        fake.fail(name, pynvml.NVML_ERROR_NOT_SUPPORTED)
    fake.on("nvmlDeviceGetTemperature", lambda h, sensor: 40)
    fake.on("nvmlDeviceGetClockInfo", lambda h, clock: 210)
    fake.fail("nvmlDeviceGetCurrentClocksEventReasons", pynvml.NVML_ERROR_FUNCTION_NOT_FOUND)
    fake.on("nvmlDeviceGetCurrentClocksThrottleReasons", lambda h: 0x1)
    usage = backend.device_usage(U1)
    assert (usage.gpu_utilization_percent, usage.power_watts, usage.ecc_corrected_total) == (None, None, None)
    assert (usage.temperature_celsius, usage.throttle_reasons, usage.throttling) == (40, 0x1, ())


def test_a_real_error_is_not_hidden(backend: RealNvml, fake: Fake) -> None:
    fake.fail("nvmlDeviceGetMemoryInfo", pynvml.NVML_ERROR_GPU_IS_LOST)
    with pytest.raises(NvmlError) as err:
        backend.device_usage(U0)
    assert err.value.code is NvmlReturn.GPU_IS_LOST and err.value.call == "nvmlDeviceGetMemoryInfo"


def test_a_mig_device_reports_memory_only_and_is_asked_nothing_else(backend: RealNvml, fake: Fake) -> None:
    handle = new_handle(pynvml.struct_c_nvmlDevice_t)
    original = pynvml.nvmlDeviceGetHandleByUUID

    def by_uuid(uuid: Any) -> Any:
        return handle if uuid == MIG else original(uuid)

    fake.on("nvmlDeviceGetHandleByUUID", by_uuid)
    fake.on("nvmlDeviceGetMemoryInfo", lambda h: memory(10240 * MIB))
    for name in ("nvmlDeviceGetUtilizationRates", "nvmlDeviceGetPowerUsage", "nvmlDeviceGetTemperature"):
        fake.on(name, raises(pynvml.NVML_ERROR_NOT_SUPPORTED))
    usage = backend.device_usage(MIG)
    assert usage == DeviceUtilisation(memory_used_bytes=5120 * MIB, memory_total_bytes=10240 * MIB)
    assert usage.throttling is None
    assert fake.count("nvmlDeviceGetUtilizationRates") == fake.count("nvmlDeviceGetPowerUsage") == 0


# --- the fake -------------------------------------------------------------------------------------------


def test_the_load_model_is_deterministic_busy_when_held_and_idle_otherwise() -> None:
    a, b = FakeNvml.preset("dgx-h100"), FakeNvml.preset("dgx-h100")
    a.init()
    b.init()
    uuid = a.gpus()[0].uuid
    held = a.device_usage(uuid, held=True)
    assert held == b.device_usage(uuid, held=True)  # the same in every process
    assert held.gpu_utilization_percent is not None and 40 <= held.gpu_utilization_percent < 90
    assert held.throttling == () and held.power_watts is not None and held.power_watts > 70
    idle = a.device_usage(uuid)
    assert (idle.gpu_utilization_percent, idle.memory_used_bytes, idle.throttling) == (0, 0, ())


def test_mig_devices_report_memory_only_and_vanish_with_their_instance() -> None:
    nvml = FakeNvml.preset("dgx-a100")
    nvml.init()
    gpu = nvml.gpus()[0].uuid
    gi = nvml.create_gpu_instance(gpu, 19, Placement(0, 1))
    nvml.create_compute_instance(gpu, gi.id, 0)
    (mig,) = nvml.mig_devices(gpu)
    usage = nvml.device_usage(mig.uuid, held=True)
    assert usage.memory_total_bytes == mig.memory_bytes and usage.memory_used_bytes
    assert (usage.gpu_utilization_percent, usage.power_watts, usage.temperature_celsius, usage.throttling) == (
        None,
        None,
        None,
        None,
    )
    nvml.set_usage(mig.uuid, DeviceUtilisation(memory_used_bytes=123, gpu_utilization_percent=50))
    assert nvml.device_usage(mig.uuid) == DeviceUtilisation(memory_used_bytes=123, memory_total_bytes=mig.memory_bytes)
    nvml.destroy_compute_instance(gpu, gi.id, mig.compute_instance_id)
    with pytest.raises(NvmlError) as err:
        nvml.device_usage(mig.uuid)
    assert err.value.code is NvmlReturn.NOT_FOUND


def test_usage_set_in_the_state_file_reaches_another_process_view(tmp_path: Path) -> None:
    state = tmp_path / "fake.json"
    writer = FakeNvml.preset("l4x2", settings=FakeSettings(state_path=state))
    reader = FakeNvml.preset("l4x2", settings=FakeSettings(state_path=state))
    writer.init()
    reader.init()
    uuid = writer.gpus()[1].uuid
    writer.set_usage(uuid, DeviceUtilisation(gpu_utilization_percent=3, power_watts=41.5, throttle_reasons=0x8))
    usage = reader.device_usage(uuid, held=True)
    assert (usage.gpu_utilization_percent, usage.power_watts, usage.throttling) == (3, 41.5, ("hw_slowdown",))
    assert usage.memory_used_bytes is not None and usage.memory_used_bytes > 0  # unset: the load model
    assert read_fake_state(state).usage_of(uuid) == DeviceUtilisation(
        gpu_utilization_percent=3, power_watts=41.5, throttle_reasons=0x8
    )
    writer.set_usage(uuid, None)
    assert reader.device_usage(uuid).gpu_utilization_percent == 0


def test_every_usage_field_is_written_to_the_state_file_and_read_back(tmp_path: Path) -> None:
    state = tmp_path / "fake.json"
    nvml = FakeNvml.preset("l4x2", settings=FakeSettings(state_path=state))
    nvml.init()
    uuid = nvml.gpus()[0].uuid
    usage = DeviceUtilisation(
        gpu_utilization_percent=87,
        memory_utilization_percent=41,
        memory_used_bytes=5 * MIB,
        power_watts=72.5,
        temperature_celsius=64,
        sm_clock_hertz=1_755_000_000,
        ecc_corrected_total=3,
        ecc_uncorrected_total=1,
        throttle_reasons=0x44,
    )
    nvml.set_usage(uuid, usage)
    assert json.loads(state.read_text())["usage"][uuid] == {
        "utilization": 87,
        "memory_utilization": 41,
        "memory_used": 5 * MIB,
        "power": 72.5,
        "temperature": 64,
        "sm_clock_mhz": 1755,
        "ecc_corrected": 3,
        "ecc_uncorrected": 1,
        "throttle": ["sw_power_cap", "hw_thermal_slowdown"],
    }
    assert read_fake_state(state).usage_of(uuid) == usage


def test_a_bad_usage_entry_names_the_field(tmp_path: Path) -> None:
    state = tmp_path / "fake.json"
    nvml = FakeNvml.preset("l4x2", settings=FakeSettings(state_path=state))
    nvml.init()
    text = state.read_text().replace('"usage": {}', '"usage": {"GPU-x": {"utilization": 130, "throttle": ["hot"]}}')
    state.write_text(text)
    with pytest.raises(FakeStateError, match=r"usage\.GPU-x\.utilization.*usage\.GPU-x\.throttle\.0|utilization"):
        read_fake_state(state)


def test_the_state_file_throttle_names_are_the_nvml_reason_names() -> None:
    for bit, name in THROTTLE_REASONS:
        assert usage_from_dict({"throttle": [name]}).throttle_reasons == bit
    with pytest.raises(DecodeError, match=r"throttle\[0\]: must be one of gpu_idle, "):
        usage_from_dict({"throttle": ["hot"]})
