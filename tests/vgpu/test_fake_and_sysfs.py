"""vGPU below the effect: the fake NVML's vGPU answers and the fake per-VF sysfs with the driver's refusal rules
(docs/vgpu.md), the state file keeping VF types across processes, and the host's sysfs reader/writer on a tree of
plain files."""

from __future__ import annotations

import errno
import json
import os
from pathlib import Path

import pytest

from dra_driver.nvml.factory import open_backend
from dra_driver.nvml.fake.backend import FakeNvml
from dra_driver.nvml.fake.state import state_from_dict
from dra_driver.pci.model import PciError
from dra_driver.pci.vgpu import HostVgpuSysfs, parse_creatable

NODE = "name: vgpu-node\ngpus:\n  - model: H100-SXM5-80GB\n    count: 2\n  - model: L4\n"
H100_20C, H100_40C, H100_80C = 904, 902, 901


@pytest.fixture
def nvml(tmp_path: Path) -> FakeNvml:
    node = tmp_path / "node.yaml"
    node.write_text(NODE)
    backend = open_backend(f"fake:{node},state={tmp_path / 'state.json'},vgpu=true")
    assert isinstance(backend, FakeNvml)
    backend.init()
    return backend


def _pf(nvml: FakeNvml, index: int) -> str:
    return nvml.node.gpus[index].bus_id


def test_nvml_lists_the_types_and_narrows_creatable_to_the_type_a_gpu_holds(nvml: FakeNvml) -> None:
    uuid = nvml.node.gpus[0].uuid
    state = nvml.vgpu_state(uuid)
    assert state is not None
    assert [(t.name, t.max_instances, round(t.framebuffer_bytes / 2**30)) for t in state.supported] == [
        ("NVIDIA H100-80C", 1, 80), ("NVIDIA H100-40C", 2, 40), ("NVIDIA H100-20C", 4, 20), ("NVIDIA H100-10C", 8, 10),
    ]
    assert state.creatable == (901, 902, 904, 908) and state.active == ()
    sysfs = nvml.vgpu_sysfs()
    vfs = sysfs.virtual_functions(_pf(nvml, 0))
    assert len(vfs) == 8 and len({vf.iommu_group for vf in vfs}) == 8
    sysfs.set_vgpu_type(vfs[0].address, H100_20C)
    after = nvml.vgpu_state(uuid)
    assert after is not None and after.creatable == (H100_20C,) and after.active == (H100_20C,)
    now = sysfs.virtual_functions(_pf(nvml, 0))
    assert now[0].current_type == H100_20C and now[0].creatable == () and now[0].vfio_dev is not None
    assert now[1].creatable == (H100_20C,)
    other = nvml.vgpu_state(nvml.node.gpus[1].uuid)
    assert other is not None and other.creatable == (901, 902, 904, 908)  # another GPU is untouched


def test_the_drivers_refusals(nvml: FakeNvml) -> None:
    sysfs = nvml.vgpu_sysfs()
    vfs = sysfs.virtual_functions(_pf(nvml, 0))
    sysfs.set_vgpu_type(vfs[0].address, H100_40C)
    with pytest.raises(PciError) as busy:
        sysfs.set_vgpu_type(vfs[0].address, H100_40C)  # the VF has a type
    assert busy.value.errno == errno.EBUSY
    with pytest.raises(PciError) as mixed:
        sysfs.set_vgpu_type(vfs[1].address, H100_20C)  # one type per GPU
    assert mixed.value.errno == errno.EINVAL
    sysfs.set_vgpu_type(vfs[1].address, H100_40C)
    with pytest.raises(PciError) as full:
        sysfs.set_vgpu_type(vfs[2].address, H100_40C)  # two 40C fill an 80 GB GPU
    assert full.value.errno == errno.EINVAL
    assert nvml.vgpu_state(nvml.node.gpus[0].uuid).creatable == ()  # type: ignore[union-attr]
    sysfs.set_vgpu_type(vfs[0].address, 0)
    sysfs.set_vgpu_type(vfs[1].address, 0)
    assert nvml.vgpu_state(nvml.node.gpus[0].uuid).creatable == (901, 902, 904, 908)  # type: ignore[union-attr]


