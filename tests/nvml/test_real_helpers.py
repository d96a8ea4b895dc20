"""Pure and sysfs helpers of the real backend: conversions, the fake sysfs tree, library search and messages."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from dra_driver.nvml.real.convert import (
    brand_name,
    normalize_pci_bus_id,
    pcie_root_from_path,
    set_bits,
    uuid_text,
)
from dra_driver.nvml.real.loader import (
    SONAME,
    driver_library_dirs,
    find_driver_library,
    init_failure_message,
    library_load_failed_message,
    library_not_found_message,
)
from dra_driver.nvml.real.sysfs import numa_neighbours_from_sysfs, numa_node_from_sysfs, pcie_root_from_sysfs
from dra_driver.nvml.types import NvmlReturn

# --- conversions ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        ("00000000:53:00.0", "0000:53:00.0"),
        ("00000000:CA:00.0", "0000:ca:00.0"),
        ("0000:9D:00.0", "0000:9d:00.0"),
        ("00000001:1B:00.0\x00", "0001:1b:00.0"),
        ("00010000:01:00.0", "10000:01:00.0"),  # VMD domain keeps its width
        ("not-a-bus-id", "not-a-bus-id"),
        ("WEIRD", "weird"),
    ],
)
def test_normalize_pci_bus_id(raw: str, expected: str) -> None:
    assert normalize_pci_bus_id(raw) == expected


@pytest.mark.parametrize(
    ("code", "name"), [(14, "Nvidia"), (2, "Tesla"), (0, "Unknown"), (13, "NvidiaRTX"), (99, "Unknown")]
)
def test_brand_name(code: int, name: str) -> None:
    assert brand_name(code) == name


def test_set_bits_spans_words() -> None:
    assert set_bits([0b1010, 0, 1 << 63]) == (1, 3, 191)
    assert set_bits([]) == ()
    assert set_bits([0, 1]) == (64,)


@given(st.sets(st.integers(min_value=0, max_value=4095)))
def test_set_bits_roundtrip(positions: set[int]) -> None:
    words = [0] * 64
    for p in positions:
        words[p // 64] |= 1 << (p % 64)
    assert set_bits(words) == tuple(sorted(positions))


def test_uuid_text() -> None:
    raw = bytes(range(16))
    assert uuid_text(raw) == "00010203-0405-0607-0809-0a0b0c0d0e0f"
    assert uuid_text(bytes(16)) == "00000000-0000-0000-0000-000000000000"
    with pytest.raises(ValueError, match="clusterUuid must be 16 bytes"):
        uuid_text(b"\x01\x02")


@pytest.mark.parametrize(
    ("path", "root"),
    [
        ("/sys/devices/pci0000:00/0000:00:01.0/0000:53:00.0", "pci0000:00"),
        ("/sys/devices/pci0000:b0/0000:b0:02.0/0000:b1:00.0/0000:b2:00.0", "pci0000:b0"),
        ("/sys/devices/platform/foo/0000:53:00.0", None),
    ],
)
def test_pcie_root_from_path(path: str, root: str | None) -> None:
    assert pcie_root_from_path(path) == root


# --- sysfs ----------------------------------------------------------------------------------------


def make_pci_device(sysfs: Path, root_complex: str, chain: list[str], numa: str | None = None) -> Path:
    """A fake sysfs: devices/<root>/<bridges…>/<gpu> and bus/pci/devices/<gpu> -> relative symlink."""
    device = sysfs / "devices" / root_complex
    for part in chain:
        device = device / part
    device.mkdir(parents=True)
    if numa is not None:
        (device / "numa_node").write_text(numa + "\n")
    links = sysfs / "bus" / "pci" / "devices"
    links.mkdir(parents=True, exist_ok=True)
    (links / chain[-1]).symlink_to(os.path.relpath(device, links))
    return device


def test_pcie_root_through_symlink(tmp_path: Path) -> None:
    make_pci_device(tmp_path, "pci0000:00", ["0000:00:01.0", "0000:01:00.0", "0000:53:00.0"])
    make_pci_device(tmp_path, "pci0000:80", ["0000:80:03.0", "0000:9d:00.0"])
    assert pcie_root_from_sysfs(str(tmp_path), "0000:53:00.0") == "pci0000:00"
    assert pcie_root_from_sysfs(str(tmp_path), "0000:9d:00.0") == "pci0000:80"


def test_pcie_root_missing_device_is_none(tmp_path: Path) -> None:
    assert pcie_root_from_sysfs(str(tmp_path), "0000:53:00.0") is None


def test_pcie_root_without_root_component_is_none(tmp_path: Path) -> None:
    target = tmp_path / "devices" / "platform" / "0000:53:00.0"
    target.mkdir(parents=True)
    links = tmp_path / "bus" / "pci" / "devices"
    links.mkdir(parents=True)
    (links / "0000:53:00.0").symlink_to(target)
    assert pcie_root_from_sysfs(str(tmp_path), "0000:53:00.0") is None


@pytest.mark.parametrize(("content", "expected"), [("1", 1), ("0", 0), ("-1", None), ("garbage", None)])
def test_numa_node_from_sysfs(tmp_path: Path, content: str, expected: int | None) -> None:
    make_pci_device(tmp_path, "pci0000:00", ["0000:53:00.0"], numa=content)
    assert numa_node_from_sysfs(str(tmp_path), "0000:53:00.0") == expected


def test_numa_node_missing_file_is_none(tmp_path: Path) -> None:
    make_pci_device(tmp_path, "pci0000:00", ["0000:53:00.0"])
    assert numa_node_from_sysfs(str(tmp_path), "0000:53:00.0") is None


# --- library search and messages ------------------------------------------------------------------


def test_driver_library_dirs_order_follows_host_arch(tmp_path: Path) -> None:
    root = str(tmp_path)
    x86 = [os.path.relpath(d, root) for d in driver_library_dirs(root, "x86_64")]
    assert x86 == [
        "usr/lib64",
        "usr/lib/x86_64-linux-gnu",
        "usr/lib/aarch64-linux-gnu",
        "lib64",
        "lib/x86_64-linux-gnu",
        "lib/aarch64-linux-gnu",
        "usr/lib",
        "lib",
    ]
    arm = [os.path.relpath(d, root) for d in driver_library_dirs(root, "aarch64")]
    assert arm[1] == "usr/lib/aarch64-linux-gnu"
    assert arm[4] == "lib/aarch64-linux-gnu"


def test_find_driver_library_takes_first_existing(tmp_path: Path) -> None:
    dirs = driver_library_dirs(str(tmp_path), "x86_64")
    assert find_driver_library(dirs) is None
    versioned = tmp_path / "usr/lib/x86_64-linux-gnu/libnvidia-ml.so.580.105.08"
    versioned.parent.mkdir(parents=True)
    versioned.write_bytes(b"\x7fELF")
    (versioned.parent / SONAME).symlink_to(versioned.name)
    assert find_driver_library(dirs) == str(versioned.parent / SONAME)
    (tmp_path / "usr/lib64").mkdir(parents=True)
    (tmp_path / "usr/lib64" / SONAME).write_bytes(b"\x7fELF")
    assert find_driver_library(dirs) == str(tmp_path / "usr/lib64" / SONAME)


def test_find_driver_library_ignores_dangling_symlink(tmp_path: Path) -> None:
    lib = tmp_path / "usr/lib64"
    lib.mkdir(parents=True)
    (lib / SONAME).symlink_to("libnvidia-ml.so.gone")
    assert find_driver_library([str(lib)]) is None


def test_not_found_message_names_every_place_searched() -> None:
    dirs = ("/drv/usr/lib64", "/drv/lib64")
    msg = library_not_found_message("/drv", dirs, "/opt/a:/opt/b")
    assert "\n" not in msg
    assert "libnvidia-ml.so.1 was not found" in msg
    assert "LD_LIBRARY_PATH=/opt/a:/opt/b" in msg
    assert "/etc/ld.so.cache" in msg
    assert "--driver-root /drv: /drv/usr/lib64, /drv/lib64" in msg
    assert "install the NVIDIA driver" in msg and "--driver-root" in msg


def test_not_found_message_without_driver_root() -> None:
    msg = library_not_found_message(None, (), None)
    assert "LD_LIBRARY_PATH=(unset)" in msg
    assert "--driver-root " not in msg.split("Fix:")[0]


@pytest.mark.parametrize(
    ("code", "needles"),
    [
        (NvmlReturn.DRIVER_NOT_LOADED, ["NVML_ERROR_DRIVER_NOT_LOADED", "modprobe nvidia", "/dev/nvidiactl"]),
        (NvmlReturn.LIB_RM_VERSION_MISMATCH, ["NVML_ERROR_LIB_RM_VERSION_MISMATCH", "--driver-root", "reboot"]),
        (NvmlReturn.NO_PERMISSION, ["NVML_ERROR_NO_PERMISSION", "privileged"]),
        (NvmlReturn.UNKNOWN, ["nvmlInit", "NVML_ERROR_UNKNOWN"]),
    ],
)
def test_init_failure_messages_are_one_actionable_line(code: NvmlReturn, needles: list[str]) -> None:
    msg = init_failure_message(
        code, library="/drv/usr/lib64/libnvidia-ml.so.1", driver_root="/drv", searched=(), ld_library_path=None
    )
    assert "\n" not in msg
    assert "/drv/usr/lib64/libnvidia-ml.so.1" in msg
    for needle in needles:
        assert needle in msg


def test_init_failure_without_preloaded_library_says_loader_search() -> None:
    msg = init_failure_message(
        NvmlReturn.DRIVER_NOT_LOADED, library=None, driver_root=None, searched=(), ld_library_path=None
    )
    assert "libnvidia-ml.so.1 (from the dynamic loader search)" in msg


def test_init_failure_library_not_found_delegates() -> None:
    msg = init_failure_message(
        NvmlReturn.LIBRARY_NOT_FOUND, library=None, driver_root="/d", searched=("/d/lib64",), ld_library_path="/x"
    )
    assert msg == library_not_found_message("/d", ("/d/lib64",), "/x")


def test_load_failed_message_is_one_line() -> None:
    msg = library_load_failed_message("/d/lib64/libnvidia-ml.so.1", OSError("wrong ELF class:\nELFCLASS32"))
    assert "\n" not in msg
    assert "/d/lib64/libnvidia-ml.so.1" in msg and "wrong ELF class" in msg


def make_numa_topology(sysfs: Path, nodes: dict[int, tuple[str, int | None, str]]) -> None:
    """node id -> (cpulist, socket of its first CPU or None for a memory-only node, SLIT row)."""
    for node, (cpulist, socket, row) in nodes.items():
        d = sysfs / "devices" / "system" / "node" / f"node{node}"
        d.mkdir(parents=True)
        (d / "cpulist").write_text(cpulist + "\n")
        (d / "distance").write_text(row + "\n")
        first = cpulist.split(",")[0].split("-")[0]
        if socket is not None and first:
            topo = sysfs / "devices" / "system" / "cpu" / f"cpu{first}" / "topology"
            topo.mkdir(parents=True)
            (topo / "physical_package_id").write_text(f"{socket}\n")


def test_numa_neighbours_same_socket_at_minimum_distance(tmp_path: Path) -> None:
    # Two sockets with sub-NUMA clustering: nodes 0-2 on socket 0 (node 2 farther), 3 on socket 1, 4 memory only.
    make_numa_topology(tmp_path, {
        0: ("0-7", 0, "10 11 12 21 30"),
        1: ("8-15", 0, "11 10 12 21 30"),
        2: ("16-23", 0, "12 12 10 21 30"),
        3: ("24-31", 1, "21 21 21 10 30"),
        4: ("", None, "30 30 30 30 10"),
    })
    root = str(tmp_path)
    assert numa_neighbours_from_sysfs(root, 0) == (1,)
    assert numa_neighbours_from_sysfs(root, 2) == (0, 1)  # equal distance: both, ascending
    assert numa_neighbours_from_sysfs(root, 3) == ()  # alone on its socket
    assert numa_neighbours_from_sysfs(root, 4) == ()  # no CPUs, no socket
    assert numa_neighbours_from_sysfs(root, 9) == ()  # no such node
    assert numa_neighbours_from_sysfs(str(tmp_path / "missing"), 0) == ()


def test_numa_neighbours_with_a_malformed_distance_row_is_empty(tmp_path: Path) -> None:
    make_numa_topology(tmp_path, {0: ("0-3", 0, "10 11"), 1: ("4-7", 0, "11 10 99")})
    assert numa_neighbours_from_sysfs(str(tmp_path), 1) == ()
