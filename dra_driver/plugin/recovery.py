"""Startup recovery and the reconcile loop: what a crash, a lost checkpoint or a deleted claim left behind.

    recover (startup, before serving; the node's operation lock held exclusively):
      lost checkpoint? (corrupt, or missing while an effect finds leftovers of its kind) → rebuild ownership
        from the claims the API server allocated here and what each effect finds of them (adopt)
      finish interrupted claims: roll back PrepareStarted, release UnprepareStarted (the claim engine's
        finish_interrupted, kubeletplugin/claimstates.py)
      with ownership known: each effect sweeps what no record owns (reverse order: daemons before partitions)
      verify every completed claim and repair what no longer matches (the claim engine's repair_damaged)
      remove our own temp files of interrupted writes
    reconcile (while serving): the same once the checkpoint is found lost, or ownership could not be rebuilt.
    cleanup_stale: unprepare claims whose ResourceClaim is gone or was re-created.

Nothing here knows a device kind: it iterates over the effects (plugin/effects/registry.py).
"""

from __future__ import annotations

import threading
from collections.abc import Mapping
from dataclasses import replace

import structlog

from dra_driver.errors import DraDriverError
from dra_driver.inventory.catalog import AllocatableDevice
from dra_driver.k8s.client import ApiError
from dra_driver.kubeletplugin.claimengine import release_stale
from dra_driver.kubeletplugin.claimstates import ClaimEngine
from dra_driver.observability.logging import claim_fields
from dra_driver.plugin.checkpoint import Checkpoint, ClaimRecord, ClaimState, PreparedDevice
from dra_driver.plugin.claimplan import plan_claim
from dra_driver.plugin.effects.base import Catalog, ClaimPlan
from dra_driver.plugin.engineparts import EngineParts
from dra_driver.plugin.ownership import AllocatedClaim, RecoveryReport, claims_allocated_here
from dra_driver.resourceapi import InvalidObjectError

GpuEngine = ClaimEngine[ClaimPlan, PreparedDevice, None, Catalog]

log = structlog.get_logger(__name__)


