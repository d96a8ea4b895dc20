"""HostPciSysfs over a tree of plain files laid out as the kernel's sysfs: what it reads, and the exact bytes it
writes into driver_override, bind and unbind."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from dra_driver.pci.model import PciError, modalias, pci_address, vfio_variant
from dra_driver.pci.sysfs import HostPciSysfs

GPU = "0000:3f:00.0"
AUDIO = "0000:3f:00.1"


def _tree(root: Path) -> Path:
    sys = root / "sys"
    for driver in ("nvidia", "snd_hda_intel", "vfio-pci"):
        (sys / "bus/pci/drivers" / driver).mkdir(parents=True)
        for name in ("bind", "unbind"):
            (sys / "bus/pci/drivers" / driver / name).write_bytes(b"")
    (sys / "kernel/iommu_groups/23/devices").mkdir(parents=True)
    for address, driver, cls, device in ((GPU, "nvidia", "0x030000", "0x27b8"), (AUDIO, "snd_hda_intel", "0x040300", "0x22ba")):
        base = sys / "bus/pci/devices" / address
        base.mkdir(parents=True)
        os.symlink(f"../../../bus/pci/drivers/{driver}", base / "driver")
        os.symlink("../../../kernel/iommu_groups/23", base / "iommu_group")
        (base / "driver_override").write_text("(null)\n")
        (base / "class").write_text(f"{cls}\n")
        (base / "vendor").write_text("0x10de\n")
        (base / "device").write_text(f"{device}\n")
        (base / "modalias").write_text(modalias(0x10DE, int(device, 16), 0x10DE, 0x16C1, int(cls, 16)) + "\n")
        os.symlink(f"../../../../bus/pci/devices/{address}", sys / "kernel/iommu_groups/23/devices" / address)
    os.symlink(f"../{AUDIO}", sys / "bus/pci/devices" / GPU / f"consumer:pci:{AUDIO}")
    (sys / "bus/pci/devices" / GPU / "sriov_numvfs").write_text("0\n")
    (sys / "module/vfio_pci").mkdir(parents=True)
    return sys


@pytest.fixture
def host(tmp_path: Path) -> HostPciSysfs:
    alias = tmp_path / "modules.alias"
    alias.write_text(
        "alias pci:v000010DEd*sv*sd*bc03sc*i* nvidia\n"
        "alias vfio_pci:v000010DEd000027B8sv*sd*bc*sc*i* nvgrace_gpu_vfio_pci\n"
        "alias vfio_pci:v*d*sv*sd*bc*sc*i* catchall_vfio_pci\n"
    )
    (tmp_path / "dev").mkdir()
    return HostPciSysfs(_tree(tmp_path), dev_root=tmp_path / "dev", modules_alias=alias, modprobe=("true",))


def test_reads_a_function_as_the_kernel_shows_it(host: HostPciSysfs) -> None:
    gpu = host.function(GPU)
    assert (gpu.driver, gpu.driver_override, gpu.iommu_group, gpu.class_code) == ("nvidia", None, 23, 0x030000)
    assert (gpu.vendor, gpu.device, gpu.consumers, gpu.sriov_numvfs) == (0x10DE, 0x27B8, (AUDIO,), 0)
    assert gpu.modalias == "pci:v000010DEd000027B8sv000010DEsd000016C1bc03sc00i00"
    assert host.group_functions(23) == (GPU, AUDIO)
    assert host.iommu_enabled() and not host.iommufd_present()
    assert host.module_loaded("vfio-pci") and not host.module_loaded("nvgrace_gpu_vfio_pci")
    assert host.driver_name("vfio_pci") == "vfio-pci"  # the module's driver directory, `_` as `-`
    with pytest.raises(PciError, match=r"no PCI function 0000:99:00\.0"):
        host.function("0000:99:00.0")


def test_writes_exactly_the_bytes_the_kernel_expects(host: HostPciSysfs) -> None:
    sys = host.sys_root
    host.set_driver_override(GPU, "vfio-pci")
    assert (sys / "bus/pci/devices" / GPU / "driver_override").read_bytes() == b"vfio-pci"
    host.unbind(GPU, "nvidia")
    assert (sys / "bus/pci/drivers/nvidia/unbind").read_bytes() == GPU.encode()
    host.bind(GPU, "vfio-pci")
    assert (sys / "bus/pci/drivers/vfio-pci/bind").read_bytes() == GPU.encode()
    host.set_driver_override(GPU, None)
    assert (sys / "bus/pci/devices" / GPU / "driver_override").read_bytes() == b"\n"


def test_a_write_the_kernel_refuses_names_the_file(host: HostPciSysfs) -> None:
    with pytest.raises(PciError, match=r"binding .*drivers/nouveau/bind failed: No such file or directory"):
        host.bind(GPU, "nouveau")


def test_the_most_specific_vfio_variant_wins(host: HostPciSysfs) -> None:
    assert host.vfio_variant(GPU) == "nvgrace_gpu_vfio_pci"
    assert host.vfio_variant(AUDIO) == "catchall_vfio_pci"
    assert vfio_variant("pci:v000010DEd00002330sv0sd0bc03sc02i00", "alias pci:v* nvidia\n") == "vfio-pci"


def test_modprobe_runs_as_an_argv_and_a_failure_says_so(host: HostPciSysfs, tmp_path: Path) -> None:
    host.load_module("vfio_pci")  # `true vfio_pci`
    failing = HostPciSysfs(host.sys_root, modprobe=("false",))
    with pytest.raises(PciError, match=r"loading kernel module x .*exit status 1"):
        failing.load_module("x")


def test_iommu_off_is_an_empty_group_dir(tmp_path: Path) -> None:
    (tmp_path / "kernel/iommu_groups").mkdir(parents=True)
    assert not HostPciSysfs(tmp_path).iommu_enabled()


@pytest.mark.parametrize(
    ("text", "address"),
    [("00000000:1B:00.0", "0000:1b:00.0"), ("1b:00.0", "0000:1b:00.0"), ("0001:af:1f.7", "0001:af:1f.7")],
)
def test_pci_addresses_in_sysfs_form(text: str, address: str) -> None:
    assert pci_address(text) == address
