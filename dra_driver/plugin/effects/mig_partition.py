"""MIG partition: a `mig-dynamic` device is carved at prepare time at exactly its allocated placement and
destroyed at unprepare; a whole GPU of the dynamic layout has MIG turned off for it (the hardware code, identity
rules included, is plugin/mig.py; docs/mig.md).

Records: `mig` (a MigRecord) of each dynamic MIG device, planned with profile and placement, completed with the
GPU-instance id the moment the instance exists (`created`, durable) and with the compute instance and MIG UUID
once the device is whole. Without dynamic MIG (`actuator` None) a dynamic MIG device is refused at plan time.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import replace
from functools import partial

import structlog

from dra_driver.inventory.catalog import AllocatableDevice, DeviceKind, supports_mig_toggle
from dra_driver.kubeletplugin.claims import AllocatedClaim
from dra_driver.nvml.types import Placement
from dra_driver.plugin.actuator import PrepareError
from dra_driver.plugin.checkpoint import Checkpoint, ClaimRecord, MigRecord
from dra_driver.plugin.effects.base import Catalog, ClaimPlan, Created, GpuEffect, NodeTools, Records, replace_records
from dra_driver.plugin.mig import MigActuator

log = structlog.get_logger(__name__)


def planned_mig(device: AllocatableDevice) -> MigRecord | None:
    """What a dynamic MIG device will be (its live ids come later): enough to find and roll it back."""
    if device.kind is not DeviceKind.MIG_DYNAMIC or device.profile is None or device.placement is None:
        return None
    return MigRecord(device.gpu.uuid, device.profile.id, device.placement.start, device.placement.size)


class MigPartition(GpuEffect):
    kind = "mig-partition"

    def __init__(self, tools: NodeTools) -> None:
        self.actuator: MigActuator | None = tools.mig  # None: dynamic MIG is not enabled on this node

    def plan(self, claim: ClaimPlan) -> ClaimPlan:
        records = []
        for device, record in zip(claim.devices, claim.records, strict=True):
            if device.kind is not DeviceKind.MIG_DYNAMIC:
                records.append(record)
                continue
            if self.actuator is None:
                raise PrepareError(f"device {device.name} is a dynamic MIG device, but dynamic MIG is not enabled")
            records.append(replace(record, mig=planned_mig(device)))
        return replace_records(claim, records)

    def changes_node(self, claim: ClaimPlan) -> bool:
        return any(
            record.mig is not None or (device.kind.whole_gpu and device.partitioned)
            for device, record in zip(claim.devices, claim.records, strict=True)
        )

    def in_records(self, records: Records) -> bool:
        return any(r.mig is not None for r in records)

    def apply(self, claim: ClaimPlan, records: Records, checkpoint: Checkpoint, created: Created) -> Records:
        if self.actuator is None:
            return records
        out = []
        for device, record in zip(claim.devices, records, strict=True):
            if device.kind.whole_gpu and device.partitioned:
                self.actuator.ensure_mig_off(device)
            if record.mig is not None:
                record = replace(record, mig=self.actuator.create(device, partial(created, record.device)))
            out.append(record)
        return tuple(out)

    def undo(self, owner: ClaimRecord, records: Records, checkpoint: Checkpoint, *, rollback: bool) -> None:
        if self.actuator is None:
            return
        for record in records:
            if rollback:
                self.actuator.rollback(record)
            else:
                self.actuator.release(record)

    def verify(self, owner: ClaimRecord, records: Records, checkpoint: Checkpoint, catalog: Catalog) -> list[str]:
        if self.actuator is None:
            return []
        return [p for p in (self.actuator.verify(r) for r in records) if p is not None]

    def repair(
        self, owner: ClaimRecord, records: Records, checkpoint: Checkpoint, catalog: Catalog, created: Created
    ) -> Records:
        if self.actuator is None:
            return records
        out = []
        for record in records:
            problem = self.actuator.verify(record)
            if problem is not None and record.mig is not None:
                self.actuator.release(record)  # whatever is left of it, by its recorded identity only
                record = replace(
                    record, mig=self.actuator.create(catalog[record.device], partial(created, record.device))
                )
                log.info("re-created a prepared device", device=record.device, problem=problem)
            out.append(record)
        return tuple(out)

    def adopt(self, claim: ClaimPlan) -> tuple[ClaimPlan, bool]:
        if self.actuator is None:
            return claim, False
        found = False
        records = []
        for device, record in zip(claim.devices, claim.records, strict=True):
            mig = self.actuator.adopt(device)
            found = found or mig is not None
            records.append(record if mig is None else replace(record, mig=mig))
        return replace_records(claim, records), found

    def leftovers(self, catalog: Catalog) -> bool:
        return self.actuator is not None and self.actuator.count_instances(_managed(catalog)) > 0

    def sweep(
        self, checkpoint: Checkpoint, allocated: Mapping[str, AllocatedClaim] | None, catalog: Catalog
    ) -> tuple[str, ...]:
        managed = _managed(catalog)
        if self.actuator is None or not managed:
            return ()
        records = checkpoint.claims.values()
        owned = [d.mig for r in records for d in (*r.devices, *r.allocated) if d.mig is not None]
        # After a rebuild, a placement allocated here may hold that claim's instance in a shape we could not adopt.
        reserved = reserved_placements(allocated.values(), catalog) if allocated is not None else set()
        return tuple(self.actuator.destroy_unowned(managed, owned, reserved))


def _managed(catalog: Catalog) -> dict[str, bool]:
    """GPUs whose MIG layout this driver owns (dynamic MIG) -> whether MIG may be toggled on them."""
    return {d.gpu.uuid: supports_mig_toggle(d.gpu) for d in catalog.values() if d.kind is DeviceKind.MIG_DYNAMIC}


def reserved_placements(
    allocated: Iterable[AllocatedClaim], catalog: Mapping[str, AllocatableDevice]
) -> set[tuple[str, Placement]]:
    """(GPU UUID, placement) of every dynamic MIG device allocated on this node: a MIG instance overlapping one
    may be that claim's, so the unowned sweep keeps it."""
    reserved = set()
    for claim in allocated:
        for name in claim.devices:
            device = catalog.get(name)
            if device is not None and device.kind is DeviceKind.MIG_DYNAMIC and device.placement is not None:
                reserved.add((device.gpu.uuid, device.placement))
    return reserved
