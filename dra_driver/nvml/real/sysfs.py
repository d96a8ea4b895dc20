"""Host locality read from sysfs (the PCI device directory of a GPU).

`sysfs_root` is always passed in ("/sys" in production) so tests run against a fake tree.
"""

from __future__ import annotations

import os

from dra_driver.nvml.real.convert import pcie_root_from_path


def pci_device_dir(sysfs_root: str, bus_id: str) -> str:
    """<sysfs_root>/bus/pci/devices/<normalised bus id> (a symlink into /sys/devices/pci…)."""
    return os.path.join(sysfs_root, "bus", "pci", "devices", bus_id)


def numa_node_from_sysfs(sysfs_root: str, bus_id: str) -> int | None:
    """The kernel's NUMA node for the PCI device; None when the file is missing or says -1 (unknown)."""
    path = os.path.join(pci_device_dir(sysfs_root, bus_id), "numa_node")
    try:
        with open(path, encoding="ascii") as f:
            text = f.read().strip()
    except OSError:
        return None
    try:
        node = int(text)
    except ValueError:
        return None
    return node if node >= 0 else None


def pcie_root_from_sysfs(sysfs_root: str, bus_id: str) -> str | None:
    """The PCIe root complex ("pci0000:00") the device hangs off, from the resolved device path."""
    link = pci_device_dir(sysfs_root, bus_id)
    if not os.path.exists(link):
        return None
    return pcie_root_from_path(os.path.realpath(link))
