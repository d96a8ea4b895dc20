"""`VgpuSysfs`: where vGPUs are made, the NVIDIA per-VF vGPU interface of an SR-IOV GPU (Ampere and later) or the
kernel's mediated devices (older GPUs and vGPU releases; docs/vgpu.md), and `HostVgpuSysfs`, the real one over a
sysfs root.

Paths (root `/sys` on a node; tests point it at a tree of plain files):
    bus/pci/devices/<pf>/virtfn<N> -> ../<vf>                 the GPU's virtual functions (SR-IOV enabled)
    bus/pci/devices/<vf>/nvidia/creatable_vgpu_types          "<id> : <name>" per line: what this VF can become now
    bus/pci/devices/<vf>/nvidia/current_vgpu_type             the VF's vGPU type id; 0: no vGPU
    bus/pci/devices/<vf>/{iommu_group -> …/<g>, vfio-dev/vfio<N>}
A vGPU is created by writing a type id to `current_vgpu_type` and destroyed by writing 0 (one `write(2)` each,
`pci/sysfs.py` `write_attribute`); the driver refuses with an errno (a VF that has a type: EBUSY; a type it cannot
create: EINVAL), which reaches the caller as PciError.errno.

Mediated devices (Documentation/ABI/testing/sysfs-bus-vfio-mdev):
    class/mdev_bus/<gpu>/mdev_supported_types/nvidia-<type id>/{name, available_instances, create}
    bus/mdev/devices/<uuid> -> …/<gpu>/<uuid>, with {mdev_type -> …/nvidia-<type id>, iommu_group -> …/<g>, remove}
A vGPU is created by writing its UUID to the type's `create` and removed by writing 1 to its `remove`.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol, runtime_checkable

from dra_driver.pci.model import PciError
from dra_driver.pci.sysfs import DEFAULT_SYSFS, write_attribute

NO_VGPU_TYPE = 0
_VIRTFN = re.compile(r"virtfn(\d+)")
_CREATABLE_LINE = re.compile(r"\s*([0-9]{1,9})\s*:")  # ASCII digits, a sane width: ids are small numbers
_NUMBER = re.compile(r"[0-9]{1,9}")
# A sysfs attribute shows at most a page; anything much larger is not the kernel's file (read as untrusted input).
MAX_ATTRIBUTE_BYTES = 16384


@dataclass(frozen=True)
class VirtualFunction:
    """One SR-IOV virtual function of a GPU as it is now."""

    address: str
    iommu_group: int | None
    current_type: int  # NO_VGPU_TYPE: no vGPU
    creatable: tuple[int, ...]  # type ids it can become now (empty while it has a type)
    vfio_dev: str | None = None  # "vfio7": the VF's IOMMUFD cdev, where the kernel has one


@dataclass(frozen=True)
class MdevType:
    """One mediated-device type of a GPU: its directory (`nvidia-<type id>`), its name and how many more fit now."""

    type_dir: str
    name: str
    available: int


@dataclass(frozen=True)
class Mdev:
    """A live mediated device: its parent GPU, its type directory and IOMMU group."""

    uuid: str
    parent: str
    type_dir: str
    iommu_group: int | None


def mdev_type_dir(type_id: int) -> str:
    """NVIDIA's mdev type directory of a vGPU type id."""
    return f"nvidia-{type_id}"


@runtime_checkable
class VgpuSysfs(Protocol):
    def virtual_functions(self, pf_address: str) -> tuple[VirtualFunction, ...]:
        """The GPU's VFs in VF order; empty when SR-IOV is off or the GPU has none."""

    def set_vgpu_type(self, vf_address: str, type_id: int) -> None:
        """Write `type_id` (NO_VGPU_TYPE: destroy) to the VF's current_vgpu_type; raises PciError (errno)."""

    def mdev_types(self, gpu_address: str) -> tuple[MdevType, ...]:
        """The GPU's mediated-device types; empty when it is no mdev parent."""

    def mdev(self, uuid: str) -> Mdev | None:
        """The live mediated device of that UUID, None when there is none."""

    def create_mdev(self, gpu_address: str, type_dir: str, uuid: str) -> None:
        """Write `uuid` to the type's `create`; raises PciError (errno)."""

    def remove_mdev(self, uuid: str) -> None:
        """Write 1 to the device's `remove`; raises PciError (errno)."""


def parse_creatable(text: str) -> tuple[int, ...]:
    """`creatable_vgpu_types`: "<id> : <name>" per line (a header line without an id is skipped)."""
    return tuple(int(m.group(1)) for line in text.splitlines() if (m := _CREATABLE_LINE.match(line)))


