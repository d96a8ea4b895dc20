"""The MPS daemon lifecycle that two effect kinds share: the `claim-<uid>` daemon of a claim whose devices' config
says `sharing.strategy: MPS` (mps_daemon.py) and the `gpu-<uuid>` daemon of a GPU's shares (capacity_share.py).
The daemon lifecycle and the limit rules are plugin/mps.py; docs/sharing.md.

Records: `mps` of each such device (daemon id and limits), recorded in PrepareStarted before the daemon starts.
The records naming a daemon are its reference count: the last one to go stops it, resets the compute mode and
removes its directory; a daemon's limits are derived from its holders' records. Without MPS (`daemons` None)
such configs are refused as not enabled. Not a kind itself: the kinds are its subclasses, which import it and
not each other (the `effect-kinds-independent` import contract).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import replace

import structlog

from dra_driver.errors import DraDriverError
from dra_driver.kubeletplugin.driver import ClaimRef
from dra_driver.plugin.actuator import PrepareError
from dra_driver.plugin.checkpoint import Checkpoint, ClaimRecord, MpsRecord, PreparedDevice
from dra_driver.plugin.effects import base
from dra_driver.plugin.mps import (
    DaemonHolding,
    MpsDaemons,
    claim_daemon_records,
    daemon_holdings,
    daemon_spec,
    refuse_mixed,
    whole_gpus,
)
from dra_driver.plugin.ownership import AllocatedClaim

log = structlog.get_logger(__name__)

NOT_ENABLED = (
    "MPS (sharing strategy MPS, or a share of a GPU) is not enabled on this node; use strategy Exclusive or remove "
    "the sharing config"
)


class MpsLifecycle(base.GpuEffect):
    """A claim's daemon by default (the mps-daemon kind); a subclass picks its records and their limits."""

    kind = "mps-daemon"
    shares = False  # which records are this effect's: a claim's daemon (False) or a GPU's shares (True)
    daemon_prefix = "claim-"

    def __init__(self, tools: base.NodeTools) -> None:
        self.daemons: MpsDaemons | None = tools.mps  # None: MPS is not enabled on this node

    def mine(self, record: PreparedDevice) -> bool:
        return record.mps is not None and record.mps.share is self.shares

    def plan(self, claim: base.ClaimPlan) -> base.ClaimPlan:
        return self._planned(claim, self._records(claim, [_known_uuid(claim, i) for i in range(len(claim.devices))]))

    def _records(self, claim: base.ClaimPlan, uuids: Sequence[str | None]) -> tuple[MpsRecord | None, ...]:
        return claim_daemon_records(claim.devices, claim.configs, uuids, claim.ref.uid)

    def _planned(self, claim: base.ClaimPlan, mps: Sequence[MpsRecord | None]) -> base.ClaimPlan:
        if self.daemons is None and any(m is not None for m in mps):
            raise PrepareError(NOT_ENABLED)
        records = tuple(r if m is None else replace(r, mps=m) for r, m in zip(claim.records, mps, strict=True))
        refuse_mixed(claim.devices, [r.mps for r in records])
        return base.replace_records(claim, records)

    def in_records(self, records: base.Records) -> bool:
        return any(self.mine(r) for r in records)

    def apply(
        self, claim: base.ClaimPlan, records: base.Records, checkpoint: Checkpoint, created: base.Created
    ) -> base.Records:
        if not self.in_records(records):
            return records
        if any(self.mine(r) and r.mps is not None and r.mps.uuid is None for r in records):
            # A dynamic MIG device exists only now: its UUID is known, so limits keyed by UUID resolve and the
            # daemon serves exactly these UUIDs (the one case where the MPS records are computed a second time).
            uuids = [
                r.mig.uuid if r.mig is not None and r.mig.uuid else _known_uuid(claim, i) for i, r in enumerate(records)
            ]
            mps = self._records(claim, uuids)
            records = tuple(r if m is None else replace(r, mps=m) for r, m in zip(records, mps, strict=True))
        self._ensure(claim.ref, records, checkpoint)
        return records

    def _ensure(self, ref: ClaimRef, records: base.Records, checkpoint: Checkpoint) -> None:
        """Start each daemon the records name, or re-limit a running one to its holders (every other record that
        names it, and this claim's devices)."""
        assert self.daemons is not None  # refused at plan time otherwise
        for daemon in self._daemons(records):
            held = daemon_holdings(checkpoint.claims.values(), daemon, excluding=ref.uid) + _held(
                f"{ref.namespace}/{ref.name}", records, daemon
            )
            self.daemons.ensure(daemon_spec(self.daemons.root, daemon, held), whole_gpus(held))

    def _daemons(self, records: base.Records) -> list[str]:
        return sorted({r.mps.daemon for r in records if r.mps is not None and self.mine(r)})

    def undo(self, owner: ClaimRecord, records: base.Records, checkpoint: Checkpoint, *, rollback: bool) -> None:
        """Stop each daemon no other record holds, or re-limit it to the holders left."""
        if self.daemons is None:
            return
        for daemon in self._daemons(records):
            left = daemon_holdings(checkpoint.claims.values(), daemon, excluding=owner.uid)
            if left:
                self.daemons.ensure(daemon_spec(self.daemons.root, daemon, left), whole_gpus(left))
                continue
            mine = whole_gpus(_held("", records, daemon))
            self.daemons.release(daemon, sorted({*mine, *self.daemons.recorded_gpus(daemon)}))

    def verify(
        self, owner: ClaimRecord, records: base.Records, checkpoint: Checkpoint, catalog: base.Catalog
    ) -> list[str]:
        if self.daemons is None:
            return []
        problems = []
        for daemon in self._daemons(records):
            held = daemon_holdings(checkpoint.claims.values(), daemon, excluding=owner.uid) + _held("", records, daemon)
            problems += self.daemons.problems(daemon_spec(self.daemons.root, daemon, held), whole_gpus(held))
        return problems

    def repair(
        self, owner: ClaimRecord, records: base.Records, checkpoint: Checkpoint, catalog: base.Catalog,
        created: base.Created,
    ) -> base.Records:
        if self.verify(owner, records, checkpoint, catalog):
            self._ensure(ClaimRef(owner.namespace, owner.name, owner.uid), records, checkpoint)
        return records

    def sweep(
        self, checkpoint: Checkpoint, allocated: Mapping[str, AllocatedClaim] | None, catalog: base.Catalog
    ) -> tuple[str, ...]:
        """Daemons of this kind whose directory no record names (a lost checkpoint, or a crash between the last
        record going and the directory going) are stopped and their GPUs reset."""
        if self.daemons is None:
            return ()
        claims = list(checkpoint.claims.values())
        swept: list[str] = []
        for daemon in self.daemons.on_disk():
            if not daemon.startswith(self.daemon_prefix) or daemon_holdings(claims, daemon):
                continue
            try:
                self.daemons.release(daemon, self.daemons.recorded_gpus(daemon))
            except DraDriverError as exc:
                log.warning("stopping an MPS daemon no claim holds failed", daemon=daemon, error=str(exc))
                continue
            swept.append(daemon)
            log.info("stopped an MPS daemon no claim holds", daemon=daemon)
        return tuple(swept)


def _held(claim: str, records: base.Records, daemon: str) -> list[DaemonHolding]:
    return [DaemonHolding(claim, d) for d in records if d.mps is not None and d.mps.daemon == daemon]


def _known_uuid(claim: base.ClaimPlan, index: int) -> str | None:
    return base.known_uuid(claim.devices[index])
