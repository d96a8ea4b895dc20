"""VFIO passthrough: a `vfio` device (`gpu-<minor>-vfio`) is its GPU handed to a virtual machine. Prepare moves
the GPU's IOMMU group from its drivers to vfio-pci, unprepare moves it back (the hardware code is plugin/vfio.py;
docs/passthrough.md). The claim's CDI spec then names `/dev/vfio/<group>` (or the IOMMUFD device) instead of the
GPU's nvidia nodes (plugin/cdi.py).

Records: `vfio` (a VfioRecord) of each such device: planned with the GPU's PCI address, IOMMU group and the
config's IOMMU choices; the functions to move with their drivers and the persistence mode are recorded in the
PrepareStarted record (`created`, durable) before the first function leaves its driver, so rollback, unprepare and
the recovery after a crash at any step rebind each function to exactly the driver it had. Without PCI access
(`tool` None) a `vfio` device is refused at plan time.

A GPU bound to vfio-pci is gone from NVML's device list; after it is rebound the plugin re-reads the hardware
(`rediscover`), so the GPU is offered for container use again.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from dra_driver.inventory.catalog import AllocatableDevice, DeviceKind
from dra_driver.pci.model import pci_address
from dra_driver.plugin.actuator import PrepareError
from dra_driver.plugin.checkpoint import Checkpoint, PreparedDevice, VfioRecord
from dra_driver.plugin.effects.base import Catalog, ClaimPlan, NodeTools
from dra_driver.plugin.effects.vmdevices import Recorded, VmDeviceEffect, held_elsewhere, holder, refusing
from dra_driver.plugin.vfio import VfioBinder

PASSTHROUGH_NOT_ENABLED = (
    "device {name} is a VFIO passthrough device, but this plugin has no PCI access (sysfs) to bind GPUs to vfio-pci"
)


class VfioPassthrough(VmDeviceEffect[VfioBinder, VfioRecord]):
    kind = "vfio-passthrough"
    device_kind = DeviceKind.VFIO
    held_as = "vfio"
    beside = (DeviceKind.VFIO,)
    mixed = "passthrough devices"
    not_enabled = PASSTHROUGH_NOT_ENABLED

    def __init__(self, tools: NodeTools) -> None:
        super().__init__(tools.vfio, tools.rediscover)

    def refuse(self, claim: ClaimPlan, checkpoint: Checkpoint, catalog: Catalog) -> None:
        """A GPU is either passed through or used by containers, never both; and a passthrough takes the GPU's whole
        IOMMU group, so no other claim may hold another GPU of that group, nor pass a GPU of it through (the
        counters keep the scheduler from both, slices/counters.py; this is the last line of defence, against a
        stale allocation). Runs inside the checkpoint write, so a container claim and a VM claim on one group
        that prepare at once see each other's records: whichever writes second is refused."""
        passing = any(r.vfio is not None for r in claim.records)
        if self.neither_side_holds(claim, checkpoint):
            return
        held_by_others = held_elsewhere(claim, checkpoint)
        if not passing and not any(h.vfio is not None for _, h in held_by_others):
            return  # no passthrough on either side: nothing of this kind to clash
        groups: dict[int, frozenset[str]] = {}

        def members(group: int) -> frozenset[str]:
            if group not in groups:
                groups[group] = self.tool.group_members(group) if self.tool is not None else frozenset()
            return groups[group]

        mine = [(d, _footprint(r, catalog, members)) for d, r in zip(claim.devices, claim.records, strict=True)]
        for other, held in held_by_others:
            theirs = _footprint(held, catalog, members)
            for device, own in mine:
                if own.vfio is None and theirs.vfio is None:
                    continue  # two container uses: the engine's overlap check judges those
                if own.gpu_uuid != theirs.gpu_uuid and not own.addresses & theirs.addresses:
                    continue
                by, refused = holder(other, held), refusing(claim)
                if own.gpu_uuid == theirs.gpu_uuid:
                    what = "passed through to a VM" if theirs.vfio is not None else "in use for containers"
                    raise PrepareError(f"GPU of device {device.name} is {what} by {by}; {refused}")
                if theirs.vfio is not None:
                    raise PrepareError(
                        f"GPU of device {device.name} ({', '.join(sorted(own.addresses))}) is in IOMMU group "
                        f"{theirs.vfio}, which {by} passed through to a VM: the whole group is bound to vfio-pci; "
                        f"{refused}"
                    )
                raise PrepareError(
                    f"passing {device.name} through takes its whole IOMMU group {own.vfio} to vfio-pci, and GPU "
                    f"{', '.join(sorted(theirs.addresses & own.addresses))} of that group is in use for containers "
                    f"by {by}; {refused}"
                )

    def _of(self, device: PreparedDevice) -> VfioRecord | None:
        return device.vfio

    def _make(
        self, tool: VfioBinder, device: AllocatableDevice, vfio: VfioRecord, recorded: Recorded[VfioRecord], owner: str
    ) -> VfioRecord:
        return tool.bind(device, vfio, recorded)

    def _remove(self, tool: VfioBinder, device: PreparedDevice, vfio: VfioRecord) -> None:
        tool.restore(device.gpu_uuid, vfio)

    def _remake(self, tool: VfioBinder, device: AllocatableDevice, vfio: VfioRecord) -> VfioRecord:
        return tool.rebind(device, vfio)


@dataclass(frozen=True)
class _Footprint:
    """What a device record takes on the PCI bus: its GPU (by UUID) and the functions (by address); `vfio` the IOMMU
    group a passthrough takes whole (None: a container use, which takes its GPU only)."""

    gpu_uuid: str | None
    addresses: frozenset[str]
    vfio: int | None = None


def _footprint(record: PreparedDevice, catalog: Catalog, members: Callable[[int], frozenset[str]]) -> _Footprint:
    if record.vfio is not None:
        vfio = record.vfio
        moved = {vfio.address, *(f.address for f in vfio.functions)}
        return _Footprint(record.gpu_uuid, frozenset(moved | members(vfio.group)), vfio.group)
    device = catalog.get(record.device) or next(
        (d for d in catalog.values() if record.gpu_uuid is not None and d.gpu.uuid == record.gpu_uuid), None
    )
    if device is None:
        return _Footprint(record.gpu_uuid, frozenset())  # a GPU this plugin no longer lists: known by UUID only
    return _Footprint(record.gpu_uuid, frozenset({pci_address(device.gpu.info.pci_bus_id)}))