def test_mig_mode_and_passthrough_leave_nothing_creatable(nvml: FakeNvml) -> None:
    uuid = nvml.node.gpus[0].uuid
    nvml.set_mig_mode(uuid, True)
    assert nvml.vgpu_state(uuid).creatable == ()  # type: ignore[union-attr]
    vf = nvml.vgpu_sysfs().virtual_functions(_pf(nvml, 0))[0]
    assert vf.creatable == ()
    with pytest.raises(PciError) as refused:
        nvml.vgpu_sysfs().set_vgpu_type(vf.address, H100_80C)
    assert refused.value.errno == errno.EINVAL
    nvml.set_mig_mode(uuid, False)
    pci = nvml.pci_sysfs()
    second = _pf(nvml, 1)
    pci.load_module("vfio_pci")
    pci.set_driver_override(second, "vfio-pci")
    pci.unbind(second, "nvidia")
    pci.bind(second, "vfio-pci")
    assert all(vf.creatable == () for vf in nvml.vgpu_sysfs().virtual_functions(second))


def test_without_the_knob_or_before_ampere_there_is_no_vgpu(tmp_path: Path) -> None:
    node = tmp_path / "node.yaml"
    node.write_text(NODE)
    plain = open_backend(f"fake:{node}")
    assert isinstance(plain, FakeNvml)
    plain.init()
    assert plain.vgpu_state(plain.node.gpus[0].uuid) is None
    assert plain.vgpu_sysfs().virtual_functions(plain.node.gpus[0].bus_id) == ()
    with pytest.raises(PciError):
        plain.vgpu_sysfs().set_vgpu_type("0000:00:00.4", H100_80C)


def test_the_state_file_keeps_vf_types_for_the_next_process(nvml: FakeNvml, tmp_path: Path) -> None:
    vf = nvml.vgpu_sysfs().virtual_functions(_pf(nvml, 1))[3]
    nvml.vgpu_sysfs().set_vgpu_type(vf.address, H100_20C)
    again = open_backend(f"fake:{tmp_path / 'node.yaml'},state={tmp_path / 'state.json'},vgpu=true")
    assert isinstance(again, FakeNvml)
    again.init()
    assert again.vgpu_sysfs().virtual_functions(_pf(again, 1))[3].current_type == H100_20C
    state = state_from_dict(json.loads((tmp_path / "state.json").read_text()))  # the bytes on disk
    assert state.vgpu == ((vf.address, H100_20C),)


# --- the host's sysfs --------------------------------------------------------------------------------


def _host_tree(root: Path) -> Path:
    devices = root / "bus" / "pci" / "devices"
    pf = devices / "0000:41:00.0"
    pf.mkdir(parents=True)
    for n, (address, current, creatable) in enumerate(
        [("0000:41:00.4", "0", "ID    : vGPU Name\n1414 : NVIDIA H200X-1-18C\n1428 : NVIDIA H200X-141C\n"),
         ("0000:41:00.5", "1414", "")]
    ):
        vf = devices / address
        (vf / "nvidia").mkdir(parents=True)
        (vf / "nvidia" / "current_vgpu_type").write_text(current + "\n")
        (vf / "nvidia" / "creatable_vgpu_types").write_text(creatable)
        (root / "kernel" / "iommu_groups" / str(80 + n)).mkdir(parents=True)
        os.symlink(f"../../../kernel/iommu_groups/{80 + n}", vf / "iommu_group")
        os.symlink(f"../{address}", pf / f"virtfn{n}")
    (devices / "0000:41:00.5" / "vfio-dev" / "vfio3").mkdir(parents=True)
    return devices


def test_host_sysfs_reads_the_vfs_and_writes_one_value(tmp_path: Path) -> None:
    devices = _host_tree(tmp_path)
    sysfs = HostVgpuSysfs(tmp_path)
    free, used = sysfs.virtual_functions("0000:41:00.0")
    assert (free.address, free.iommu_group, free.current_type, free.creatable) == ("0000:41:00.4", 80, 0, (1414, 1428))
    assert (used.current_type, used.vfio_dev) == (1414, "vfio3")
    sysfs.set_vgpu_type("0000:41:00.4", 1428)
    assert (devices / "0000:41:00.4" / "nvidia" / "current_vgpu_type").read_bytes() == b"1428"
    assert sysfs.virtual_functions("0000:41:00.1") == ()  # no such GPU: no VFs
    with pytest.raises(PciError):
        sysfs.set_vgpu_type("0000:41:00.6", 1428)


def test_creatable_lines_are_parsed_by_their_leading_id() -> None:
    assert parse_creatable("ID : vGPU Name\n 903 : NVIDIA A100-10C\n904: NVIDIA A100-20C\n\n") == (903, 904)


# --- the real backend's reading, on pynvml's wrappers -------------------------------------------------


