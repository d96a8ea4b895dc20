"""What a vGPU host offers (docs/vgpu.md): the catalog's vGPU slots per type, narrowed to the type a GPU holds; none
in MIG mode or unselected; the counters that make vGPUs exclude the GPU's other uses (and, with compatibility
groups, each other's types); the slice attributes; the device metadata naming the VF; the flag's errors."""

from __future__ import annotations

from pathlib import Path

import pytest

from dra_driver.inventory.catalog import AllocatableDevice, DeviceKind, MigOffering, catalog
from dra_driver.inventory.discover import discover
from dra_driver.inventory.passthrough import passthrough_settings
from dra_driver.inventory.sharing import EXCLUSIVE
from dra_driver.inventory.vgpu import NO_VGPU, VgpuSettingsError, vgpu_settings
from dra_driver.nvml.factory import open_backend
from dra_driver.nvml.fake.backend import FakeNvml
from dra_driver.plugin.checkpoint import PreparedDevice, VgpuRecord
from dra_driver.plugin.devicemetadata import prepared_attributes
from dra_driver.slices.builder import SliceSettings, build_slices
from dra_driver.slices.counters import consumption, counter_totals

NODE = "name: vgpu-node\ngpus:\n  - model: H100-SXM5-80GB\n    count: 2\n"


@pytest.fixture
def nvml(tmp_path: Path) -> FakeNvml:
    node = tmp_path / "node.yaml"
    node.write_text(NODE)
    backend = open_backend(f"fake:{node},vgpu=true")
    assert isinstance(backend, FakeNvml)
    backend.init()
    return backend


def _offer(nvml: FakeNvml, vgpu: str = "all", mig: MigOffering = MigOffering.STATIC) -> dict[str, AllocatableDevice]:
    return catalog(discover(nvml), mig, EXCLUSIVE, passthrough_settings("all"), vgpu_settings(vgpu))


def test_every_type_is_offered_per_instance_slot_on_selected_gpus(nvml: FakeNvml) -> None:
    devices = _offer(nvml, "0")
    names = sorted(n for n, d in devices.items() if d.kind is DeviceKind.VGPU)
    assert len(names) == 1 + 2 + 4 + 8 and all(n.startswith("gpu-0-vgpu-h100-") for n in names)
    assert "gpu-0-vgpu-h100-10c-7" in names and "gpu-0-vgpu-h100-80c-0" in names
    assert all(d.partitioned for d in devices.values() if d.gpu.info.index == 0)  # whole, vfio, vGPUs: one set
    assert not any(d.kind is DeviceKind.VGPU for d in catalog(discover(nvml), MigOffering.STATIC, vgpu=NO_VGPU).values())


def test_a_gpu_holding_a_type_offers_that_type_alone_and_none_in_mig_mode(nvml: FakeNvml) -> None:
    sysfs = nvml.vgpu_sysfs()
    gpu0, gpu1 = nvml.node.gpus
    sysfs.set_vgpu_type(sysfs.virtual_functions(gpu0.bus_id)[0].address, 902)  # 40C
    vgpus = {n for n, d in _offer(nvml).items() if d.kind is DeviceKind.VGPU and d.gpu.uuid == gpu0.uuid}
    assert vgpus == {"gpu-0-vgpu-h100-40c-0", "gpu-0-vgpu-h100-40c-1"}
    sysfs.set_vgpu_type(sysfs.virtual_functions(gpu0.bus_id)[1].address, 902)  # full: both slots stay published
    assert {n for n, d in _offer(nvml).items() if d.kind is DeviceKind.VGPU and d.gpu.uuid == gpu0.uuid} == vgpus
    nvml.set_mig_mode(gpu1.uuid, True)
    assert not any(d.kind is DeviceKind.VGPU and d.gpu.uuid == gpu1.uuid for d in _offer(nvml).values())


def test_dynamic_mig_is_not_offered_on_a_gpu_offered_as_vgpus(nvml: FakeNvml) -> None:
    devices = _offer(nvml, "0", MigOffering.DYNAMIC)
    kinds = {(d.gpu.info.index, d.kind) for d in devices.values()}
    assert (0, DeviceKind.MIG_DYNAMIC) not in kinds and (0, DeviceKind.VGPU) in kinds
    assert (1, DeviceKind.MIG_DYNAMIC) in kinds


