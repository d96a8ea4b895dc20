"""`VgpuSysfs`: the NVIDIA per-VF vGPU interface of an SR-IOV GPU (Ampere and later; docs/vgpu.md), and
`HostVgpuSysfs`, the real one over a sysfs root.

Paths (root `/sys` on a node; tests point it at a tree of plain files):
    bus/pci/devices/<pf>/virtfn<N> -> ../<vf>                 the GPU's virtual functions (SR-IOV enabled)
    bus/pci/devices/<vf>/nvidia/creatable_vgpu_types          "<id> : <name>" per line: what this VF can become now
    bus/pci/devices/<vf>/nvidia/current_vgpu_type             the VF's vGPU type id; 0: no vGPU
    bus/pci/devices/<vf>/{iommu_group -> …/<g>, vfio-dev/vfio<N>}
A vGPU is created by writing a type id to `current_vgpu_type` and destroyed by writing 0 (one `write(2)` each,
`pci/sysfs.py` `write_attribute`); the driver refuses with an errno (a VF that has a type: EBUSY; a type it cannot
create: EINVAL), which reaches the caller as PciError.errno.
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
_CREATABLE_LINE = re.compile(r"\s*(\d+)\s*:")


@dataclass(frozen=True)
class VirtualFunction:
    """One SR-IOV virtual function of a GPU as it is now."""

    address: str
    iommu_group: int | None
    current_type: int  # NO_VGPU_TYPE: no vGPU
    creatable: tuple[int, ...]  # type ids it can become now (empty while it has a type)
    vfio_dev: str | None = None  # "vfio7": the VF's IOMMUFD cdev, where the kernel has one


@runtime_checkable
class VgpuSysfs(Protocol):
    def virtual_functions(self, pf_address: str) -> tuple[VirtualFunction, ...]:
        """The GPU's VFs in VF order; empty when SR-IOV is off or the GPU has none."""

    def set_vgpu_type(self, vf_address: str, type_id: int) -> None:
        """Write `type_id` (NO_VGPU_TYPE: destroy) to the VF's current_vgpu_type; raises PciError (errno)."""


def parse_creatable(text: str) -> tuple[int, ...]:
    """`creatable_vgpu_types`: "<id> : <name>" per line (a header line without an id is skipped)."""
    return tuple(int(m.group(1)) for line in text.splitlines() if (m := _CREATABLE_LINE.match(line)))


class HostVgpuSysfs:
    def __init__(self, sys_root: Path = DEFAULT_SYSFS) -> None:
        self._devices = sys_root / "bus" / "pci" / "devices"

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
        return VirtualFunction(
            address=address,
            iommu_group=group,
            current_type=int(current) if current.isdigit() else NO_VGPU_TYPE,
            creatable=parse_creatable(_read(vf / "nvidia" / "creatable_vgpu_types") or ""),
            vfio_dev=vfio[0] if vfio else None,
        )

    def set_vgpu_type(self, vf_address: str, type_id: int) -> None:
        path = self._devices / vf_address / "nvidia" / "current_vgpu_type"
        action = "destroying the vGPU on" if type_id == NO_VGPU_TYPE else "creating a vGPU on"
        write_attribute(path, str(type_id), action)


def _read(path: Path) -> str | None:
    try:
        return path.read_text().strip()
    except OSError:
        return None
