"""Shared IOMMU groups: counters that keep the scheduler from giving a VM a GPU whose IOMMU group another claim uses.

A passthrough moves the GPU's whole IOMMU group to vfio-pci (plugin/vfio.py): where two GPUs share a group (a PCIe
switch without ACS), passing one through takes the other from the host too. The GPU's own counter set
(slices/counters.py) cannot see that, so each such group gets one more counter set, `iommu-group-<g>-counter-set`,
with the single counter `devices` = the number of container devices of the group's GPUs:

- every container device of a GPU in the group (whole GPU, MIG partition, shared device) consumes 1;
- every VFIO device of a GPU in the group consumes all of it.

So an allocated container device of any GPU in the group leaves no VFIO device of the group allocatable, an
allocated VFIO device leaves no device of the group's GPUs allocatable, and two VFIO devices of one group exclude
each other (one VM owns a group: /dev/vfio/<group> opens once). Container devices never run short among themselves:
there is one unit per device, and a multi-allocatable device is charged once (KEP-4815 with KEP-5075).

A group counts when at least two GPUs of the catalog are in it and one of them has a VFIO device; a GPU alone in its
group, and groups without passthrough, publish nothing more. The groups are node facts the plugin reads from sysfs at
start (PassthroughSettings.iommu_groups, by PCI bus id). Counter-set and counter names are DNS labels.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from dra_driver.inventory.catalog import AllocatableDevice, DeviceKind
from dra_driver.k8s.quantity import Quantity

GROUP_COUNTER = "devices"


@dataclass(frozen=True)
class SharedGroup:
    """An IOMMU group that holds several GPUs of the catalog, one of them offered for passthrough."""

    group: int
    gpus: tuple[str, ...]  # UUIDs, in GPU index order
    devices: int  # the container devices of those GPUs: the counter's value

    @property
    def counter_set_name(self) -> str:
        return f"iommu-group-{self.group}-counter-set"


def shared_groups(devices: Iterable[AllocatableDevice], iommu_groups: Mapping[str, int]) -> dict[str, SharedGroup]:
    """The shared group of each GPU in one, by GPU UUID (`iommu_groups`: IOMMU group by PCI bus id)."""
    by_group: dict[int, list[AllocatableDevice]] = defaultdict(list)
    for device in devices:
        group = iommu_groups.get(device.gpu.info.pci_bus_id)
        if group is not None:
            by_group[group].append(device)
    out: dict[str, SharedGroup] = {}
    for group, members in sorted(by_group.items()):
        gpus = {d.gpu.info.index: d.gpu.uuid for d in members}
        if len(gpus) < 2 or not any(d.kind is DeviceKind.VFIO for d in members):
            continue
        containers = sum(1 for d in members if d.kind is not DeviceKind.VFIO)
        shared = SharedGroup(group, tuple(uuid for _, uuid in sorted(gpus.items())), max(1, containers))
        out.update(dict.fromkeys(shared.gpus, shared))
    return out


def group_counter_set(group: SharedGroup) -> dict[str, Any]:
    return {"name": group.counter_set_name, "counters": {GROUP_COUNTER: {"value": _quantity(group.devices)}}}


def group_consumption(device: AllocatableDevice, group: SharedGroup) -> dict[str, Any]:
    """The device's draw from its GPU's shared group: all of it for a VFIO device, one unit for any other."""
    used = group.devices if device.kind is DeviceKind.VFIO else 1
    return {"counterSet": group.counter_set_name, "counters": {GROUP_COUNTER: {"value": _quantity(used)}}}


def _quantity(value: int) -> str:
    return str(Quantity.from_int(value))
