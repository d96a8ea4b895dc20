"""Verifying and repairing prepared claims: the checkpoint is a record, not proof.

A completed claim is verified by every effect kind against what exists (the CDI spec's exact bytes, a MIG
instance's full identity, a time-slice, an MPS daemon); whatever no longer matches is made again under the
claim's GPU locks, hardware first (each re-created instance recorded the moment it exists, as on a first
prepare), the CDI spec last, with the same CDI ids so the kubelet's copy stays valid.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace

import structlog

from dra_driver.inventory.catalog import AllocatableDevice
from dra_driver.kubeletplugin.effect import Made
from dra_driver.observability.logging import claim_fields
from dra_driver.plugin.actuator import PrepareError
from dra_driver.plugin.checkpoint import Checkpoint, ClaimRecord, ClaimState, PreparedDevice
from dra_driver.plugin.engineparts import EngineParts, claim_gpus

log = structlog.get_logger(__name__)


class ClaimRepair:
    def __init__(self, parts: EngineParts) -> None:
        self._parts = parts

    def damage(
        self, record: ClaimRecord, checkpoint: Checkpoint, catalog: Mapping[str, AllocatableDevice]
    ) -> list[str]:
        """What no longer matches the record of a completed claim, by every effect kind."""
        return self._parts.effects.damage(record, checkpoint, catalog)

    def repair_claim(self, uid: str) -> ClaimRecord | None:
        """Verify a completed claim under its GPU locks and make again whatever is missing. Returns the record
        as it is afterwards, or None when the claim is not (any more) completed. Raises PrepareError when the
        repair is impossible; the record is then left as it was."""
        parts = self._parts
        record = parts.checkpoint.load().claims.get(uid)
        if record is None or record.state is not ClaimState.PREPARE_COMPLETED:
            return None
        with parts.locks.hold(claim_gpus(record), parts.settings.lock_timeout):
            checkpoint = parts.checkpoint.load()  # again under the locks: what it holds now is what is repaired
            record = checkpoint.claims.get(uid)
            if record is None or record.state is not ClaimState.PREPARE_COMPLETED:
                return None
            if record.lost is not None:
                raise PrepareError(record.lost)  # lost in a driver reload (plugin/driverreload.py): not re-made
            catalog = parts.catalog()
            problems = self.damage(record, checkpoint, catalog)
            if not problems:
                return record
            log.warning(
                "a prepared claim no longer matches its record; repairing it",
                problems=problems,
                **claim_fields(record.namespace, record.name, record.uid),
            )
            return self._repair(record, checkpoint, catalog)

    def _repair(
        self, record: ClaimRecord, checkpoint: Checkpoint, catalog: Mapping[str, AllocatableDevice]
    ) -> ClaimRecord:
        gone = [d.device for d in record.devices if d.device not in catalog]
        if gone:
            raise PrepareError(
                f"the prepared claim cannot be repaired: device(s) {', '.join(gone)} are no longer offered by this "
                "node (GPU lost or re-configured?); delete the pod so that the claim is released and allocated again"
            )
        devices = self._parts.effects.repair(
            record, checkpoint, catalog, lambda name, made: self._created(record.uid, name, made)
        )
        changed = tuple(d for d, before in zip(devices, record.devices, strict=True) if d is not before)
        if not changed:
            return record
        repaired = replace(record, devices=devices, allocated=_swap(record.allocated, changed))
        self._parts.checkpoint.update(lambda cp: cp.with_claim(repaired))
        return repaired

    def _created(self, uid: str, device_name: str, made: Made[PreparedDevice]) -> None:
        """Name what an effect made again (a re-created MIG instance, a passthrough's functions) in the completed
        record the moment it exists."""

        def change(cp: Checkpoint) -> Checkpoint:
            record = cp.claims.get(uid)
            if record is None:
                return cp
            device = next(d for d in record.devices if d.device == device_name)
            changed = (made.record_on(device),)
            return cp.with_claim(
                replace(record, devices=_swap(record.devices, changed), allocated=_swap(record.allocated, changed))
            )

        self._parts.checkpoint.update(change)


def _swap(records: tuple[PreparedDevice, ...], changed: tuple[PreparedDevice, ...]) -> tuple[PreparedDevice, ...]:
    """`records` with each device that `changed` holds anew (by name) replaced by it."""
    by_name = {d.device: d for d in changed}
    return tuple(by_name.get(d.device, d) for d in records)
