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


def _read(path: str) -> str | None:
    try:
        with open(path, encoding="ascii") as f:
            return f.read().strip()
    except OSError:
        return None


def _first_cpu(cpulist: str) -> int | None:
    """The first CPU of a kernel cpulist ("0-15,32-47" -> 0); None when the node has no CPUs (memory only)."""
    head = cpulist.split(",", 1)[0].split("-", 1)[0].strip()
    return int(head) if head.isdigit() else None


def numa_neighbours_from_sysfs(sysfs_root: str, numa_node: int) -> tuple[int, ...]:
    """Same-socket NUMA nodes nearest to `numa_node` (not itself), from /sys/devices/system/node:
    `node<N>/distance` is the node's SLIT row over the online nodes in ascending id order, and a node's socket
    is `physical_package_id` of its first CPU. Nodes without CPUs (memory only) have no socket and are skipped.
    Empty when anything is unreadable: the list form then carries the physical node alone."""
    base = os.path.join(sysfs_root, "devices", "system", "node")
    try:
        names = os.listdir(base)
    except OSError:
        return ()
    nodes = sorted(int(n[4:]) for n in names if n.startswith("node") and n[4:].isdigit())
    row = _read(os.path.join(base, f"node{numa_node}", "distance"))
    if numa_node not in nodes or row is None:
        return ()
    try:
        distances = [int(v) for v in row.split()]
    except ValueError:
        return ()
    if len(distances) != len(nodes):
        return ()

    def socket(node: int) -> str | None:
        cpus = _read(os.path.join(base, f"node{node}", "cpulist"))
        cpu = _first_cpu(cpus) if cpus else None
        if cpu is None:
            return None
        return _read(os.path.join(sysfs_root, "devices", "system", "cpu", f"cpu{cpu}", "topology",
                                  "physical_package_id"))

    home = socket(numa_node)
    if home is None:
        return ()
    near = {n: d for n, d in zip(nodes, distances, strict=True) if n != numa_node and socket(n) == home}
    if not near:
        return ()
    best = min(near.values())
    return tuple(n for n in sorted(near) if near[n] == best)
