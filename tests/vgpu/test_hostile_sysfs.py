"""Hostile vGPU sysfs files (dra_driver/pci/vgpu.py reads them as untrusted input): garbage in
creatable_vgpu_types creates nothing, a non-numeric current_vgpu_type is an error naming the file (the VF is neither
free nor ours to destroy), huge and non-text files are refused unread, a symlink loop reads as absent, garbage in
available_instances reads as none; and the effect turns each into a prepare error, writing nothing."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from dra_driver.pci.model import PciError
from dra_driver.pci.vgpu import MAX_ATTRIBUTE_BYTES, HostVgpuSysfs, mdev_type_dir, parse_creatable
from tests.vgpu.test_fake_and_sysfs import _host_tree

PF = "0000:41:00.0"
FREE_VF = "0000:41:00.4"


def _current(devices: Path) -> Path:
    return devices / FREE_VF / "nvidia" / "current_vgpu_type"


@pytest.mark.parametrize(
    "text",
    [
        "1414 NVIDIA H200X-1-18C\n",  # no colon
        "-1414 : negative\n",
        "99999999999999999999 : too wide an id\n",
        "\u0661\u0664 : Arabic-Indic digits\n",  # str.isdigit() says yes, int() would take them
        ": no id\n",
        "\x00\x01\x02",
    ],
)
def test_creatable_garbage_lists_nothing_creatable(text: str) -> None:
    assert parse_creatable(text) == ()


@pytest.mark.parametrize("value", ["abc", "14x", "0x1f", "-1", "", "12345678901"])
def test_a_non_numeric_current_vgpu_type_is_an_error_naming_the_file(tmp_path: Path, value: str) -> None:
    devices = _host_tree(tmp_path)
    _current(devices).write_text(value + "\n")
    with pytest.raises(PciError, match=rf"{FREE_VF}: nvidia/current_vgpu_type holds .*not a vGPU type id"):
        HostVgpuSysfs(tmp_path).virtual_functions(PF)


def test_a_huge_attribute_is_refused_without_reading_it_whole(tmp_path: Path) -> None:
    devices = _host_tree(tmp_path)
    creatable = devices / FREE_VF / "nvidia" / "creatable_vgpu_types"
    creatable.write_text("1414 : NVIDIA H200X-1-18C\n" * (MAX_ATTRIBUTE_BYTES // 10))
    with pytest.raises(PciError, match=rf"creatable_vgpu_types is larger than {MAX_ATTRIBUTE_BYTES} bytes"):
        HostVgpuSysfs(tmp_path).virtual_functions(PF)


def test_a_binary_attribute_is_refused(tmp_path: Path) -> None:
    devices = _host_tree(tmp_path)
    _current(devices).write_bytes(b"\xff\xfe0\n")
    with pytest.raises(PciError, match="current_vgpu_type is not ASCII text"):
        HostVgpuSysfs(tmp_path).virtual_functions(PF)


def test_a_symlink_loop_reads_as_no_vgpu_interface(tmp_path: Path) -> None:
    devices = _host_tree(tmp_path)
    current = _current(devices)
    current.unlink()
    os.symlink(current.name, current)  # a link to itself: ELOOP
    with pytest.raises(PciError, match=f"virtual function {FREE_VF} has no nvidia/current_vgpu_type"):
        HostVgpuSysfs(tmp_path).virtual_functions(PF)


def test_a_virtfn_link_to_itself_is_an_error_naming_it(tmp_path: Path) -> None:
    devices = _host_tree(tmp_path)
    os.symlink("virtfn7", devices / PF / "virtfn7")
    with pytest.raises(PciError, match="virtual function virtfn7 has no nvidia/current_vgpu_type"):
        HostVgpuSysfs(tmp_path).virtual_functions(PF)  # no VF is chosen on a GPU whose VFs cannot all be read


@pytest.mark.parametrize("value", ["lots", "0x8", "-3", "99999999999999"])
def test_garbage_available_instances_reads_as_none_available(tmp_path: Path, value: str) -> None:
    d = tmp_path / "class" / "mdev_bus" / "0000:3b:00.0" / "mdev_supported_types" / mdev_type_dir(222)
    d.mkdir(parents=True)
    (d / "name").write_text("GRID T4-2Q\n")
    (d / "available_instances").write_text(value + "\n")
    [found] = HostVgpuSysfs(tmp_path).mdev_types("0000:3b:00.0")
    assert (found.type_dir, found.available) == ("nvidia-222", 0)
