"""The claim's CDI spec (cdi.py's `SpecFiles`): its CDI ids planned with the claim, the file written once the claim
is ready (its devices' edits, each from the kind that serves it), verified byte for byte, rewritten when it is not
what it should be, removed on unprepare, and swept when no completed claim owns it. The spec kind of the
ComputeDomain driver's effects (the GPU driver's is plugin/effects/cdi_spec.py): it comes after every device kind.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from pathlib import Path

from dra_driver.cdi.model import ContainerEdits
from dra_driver.computedomain.plugin.cdi import SpecFiles
from dra_driver.computedomain.plugin.checkpoint import Checkpoint, ClaimRecord, ClaimState, DomainDevice
from dra_driver.computedomain.plugin.effects.base import Devices, DomainEffect, DomainPlan
from dra_driver.kubeletplugin.claims import AllocatedClaim
from dra_driver.kubeletplugin.effect import Created


class DomainCdiSpec(DomainEffect):
    kind = "cdi-spec"

    def __init__(self, specs: SpecFiles, devices: tuple[DomainEffect, ...]) -> None:
        self.specs = specs
        self._devices = devices  # the device kinds, whose edits the spec joins

    def plan(self, claim: DomainPlan) -> DomainPlan:
        uid = claim.ref.uid
        devices = tuple(dataclasses.replace(d, cdi_device_ids=(self.specs.cdi_id(uid, d.device),))
                        for d in claim.record.devices)
        return dataclasses.replace(claim, record=dataclasses.replace(claim.record, devices=devices))

    def apply(
        self, claim: DomainPlan, records: Devices, checkpoint: Checkpoint, created: Created[DomainDevice]
    ) -> Devices:
        self.specs.write(claim.ref.uid, self.edits_of(dataclasses.replace(claim.record, devices=records)))
        return records

    def undo(self, record: ClaimRecord, devices: Devices, checkpoint: Checkpoint, *, rollback: bool) -> None:
        self.specs.remove(record.uid)

    def verify(self, record: ClaimRecord, devices: Devices, checkpoint: Checkpoint, node: None) -> list[str]:
        problem = self.specs.problem(record.uid, self.edits_of(record))
        return [] if problem is None else [problem]

    def repair(
        self, record: ClaimRecord, devices: Devices, checkpoint: Checkpoint, node: None,
        created: Created[DomainDevice],
    ) -> Devices:
        if self.verify(record, devices, checkpoint, node):
            self.specs.write(record.uid, self.edits_of(record))
        return devices

    def sweep_temp_files(self) -> list[Path]:
        return self.specs.sweep_temp_files()

    def sweep(
        self, checkpoint: Checkpoint, allocated: Mapping[str, AllocatedClaim] | None, node: None
    ) -> tuple[str, ...]:
        """Specs no completed claim owns (a PrepareStarted claim has none yet; an aborted one has none any more)."""
        completed = {u for u, r in checkpoint.claims.items() if r.state is ClaimState.PREPARE_COMPLETED}
        removed = []
        for uid in sorted(self.specs.claim_uids_on_disk() - completed):
            self.specs.remove(uid)
            removed.append(str(self.specs.spec_path(uid)))
        return tuple(removed)

    def edits_of(self, record: ClaimRecord) -> dict[str, ContainerEdits]:
        """Device name -> its CDI edits, in the claim's device order: each from the kinds that serve the device."""
        out: dict[str, ContainerEdits] = {}
        for device in record.devices:
            edits = ContainerEdits()
            for effect in self._devices:
                if device.kind is effect.device_kind:
                    edits = edits.append(effect.edits(record, device))
            out[device.device] = edits
        return out
