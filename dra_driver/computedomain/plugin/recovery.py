"""Recovery and cleanup of compute-domain claims (the GPU driver's is plugin/recovery.py; both finish interrupted
claims and repair damaged ones through the claim engine, kubeletplugin/claimstates.py).

    recover (start, with every claim operation of every plugin instance on the node held off): temp files swept,
      PrepareStarted rolled back and dropped (the kubelet prepares again), UnprepareStarted finished, aborted
      records released again (a crash may have cut the abort's undo short) and the expired ones dropped, completed
      ones verified and repaired; with ownership known, CDI specs, daemon dirs and a node label no record holds are
      removed (each effect kind's sweep). A lost checkpoint keeps everything: what it recorded is unknown.
    cleanup (periodic): expired aborted records dropped; claims whose ResourceClaim is gone are unprepared.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import structlog

from dra_driver.computedomain.plugin.checkpoint import ABORTED_TTL_S, ClaimState, DomainClaim, DomainDevice
from dra_driver.computedomain.plugin.effects.base import DomainPlan
from dra_driver.kubeletplugin.claimengine import release_stale
from dra_driver.kubeletplugin.claimstates import ClaimEngine

DomainEngine = ClaimEngine[DomainPlan, DomainDevice, DomainClaim, None]

log = structlog.get_logger(__name__)

OPERATION_TIMEOUT_S = 10.0  # waiting for the node's claim state held by recovery (of this or another instance)
RECOVERY_TIMEOUT_S = 120.0


@dataclass
class DomainRecoveryReport:
    """What recovery did, by claim UID (and the paths and labels the sweeps removed)."""

    rolled_back: list[str] = field(default_factory=list)
    finished: list[str] = field(default_factory=list)
    expired: list[str] = field(default_factory=list)
    repaired: list[str] = field(default_factory=list)
    swept: list[str] = field(default_factory=list)
    ownership_known: bool = True


class DomainRecovery:
    def __init__(self, engine: DomainEngine, *, wall_clock: Callable[[], float] = time.time) -> None:
        self._engine = engine
        self._wall = wall_clock

    def recover(self) -> DomainRecoveryReport:
        engine, store = self._engine, self._engine.store
        report = DomainRecoveryReport()
        with engine.operations.exclusive(timeout=RECOVERY_TIMEOUT_S):
            store.sweep_temp_files()
            engine.effects.sweep_temp_files()
            store.load()  # moves a corrupt file aside and records the loss
            loss = store.take_loss()
            for record in engine.finish_interrupted():
                if record.state is ClaimState.PREPARE_STARTED:
                    report.rolled_back.append(record.uid)
                elif record.state is ClaimState.UNPREPARE_STARTED:
                    report.finished.append(record.uid)
            report.repaired = engine.repair_damaged()
            report.expired = self._expire_aborted()
            if loss is not None:
                # What the lost file recorded is unknown: nothing on the node is removed as unowned.
                report.ownership_known = False
                log.warning("checkpoint lost; keeping every CDI spec, daemon dir and node label", reason=loss)
            else:
                swept = engine.effects.sweep(store.load(), None, None)
                report.swept = [item for removed in swept.values() for item in removed]
        return report

    def _expire_aborted(self) -> list[str]:
        store = self._engine.store
        now = self._wall()
        expired = [u for u, r in store.load().claims.items()
                   if r.state is ClaimState.PREPARE_ABORTED and now - r.aborted_at >= ABORTED_TTL_S]
        if expired:
            store.update(lambda c: dataclasses.replace(
                c, claims={u: r for u, r in c.claims.items() if u not in expired}))
        return expired

    def cleanup(self) -> list[str]:
        """Periodic: expired aborted records; claims prepared here whose ResourceClaim is gone (deleted, or
        re-created under another UID) are unprepared. Returns the UIDs unprepared."""
        engine = self._engine
        with engine.operations.shared(timeout=OPERATION_TIMEOUT_S), engine.node_locked():
            self._expire_aborted()
        completed = [r for _, r in sorted(engine.store.load().claims.items())
                     if r.state is ClaimState.PREPARE_COMPLETED]
        return release_stale(completed, engine.claims, lambda ref: engine.unprepare([ref])[ref.uid])
