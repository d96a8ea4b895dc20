"""The fake node's kernel driver: absent at start, unloaded under an open handle, reloaded with a new version."""

from __future__ import annotations

from pathlib import Path

import pytest

from dra_driver.nvml.factory import open_backend
from dra_driver.nvml.fake.backend import FakeNvml, FakeSettings
from dra_driver.nvml.fake.driver import driver_file
from dra_driver.nvml.types import ComputeMode, NvmlError, NvmlReturn, NvmlUnavailableError, Placement


def _pair(tmp_path: Path, *, absent: bool = False) -> tuple[FakeNvml, FakeNvml]:
    """Two handles on one fake node, as the plugin and a test in another process would hold them."""
    state = tmp_path / "state.json"
    plugin = FakeNvml.preset("dgx-h100", settings=FakeSettings(state_path=state, driver_absent=absent))
    operator = FakeNvml.preset("dgx-h100", settings=FakeSettings(state_path=state))
    return plugin, operator


def test_absent_driver_fails_init_until_loaded(tmp_path: Path) -> None:
    plugin, operator = _pair(tmp_path, absent=True)
    with pytest.raises(NvmlUnavailableError, match="DRIVER_NOT_LOADED"):
        plugin.init()
    assert operator.driver().loaded is False  # the sidecar is shared
    operator.load_driver()
    plugin.init()
    assert len(plugin.gpus()) == 8


def test_the_knob_starts_without_a_driver(tmp_path: Path) -> None:
    backend = open_backend(f"fake:l4x2,state={tmp_path / 's.json'},driver=absent")
    with pytest.raises(NvmlUnavailableError):
        backend.init()
    with pytest.raises(ValueError, match="driver='gone'"):
        open_backend("fake:l4x2,driver=gone")


def test_unload_fails_calls_on_an_open_handle(tmp_path: Path) -> None:
    plugin, operator = _pair(tmp_path)
    plugin.init()
    uuid = plugin.gpus()[0].uuid
    operator.unload_driver()
    with pytest.raises(NvmlError) as per_gpu:
        plugin.mig_mode(uuid)
    assert per_gpu.value.code is NvmlReturn.GPU_IS_LOST
    with pytest.raises(NvmlError) as system:
        plugin.system_info()
    assert system.value.code is NvmlReturn.DRIVER_NOT_LOADED
    with pytest.raises(NvmlUnavailableError):
        FakeNvml.preset("dgx-h100", settings=FakeSettings(state_path=tmp_path / "state.json")).init()


def test_reload_makes_old_handles_stale_and_drops_what_the_old_driver_held(tmp_path: Path) -> None:
    plugin, operator = _pair(tmp_path)
    plugin.init()
    uuid = plugin.gpus()[0].uuid
    plugin.set_mig_mode(uuid, True)
    plugin.create_gpu_instance(uuid, 19, Placement(0, 1))  # 1g.10gb
    plugin.set_compute_mode(plugin.gpus()[1].uuid, ComputeMode.EXCLUSIVE_PROCESS)
    old_version = plugin.system_info().driver_version

    operator.unload_driver()
    operator.load_driver("580.200.01")
    with pytest.raises(NvmlError) as stale:
        plugin.gpus()
    assert stale.value.code is NvmlReturn.UNINITIALIZED and "580.200.01" in str(stale.value)

    plugin.shutdown()
    plugin.init()
    info = plugin.system_info()
    assert info.driver_version == "580.200.01" != old_version and info.nvml_version.endswith("580.200.01")
    assert plugin.gpu_instances(uuid) == []  # MIG instances did not survive the reload
    assert plugin.mig_mode(uuid) is not None and plugin.mig_mode(uuid).current  # type: ignore[union-attr]
    assert plugin.compute_mode(plugin.gpus()[1].uuid) is ComputeMode.DEFAULT
    assert '"generation": 1' in driver_file(tmp_path / "state.json").read_text()


def test_in_memory_fake_reloads_too() -> None:
    fake = FakeNvml.preset("l4x2")
    fake.init()
    fake.load_driver("999.1.1")
    with pytest.raises(NvmlError):
        fake.gpus()
    fake.shutdown()
    fake.init()
    assert fake.system_info().driver_version == "999.1.1"
