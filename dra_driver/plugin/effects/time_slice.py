"""Time-slice: the compute-policy time-slice of a whole GPU whose config says `TimeSlicing` (the hardware code and
the reference-count rule are plugin/sharing.py; docs/sharing.md).

Records: `timeSlice` of each such device, recorded in PrepareStarted before it is applied. A GPU goes back to
Default only when the last record naming a time-slice on it goes. Without a time slicer (`slicer` None) a
TimeSlicing config is refused as not enabled.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace

import structlog

from dra_driver.errors import DraDriverError
from dra_driver.plugin.actuator import PrepareError
from dra_driver.plugin.checkpoint import Checkpoint, ClaimRecord
from dra_driver.plugin.effects.base import Catalog, ClaimPlan, Created, GpuEffect, NodeTools, Records, replace_records
from dra_driver.plugin.ownership import AllocatedClaim
from dra_driver.plugin.sharing import TimeSlicer, time_slice_intervals, time_slicing_notes, wanted_time_slice

log = structlog.get_logger(__name__)


class TimeSlice(GpuEffect):
    kind = "time-slice"

    def __init__(self, tools: NodeTools) -> None:
        self.slicer: TimeSlicer | None = tools.time_slicer  # None: TimeSlicing configs are refused as not enabled

    def plan(self, claim: ClaimPlan) -> ClaimPlan:
        records = []
        for device, config, record in zip(claim.devices, claim.configs, claim.records, strict=True):
            interval = wanted_time_slice(device, config)
            if interval is None:
                records.append(record)
                continue
            if self.slicer is None:
                raise PrepareError(
                    f"sharing strategy TimeSlicing ({config.kind}) is not enabled on this node; "
                    "use strategy Exclusive or remove the sharing config"
                )
            records.append(replace(record, time_slice=interval))
        planned = replace_records(claim, records)
        notes = time_slicing_notes(claim.devices, claim.configs)
        return replace(planned, notes=planned.notes + notes) if notes else planned

    def refuse(self, claim: ClaimPlan, checkpoint: Checkpoint, catalog: Catalog) -> None:
        """A GPU runs one time-slice: a claim asking for another one than the GPU holds for other claims (possible
        once claims share a GPU) is refused, naming them."""
        ref = claim.ref
        for device in claim.records:
            if device.time_slice is None or device.gpu_uuid is None:
                continue
            others = time_slice_intervals(checkpoint.claims.values(), device.gpu_uuid, excluding=ref.uid)
            clash = sorted(f"{c} ({interval})" for c, interval in others.items() if interval != device.time_slice)
            if clash:
                raise PrepareError(
                    f"GPU {device.device} runs another time-slice for claim(s) {', '.join(clash)}; refusing "
                    f"time-slice {device.time_slice} for {ref.namespace}/{ref.name}"
                )

    def in_records(self, records: Records) -> bool:
        return any(r.time_slice is not None for r in records)

    def apply(self, claim: ClaimPlan, records: Records, checkpoint: Checkpoint, created: Created) -> Records:
        self._set(records)
        return records

    def _set(self, records: Records) -> None:
        for device in records:
            if device.time_slice is not None and device.gpu_uuid is not None:
                assert self.slicer is not None  # refused at plan time otherwise
                self.slicer.apply(device.gpu_uuid, device.device, device.time_slice)

    def undo(self, owner: ClaimRecord, records: Records, checkpoint: Checkpoint, *, rollback: bool) -> None:
        """Reset a GPU to the Default time-slice once no other record holds a time-slice on it."""
        if self.slicer is None:
            return
        gpus = sorted({d.gpu_uuid for d in records if d.time_slice is not None and d.gpu_uuid is not None})
        for gpu in gpus:
            if not time_slice_intervals(checkpoint.claims.values(), gpu, excluding=owner.uid):
                self.slicer.reset(gpu, set_by_us=True)

    def verify(self, owner: ClaimRecord, records: Records, checkpoint: Checkpoint, catalog: Catalog) -> list[str]:
        problems = []
        for device in records:
            if device.time_slice is None or device.gpu_uuid is None or self.slicer is None:
                continue
            now = self.slicer.current(device.gpu_uuid)
            if now is not None and now != device.time_slice:
                problems.append(f"GPU {device.device} runs time-slice {now}, recorded {device.time_slice}")
        return problems

    def repair(
        self, owner: ClaimRecord, records: Records, checkpoint: Checkpoint, catalog: Catalog, created: Created
    ) -> Records:
        if self.verify(owner, records, checkpoint, catalog):
            self._set(records)
        return records

    def sweep(
        self, checkpoint: Checkpoint, allocated: Mapping[str, AllocatedClaim] | None, catalog: Catalog
    ) -> tuple[str, ...]:
        """Whole GPUs at a non-default time-slice that no record holds (left behind by a lost checkpoint) go back
        to Default."""
        if self.slicer is None:
            return ()
        claims = checkpoint.claims.values()
        reset: list[str] = []
        for gpu in sorted({d.gpu.uuid for d in catalog.values() if d.kind.whole_gpu}):
            if time_slice_intervals(claims, gpu, excluding=""):
                continue
            try:
                if self.slicer.reset(gpu):
                    reset.append(gpu)
                    log.info("reset a time-slice no claim holds", gpu_uuid=gpu)
            except DraDriverError as exc:
                log.warning("resetting a time-slice no claim holds failed", gpu_uuid=gpu, error=str(exc))
        return tuple(reset)