def test_the_real_reading_of_a_vgpu_host(monkeypatch: pytest.MonkeyPatch) -> None:
    import pynvml

    from dra_driver.nvml.real.vgpu import read_vgpu_state

    names = {11: "NVIDIA A100-10C", 12: "NVIDIA A100-20C"}
    calls = {
        "nvmlDeviceGetSupportedVgpus": lambda h: [11, 12],
        "nvmlDeviceGetCreatableVgpus": lambda h: [11],
        "nvmlDeviceGetActiveVgpus": lambda h: [7001],
        "nvmlVgpuInstanceGetType": lambda i: 11,
        "nvmlVgpuTypeGetName": lambda t: names[t],
        "nvmlVgpuTypeGetClass": lambda t: "Compute",
        "nvmlVgpuTypeGetFramebufferSize": lambda t: (t - 10) * 10 << 30,
        "nvmlVgpuTypeGetMaxInstances": lambda h, t: 4 // (t - 10),
    }
    for name, fn in calls.items():
        monkeypatch.setattr(pynvml, name, fn)
    state = read_vgpu_state(object())
    assert state is not None and state.creatable == (11,) and state.active == (11,)
    assert [(t.id, t.name, t.framebuffer_bytes >> 30, t.max_instances) for t in state.supported] == [
        (11, "NVIDIA A100-10C", 10, 4), (12, "NVIDIA A100-20C", 20, 2),
    ]


@pytest.mark.parametrize("code", [3, 999])  # NOT_SUPPORTED (no vGPU Manager), anything a bare-metal driver says
def test_a_node_that_is_no_vgpu_host_reads_none(monkeypatch: pytest.MonkeyPatch, code: int) -> None:
    import pynvml

    from dra_driver.nvml.real.vgpu import read_vgpu_state

    def refuse(handle: object) -> list[int]:
        raise pynvml.NVMLError(code)

    monkeypatch.setattr(pynvml, "nvmlDeviceGetSupportedVgpus", refuse)
    assert read_vgpu_state(object()) is None
    monkeypatch.setattr(pynvml, "nvmlDeviceGetSupportedVgpus", lambda h: [])
    assert read_vgpu_state(object()) is None


def test_host_sysfs_reads_mdev_types_and_devices_and_writes_create_and_remove(tmp_path: Path) -> None:
    from dra_driver.pci.vgpu import mdev_type_dir

    gpu = tmp_path / "devices" / "pci0000:00" / "0000:3b:00.0"
    types = gpu / "mdev_supported_types"
    for type_id, name, available in ((222, "GRID T4-2Q", 8), (223, "GRID T4-4Q", 0)):
        d = types / mdev_type_dir(type_id)
        d.mkdir(parents=True)
        (d / "name").write_text(name + "\n")
        (d / "available_instances").write_text(f"{available}\n")
        (d / "create").write_text("")
    (tmp_path / "class" / "mdev_bus").mkdir(parents=True)
    os.symlink(gpu, tmp_path / "class" / "mdev_bus" / "0000:3b:00.0")
    uuid = "83b8f4f2-509f-382f-3c1e-e6bfe0fa1001"
    mdev = gpu / uuid
    mdev.mkdir()
    os.symlink(types / "nvidia-222", mdev / "mdev_type")
    (tmp_path / "kernel" / "iommu_groups" / "61").mkdir(parents=True)
    os.symlink(tmp_path / "kernel" / "iommu_groups" / "61", mdev / "iommu_group")
    (mdev / "remove").write_text("")
    (tmp_path / "bus" / "mdev" / "devices").mkdir(parents=True)
    os.symlink(mdev, tmp_path / "bus" / "mdev" / "devices" / uuid)

    sysfs = HostVgpuSysfs(tmp_path)
    assert [(t.type_dir, t.name, t.available) for t in sysfs.mdev_types("0000:3b:00.0")] == [
        ("nvidia-222", "GRID T4-2Q", 8), ("nvidia-223", "GRID T4-4Q", 0),
    ]
    found = sysfs.mdev(uuid)
    assert found is not None and (found.parent, found.type_dir, found.iommu_group) == ("0000:3b:00.0", "nvidia-222", 61)
    assert sysfs.mdev("00000000-0000-0000-0000-000000000000") is None
    assert sysfs.mdev_types("0000:3c:00.0") == ()
    sysfs.create_mdev("0000:3b:00.0", "nvidia-222", "93b8f4f2-509f-382f-3c1e-e6bfe0fa1001")
    assert (types / "nvidia-222" / "create").read_bytes() == b"93b8f4f2-509f-382f-3c1e-e6bfe0fa1001"
    sysfs.remove_mdev(uuid)
    assert (mdev / "remove").read_bytes() == b"1"