class Recovery:
    def __init__(self, engine: GpuEngine, parts: EngineParts) -> None:
        self._engine = engine
        self._parts = parts
        # Set while ownership was lost and could not be rebuilt yet (API unreachable): retried by `reconcile`.
        self._pending_rebuild: str | None = None
        self._lock = threading.Lock()

    def recover(self) -> RecoveryReport:
        """At startup, before the plugin serves: rebuild ownership if the checkpoint was lost or corrupt, finish
        interrupted prepares (roll back) and unprepares (release), sweep what provably belongs to no claim,
        verify and repair every completed claim, and delete our own crash-leftover temp files. Holds the node's
        operation lock exclusively: no instance is in the middle of a claim."""
        parts = self._parts
        with parts.operations.exclusive(parts.settings.recovery_lock_timeout):
            missing = None
            if not parts.checkpoint.exists():
                catalog = parts.catalog()
                if parts.effects.leftovers(catalog):
                    # Something was prepared here without a record of it. A first start finds nothing and asks the
                    # API nothing (a cluster-wide LIST per node would be a real load during a fleet-wide install).
                    missing = (
                        "there is no checkpoint file, but CDI specs or MIG instances of this driver exist (deleted?)"
                    )
            parts.checkpoint.load()  # moves a corrupt file aside and records the loss
            reason = parts.checkpoint.take_loss() or missing
            temp = [*parts.checkpoint.sweep_temp_files(), *parts.effects.sweep_temp_files()]
            removed_temp = [str(p) for p in temp]
            for path in removed_temp:
                log.info("removed a temp file left by an interrupted write", path=path)
            report = self._reconcile(reason)
        return replace(report, removed_temp_files=tuple(removed_temp))

    def reconcile(self) -> RecoveryReport | None:
        """While serving: if the checkpoint was lost or corrupted since startup, or ownership could not be
        rebuilt then (API unreachable), rebuild it now, holding the node's operation lock exclusively (claims of
        every instance wait meanwhile). None when there was nothing to do."""
        parts = self._parts
        reason = parts.checkpoint.take_loss() or self._pending_rebuild
        if reason is None:
            return None
        self._pending_rebuild = reason  # kept until a rebuild gets through (busy node, NVML or API errors)
        with parts.operations.exclusive(parts.settings.recovery_lock_timeout):
            return self._reconcile(reason)

    def _reconcile(self, reason: str | None) -> RecoveryReport:
        with self._lock:
            allocated: dict[str, AllocatedClaim] | None = None
            adopted: list[str] = []
            if reason is not None:
                allocated, adopted = self._rebuild(reason)
            finished = self._finish_interrupted()
            known = reason is None or allocated is not None
            self._pending_rebuild = None if known else reason
            swept: dict[str, tuple[str, ...]] = {}
            if known:
                checkpoint, catalog = self._parts.checkpoint.load(), self._parts.catalog()
                swept = self._parts.effects.sweep(checkpoint, allocated, catalog)
            else:
                log.warning(
                    "ownership of the CDI specs and MIG instances on this node is unknown (the checkpoint was lost and "
                    "the API could not be read): keeping all of them, nothing is deleted or destroyed; retrying "
                    "every --cleanup-interval",
                    reason=reason,
                )
            repaired = self._engine.repair_damaged()
            return RecoveryReport(
                rebuild_reason=reason,
                ownership_known=known,
                adopted=tuple(adopted),
                finished=tuple(finished),
                repaired=tuple(repaired),
                swept=swept,
            )

    def _rebuild(self, reason: str) -> tuple[dict[str, AllocatedClaim] | None, list[str]]:
        """Recreate completed records for the claims the API server has allocated to this pool and for which
        some effect finds something here (a CDI spec, a MIG instance at exactly an allocated placement)."""
        parts = self._parts
        log.info("rebuilding claim ownership from what exists on this node", reason=reason)
        try:
            allocated = claims_allocated_here(
                parts.claims.list_claims(), parts.settings.driver_name, parts.settings.pool_name
            )
        except (ApiError, InvalidObjectError) as exc:
            # A claim the strict parser refuses: what it holds cannot be known, so ownership is unknown and
            # nothing may be deleted or destroyed (the next reconcile tries again).
            log.warning("listing ResourceClaims to rebuild ownership failed", error=str(exc))
            return None, []
        catalog = parts.catalog()
        known = parts.checkpoint.load().claims
        records = [
            record
            for uid, claim in sorted(allocated.items())
            if uid not in known and (record := self._adopt(claim, catalog)) is not None
        ]
        if records:
            parts.checkpoint.update(
                lambda cp: Checkpoint(cp.node_boot_id, {**{r.uid: r for r in records}, **cp.claims})
            )
        for record in records:
            log.warning(
                "adopted a prepared claim found on this node",
                devices=[d.device for d in record.devices],
                **claim_fields(record.namespace, record.name, record.uid),
            )
        return allocated, [r.uid for r in records]

    def _adopt(self, claim: AllocatedClaim, catalog: Mapping[str, AllocatableDevice]) -> ClaimRecord | None:
        ref = claim.ref
        try:
            plan = plan_claim(self._parts.settings, self._parts.effects, ref, claim.claim, catalog)
        except DraDriverError as exc:
            log.warning(
                "not adopting a claim allocated here; its CDI spec and MIG instances are kept",
                error=str(exc),
                **claim_fields(ref.namespace, ref.name, ref.uid),
            )
            return None
        plan, found = self._parts.effects.adopt(plan)
        if not found:
            return None  # nothing of it exists here: the kubelet's next prepare starts from scratch
        return ClaimRecord(
            ref.uid,
            ref.namespace,
            ref.name,
            ClaimState.PREPARE_COMPLETED,
            devices=plan.records,
            allocated=plan.records,
            pod_claim_name=plan.pod_claim_name,
        )

    def _finish_interrupted(self) -> list[str]:
        finished = self._engine.finish_interrupted()
        for record in finished:
            what = (
                "rolled back a half-prepared claim"
                if record.state is ClaimState.PREPARE_STARTED
                else "finished an interrupted unprepare"
            )
            log.info(what, **claim_fields(record.namespace, record.name, record.uid))
        return [record.uid for record in finished]

    def cleanup_stale(self) -> list[str]:
        """Unprepare claims whose ResourceClaim is gone or was re-created (another UID). API errors leave
        the claim alone until the next round."""
        engine = self._engine
        return release_stale(
            list(engine.store.load().claims.values()), engine.claims, lambda ref: engine.unprepare([ref])[ref.uid]
        )  # logged and counted as the kubelet's