class HostVgpuSysfs:
    def __init__(self, sys_root: Path = DEFAULT_SYSFS) -> None:
        self._devices = sys_root / "bus" / "pci" / "devices"
        self._mdev_bus = sys_root / "class" / "mdev_bus"
        self._mdevs = sys_root / "bus" / "mdev" / "devices"

    def virtual_functions(self, pf_address: str) -> tuple[VirtualFunction, ...]:
        pf = self._devices / pf_address
        try:
            links = [(int(m.group(1)), p) for p in pf.iterdir() if (m := _VIRTFN.fullmatch(p.name))]
            addresses = [os.path.basename(os.readlink(link)) for _, link in sorted(links)]
        except OSError:
            return ()  # no such GPU, or SR-IOV off: no VFs
        return tuple(self._vf(address) for address in addresses)

    def _vf(self, address: str) -> VirtualFunction:
        vf = self._devices / address
        current = _read(vf / "nvidia" / "current_vgpu_type")
        if current is None:
            raise PciError(
                f"virtual function {address} has no nvidia/current_vgpu_type: the NVIDIA vGPU Manager (R550 or newer, "
                "with SR-IOV enabled by sriov-manage) does not drive it", errno=None,
            )
        try:
            group: int | None = int(os.path.basename(os.readlink(vf / "iommu_group")))
        except (OSError, ValueError):
            group = None
        try:
            vfio = sorted(p.name for p in (vf / "vfio-dev").iterdir() if p.name.startswith("vfio"))
        except OSError:
            vfio = []
        if not _NUMBER.fullmatch(current):
            # Not a type id: whether a vGPU lives there is unknown, so the VF is neither free nor ours to destroy.
            raise PciError(
                f"virtual function {address}: nvidia/current_vgpu_type holds {current[:40]!r}, not a vGPU type id "
                "(0 for none); check the NVIDIA vGPU Manager (nvidia-smi vgpu) and the kernel log", errno=None,
            )
        return VirtualFunction(
            address=address,
            iommu_group=group,
            current_type=int(current),
            creatable=parse_creatable(_read(vf / "nvidia" / "creatable_vgpu_types") or ""),
            vfio_dev=vfio[0] if vfio else None,
        )

    def set_vgpu_type(self, vf_address: str, type_id: int) -> None:
        path = self._devices / vf_address / "nvidia" / "current_vgpu_type"
        action = "destroying the vGPU on" if type_id == NO_VGPU_TYPE else "creating a vGPU on"
        write_attribute(path, str(type_id), action)


    def mdev_types(self, gpu_address: str) -> tuple[MdevType, ...]:
        root = self._mdev_bus / gpu_address / "mdev_supported_types"
        try:
            dirs = sorted(p for p in root.iterdir() if p.is_dir())
        except OSError:
            return ()
        out = []
        for d in dirs:
            available = _read(d / "available_instances") or ""
            # Garbage in available_instances reads as none available: nothing is created on a guess.
            count = int(available) if _NUMBER.fullmatch(available) else 0
            out.append(MdevType(d.name, _read(d / "name") or d.name, count))
        return tuple(out)

    def mdev(self, uuid: str) -> Mdev | None:
        link = self._mdevs / uuid
        try:
            parent = os.path.basename(os.path.dirname(os.path.realpath(link)))
            type_dir = os.path.basename(os.readlink(link / "mdev_type"))
        except OSError:
            return None
        try:
            group: int | None = int(os.path.basename(os.readlink(link / "iommu_group")))
        except (OSError, ValueError):
            group = None
        return Mdev(uuid, parent, type_dir, group)

    def create_mdev(self, gpu_address: str, type_dir: str, uuid: str) -> None:
        path = self._mdev_bus / gpu_address / "mdev_supported_types" / type_dir / "create"
        write_attribute(path, uuid, "creating a mediated device with")

    def remove_mdev(self, uuid: str) -> None:
        write_attribute(self._mdevs / uuid / "remove", "1", "removing the mediated device with")


def _read(path: Path) -> str | None:
    """The attribute's text; None when it cannot be read (absent, a symlink loop, not a file). Raises PciError for a
    file larger than MAX_ATTRIBUTE_BYTES (not read whole) or one that is not text."""
    try:
        with path.open("rb") as f:
            data = f.read(MAX_ATTRIBUTE_BYTES + 1)
    except OSError:
        return None
    if len(data) > MAX_ATTRIBUTE_BYTES:
        raise PciError(f"{path} is larger than {MAX_ATTRIBUTE_BYTES} bytes: not a sysfs attribute", errno=None)
    try:
        return data.decode("ascii").strip()
    except UnicodeDecodeError:
        raise PciError(f"{path} is not ASCII text: not a sysfs attribute", errno=None) from None
