"""The fake node's PCI functions keep the kernel's bind/unbind rules, live in the fake node's state (file), and
decide what the fake NVML lists."""

from __future__ import annotations

from pathlib import Path

import pytest

from dra_driver.nvml.fake.backend import FakeNvml
from dra_driver.nvml.fake.nodefile import SpecError, parse_node_text
from dra_driver.nvml.fake.state import read_fake_state
from dra_driver.pci.model import PciError

NODE = """
gpus:
  - {model: H100-SXM5-80GB, count: 2}
  - {model: L4, pci_class: vga}
pci:
  groups: {"0000:25:00.0": 77}
  functions:
    - {address: "0000:32:00.2", group_of: "0000:32:00.0"}
  bind_faults:
    - {address: "0000:25:00.0", driver: vfio-pci}
"""


@pytest.fixture
def nvml(tmp_path: Path) -> FakeNvml:
    node = tmp_path / "node.yaml"
    node.write_text(NODE)
    backend = FakeNvml.from_file(node, settings=None)
    backend.init()
    return backend


def test_the_node_file_shapes_groups_and_functions(nvml: FakeNvml) -> None:
    pci = nvml.pci_sysfs()
    assert pci.function("0000:18:00.0").iommu_group == 20 and pci.function("0000:25:00.0").iommu_group == 77
    vga = pci.function("0000:32:00.0")
    assert vga.class_code == 0x030000 and vga.consumers == ("0000:32:00.1",)
    assert pci.group_functions(22) == ("0000:32:00.0", "0000:32:00.1", "0000:32:00.2")
    assert pci.function("0000:32:00.1").driver == "snd_hda_intel"
    assert pci.function("0000:32:00.2").driver == "xhci_hcd"


def test_bind_needs_an_unbound_matching_function(nvml: FakeNvml) -> None:
    pci = nvml.pci_sysfs()
    gpu = "0000:18:00.0"
    pci.load_module("vfio_pci")
    with pytest.raises(PciError, match="already bound to nvidia") as busy:
        pci.bind(gpu, "vfio-pci")
    assert busy.value.errno == 16  # EBUSY
    with pytest.raises(PciError, match="not bound to vfio-pci") as wrong:
        pci.unbind(gpu, "vfio-pci")
    assert wrong.value.errno == 19  # ENODEV
    pci.unbind(gpu, "nvidia")
    with pytest.raises(PciError, match="no id match"):
        pci.bind(gpu, "vfio-pci")  # vfio-pci matches by driver_override only
    pci.set_driver_override(gpu, "vfio-pci")
    with pytest.raises(PciError, match="driver_override is vfio-pci"):
        pci.bind(gpu, "nvidia")
    assert pci.function(gpu).driver is None
    pci.bind(gpu, "vfio-pci")
    assert (pci.function(gpu).driver, pci.function(gpu).vfio_dev) == ("vfio-pci", "vfio0")


def test_a_vfio_driver_needs_its_module(nvml: FakeNvml) -> None:
    pci = nvml.pci_sysfs()
    pci.unbind("0000:18:00.0", "nvidia")
    pci.set_driver_override("0000:18:00.0", "vfio-pci")
    with pytest.raises(PciError, match="module not loaded"):
        pci.bind("0000:18:00.0", "vfio-pci")
    assert not pci.module_loaded("vfio_pci") and pci.driver_name("vfio_pci") is None
    with pytest.raises(PciError, match="Module nonesuch not found"):
        pci.load_module("nonesuch")


def test_a_failed_probe_leaves_the_function_unbound(nvml: FakeNvml) -> None:
    pci = nvml.pci_sysfs()
    pci.load_module("vfio_pci")
    pci.set_driver_override("0000:25:00.0", "vfio-pci")
    pci.unbind("0000:25:00.0", "nvidia")
    with pytest.raises(PciError, match="injected fault") as failed:
        pci.bind("0000:25:00.0", "vfio-pci")
    assert failed.value.errno == 5
    assert pci.function("0000:25:00.0").driver is None
    pci.clear_bind_faults()
    pci.bind("0000:25:00.0", "vfio-pci")
    assert pci.function("0000:25:00.0").driver == "vfio-pci"


def test_a_gpu_off_nvidia_leaves_nvml_and_comes_back_without_persistence(nvml: FakeNvml) -> None:
    pci = nvml.pci_sysfs()
    uuid = nvml.gpus()[0].uuid
    nvml.set_persistence_mode(uuid, True)
    pci.set_driver_override("0000:18:00.0", "vfio-pci")
    pci.unbind("0000:18:00.0", "nvidia")
    assert uuid not in {g.uuid for g in nvml.gpus()}
    pci.set_driver_override("0000:18:00.0", None)
    pci.bind("0000:18:00.0", "nvidia")
    assert uuid in {g.uuid for g in nvml.gpus()}
    assert nvml.persistence_mode(uuid) is False  # the driver's state went with the unbind


def test_pci_state_is_shared_through_the_state_file(tmp_path: Path) -> None:
    node = tmp_path / "node.yaml"
    node.write_text(NODE)
    from dra_driver.nvml.fake.backend import FakeSettings

    settings = FakeSettings(state_path=tmp_path / "state.json")
    a, b = FakeNvml.from_file(node, settings=settings), FakeNvml.from_file(node, settings=settings)
    a.init()
    b.init()
    a.pci_sysfs().unbind("0000:32:00.1", "snd_hda_intel")
    assert b.pci_sysfs().function("0000:32:00.1").driver is None
    state = read_fake_state(tmp_path / "state.json")
    assert state.pci is not None and state.pci.driver_of("0000:32:00.1") is None


def test_running_processes_are_the_busy_pids(nvml: FakeNvml) -> None:
    uuid = nvml.gpus()[0].uuid
    nvml.set_busy(uuid, [12, 7])
    assert nvml.running_processes(uuid) == (7, 12)


def test_a_bad_pci_block_names_the_field() -> None:
    with pytest.raises(SpecError, match=r"pci.functions\[0\].group_of: .*bad|not a PCI address"):
        parse_node_text("gpus: [{model: L4}]\npci: {functions: [{address: '0000:01:00.0', group_of: 'x'}]}\n")
    with pytest.raises(SpecError, match="which is no GPU"):
        parse_node_text("gpus: [{model: L4}]\npci: {functions: [{address: '0000:01:00.0', group_of: '0000:02:00.0'}]}\n")