def test_counters_make_vgpus_exclude_the_whole_gpu_and_fit_the_types_instances(nvml: FakeNvml) -> None:
    devices = _offer(nvml, "0")
    gpu = devices["gpu-0"].gpu
    memory = counter_totals(gpu)["memory"]
    small = consumption(devices["gpu-0-vgpu-h100-10c-0"])[0]["counters"]
    assert set(small) == {"memory"}
    whole = consumption(devices["gpu-0"])[0]["counters"]
    assert whole["memory"] == consumption(devices["gpu-0-vgpu-h100-80c-0"])[0]["counters"]["memory"]
    assert set(whole) == set(counter_totals(gpu))  # the whole GPU (and its VFIO device) take every counter
    eighth = consumption(devices["gpu-0-vgpu-h100-10c-0"], frozenset({gpu.uuid}))[0]
    assert eighth["compatibilityGroups"] == ["vgpu-908"]
    assert consumption(devices["gpu-0"], frozenset({gpu.uuid}))[0]["compatibilityGroups"] == ["native"]
    assert memory // 8 > 0


def test_the_slice_attributes_name_the_type_and_the_parent_not_a_pci_function(nvml: FakeNvml) -> None:
    inventory = discover(nvml)
    devices = catalog(inventory, MigOffering.STATIC, vgpu=vgpu_settings("all"))
    settings = SliceSettings(driver_name="gpu.dra.dev", node_name="n", vgpu=vgpu_settings("all"))
    built = {d["name"]: d for s in build_slices(inventory.system, devices, settings, 1)
             for d in s["spec"].get("devices", [])}  # fmt: skip
    device = built["gpu-1-vgpu-h100-20c-3"]
    attrs = device["attributes"]
    assert attrs["type"] == {"string": "vgpu"} and attrs["vgpuTypeId"] == {"int": 904}
    assert attrs["vgpuType"] == {"string": "NVIDIA H100-20C"} and attrs["vgpuClass"] == {"string": "Compute"}
    assert attrs["parentUUID"] == {"string": devices["gpu-1"].gpu.uuid}
    assert "resource.kubernetes.io/pciBusID" not in attrs and "parentPciBusID" in attrs
    assert device["capacity"]["memory"]["value"].endswith("Mi") or device["capacity"]["memory"]["value"].endswith("Gi")
    order = [n for n in built if n.startswith("gpu-1")]
    assert order.index("gpu-1") < order.index("gpu-1-vgpu-h100-80c-0") < order.index("gpu-1-vgpu-h100-10c-0")


def test_device_metadata_names_the_vgpus_vf(nvml: FakeNvml) -> None:
    inventory = discover(nvml)
    device = catalog(inventory, MigOffering.STATIC, vgpu=vgpu_settings("all"))["gpu-0-vgpu-h100-20c-0"]
    record = PreparedDevice(("vm",), "n", device.name, gpu_uuid=device.gpu.uuid,
                            vgpu=VgpuRecord("0000:18:00.0", 904, "NVIDIA H100-20C", vf="0000:18:00.4", group=300))
    attrs = prepared_attributes(record, device, inventory.system)
    assert attrs["resource.kubernetes.io/pciBusID"] == {"string": "0000:18:00.4"}
    assert attrs["vgpuType"] == {"string": "NVIDIA H100-20C"}


def test_the_flag_names_gpus_and_refuses_mig_devices() -> None:
    assert not vgpu_settings("none").enabled and vgpu_settings("all").enabled
    assert vgpu_settings("0,GPU-abc,1b:00.0").gpus == ("0", "GPU-abc", "0000:1b:00.0")
    with pytest.raises(VgpuSettingsError, match="--vgpu"):
        vgpu_settings("MIG-123")
    with pytest.raises(VgpuSettingsError, match="names no GPU"):
        vgpu_settings("gpu zero")
