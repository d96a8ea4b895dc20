"""vGPU: a `vgpu` device (`gpu-<minor>-vgpu-<type>-<slot>`) is one vGPU of its type, made for a virtual machine on
an SR-IOV virtual function of the GPU at prepare and destroyed at unprepare (the hardware code is plugin/vgpu.py;
docs/vgpu.md). The claim's CDI spec then names the VF's `/dev/vfio/<group>` (or its IOMMUFD device), as for a GPU
passed through, and its device metadata names the VF's PCI address (KubeVirt's `<hostdev>`).

Records: `vgpu` (a VgpuRecord) of each such device: planned with the GPU's address, the type and the config's IOMMU
choices; the VF chosen is recorded in the PrepareStarted record (`created`, durable) before its type is written, so
rollback, unprepare and the recovery after a crash at any step destroy exactly what was made. A vGPU no record names
is never touched (`sweep` removes nothing: there is no proof this plugin made it). Without `--vgpu` (`tool` None) a
`vgpu` device is refused at plan time.

A vGPU changes what its GPU can create (one type per GPU; the GPU fills up): after a create or destroy the plugin
re-reads the hardware (`rediscover`) and republishes the GPU's offer.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace

from dra_driver.inventory.catalog import AllocatableDevice, DeviceKind
from dra_driver.kubeletplugin.claims import AllocatedClaim
from dra_driver.pci.model import pci_address
from dra_driver.plugin.actuator import PrepareError
from dra_driver.plugin.checkpoint import Checkpoint, PreparedDevice, VgpuRecord
from dra_driver.plugin.effects.base import Catalog, ClaimPlan, NodeTools, replace_records
from dra_driver.plugin.effects.vmdevices import Recorded, VmDeviceEffect, held_elsewhere, holder, refusing
from dra_driver.plugin.vgpu import VgpuMaker

VGPU_NOT_ENABLED = "device {name} is a vGPU device, but this plugin does not make vGPUs (--vgpu none)"


class Vgpu(VmDeviceEffect[VgpuMaker, VgpuRecord]):
    kind = "vgpu"
    device_kind = DeviceKind.VGPU
    held_as = "vgpu"
    beside = (DeviceKind.VFIO, DeviceKind.VGPU)
    mixed = "vGPU devices"
    not_enabled = VGPU_NOT_ENABLED

    def __init__(self, tools: NodeTools) -> None:
        super().__init__(tools.vgpu, tools.rediscover)

    def refuse(self, claim: ClaimPlan, checkpoint: Checkpoint, catalog: Catalog) -> None:
        """A GPU's vGPUs are all of one type and exclude any other use of it (containers, MIG, passthrough): the
        counters (and compatibility groups) keep the scheduler from both; this is the last line of defence, against
        a stale allocation or a scheduler without groups. Runs inside the checkpoint write, so two claims preparing
        at once see each other's records."""
        if self.neither_side_holds(claim, checkpoint):
            return
        held = [(o, h) for o, h in held_elsewhere(claim, checkpoint) if h.gpu_uuid is not None]
        if not held:
            return
        for device, record in zip(claim.devices, claim.records, strict=True):
            for other, theirs in held:
                if theirs.gpu_uuid != record.gpu_uuid or (record.vgpu is None and theirs.vgpu is None):
                    continue
                if record.vgpu is not None and theirs.vgpu is not None and theirs.vgpu.type_id == record.vgpu.type_id:
                    continue  # more vGPUs of the type the GPU hosts
                by, refused = holder(other, theirs), refusing(claim)
                if record.vgpu is not None and theirs.vgpu is not None:
                    raise PrepareError(
                        f"GPU of device {device.name} hosts vGPUs of type {theirs.vgpu.type_name} for {by}, and a "
                        f"GPU hosts one vGPU type at a time ({record.vgpu.type_name} asked); {refused}"
                    )
                what = "in other use (containers, MIG or passthrough)" if theirs.vgpu is None else "hosting vGPUs"
                raise PrepareError(f"GPU of device {device.name} is {what} by {by}; {refused}")

    def adopt(self, claim: ClaimPlan) -> tuple[ClaimPlan, bool]:
        """A lost checkpoint: a claim's vGPU is found only where it proves whose it is (a mediated device by the
        UUID of the claim and device); one on a VF is not adopted (the claim's next prepare makes another)."""
        if self.tool is None:
            return claim, False
        found = False
        records = []
        for device, record in zip(claim.devices, claim.records, strict=True):
            made = self.tool.adopt(device, claim.ref.uid) if device.kind is DeviceKind.VGPU else None
            found = found or made is not None
            records.append(record if made is None else replace(record, vgpu=made))
        return replace_records(claim, records), found

    def leftovers(self, catalog: Catalog) -> bool:
        """A VF with a vGPU type on a GPU offered as vGPUs: evidence that a missing checkpoint was lost."""
        if self.tool is None:
            return False
        gpus = {d.gpu.info.pci_bus_id for d in catalog.values() if d.kind is DeviceKind.VGPU}
        try:
            return bool(self.tool.typed_vfs(_addresses(gpus)))
        except PrepareError:
            return False

    def sweep(
        self, checkpoint: Checkpoint, allocated: Mapping[str, AllocatedClaim] | None, catalog: Catalog
    ) -> tuple[str, ...]:
        """Nothing: a vGPU no record names may be another tool's (the record is the only proof it is ours)."""
        return ()

    def _of(self, device: PreparedDevice) -> VgpuRecord | None:
        return device.vgpu

    def _make(
        self, tool: VgpuMaker, device: AllocatableDevice, vgpu: VgpuRecord, recorded: Recorded[VgpuRecord], owner: str
    ) -> VgpuRecord:
        return tool.create(device, vgpu, recorded, owner)

    def _remove(self, tool: VgpuMaker, device: PreparedDevice, vgpu: VgpuRecord) -> None:
        tool.destroy(vgpu)

    def _remake(self, tool: VgpuMaker, device: AllocatableDevice, vgpu: VgpuRecord) -> VgpuRecord:
        return tool.remake(vgpu)


def _addresses(bus_ids: set[str]) -> list[str]:
    return sorted(pci_address(b) for b in bus_ids)
