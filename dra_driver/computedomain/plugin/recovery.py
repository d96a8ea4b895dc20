"""Recovery and cleanup of compute-domain claims (the GPU driver's is plugin/recovery.py).

    recover (start, with every claim operation of every plugin instance on the node held off): temp files swept,
      PrepareStarted rolled back and dropped (the kubelet prepares again), UnprepareStarted finished, aborted
      records released again (a crash may have cut the abort's undo short) and the expired ones dropped, completed
      ones verified and repaired; with ownership known, CDI specs, daemon dirs and a node label no record holds are
      removed (each effect kind's sweep). A lost checkpoint keeps everything: what it recorded is unknown.
    cleanup (periodic): expired aborted records dropped; claims whose ResourceClaim is gone are unprepared.
"""

from __future__ import annotations

import dataclasses
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Protocol

import structlog

from dra_driver.computedomain.plugin.checkpoint import ABORTED_TTL_S, Checkpoint, ClaimRecord, ClaimState
from dra_driver.computedomain.plugin.effects.base import DomainEffects
from dra_driver.kubeletplugin.checkpoint import CheckpointStore
from dra_driver.kubeletplugin.claimengine import release_stale
from dra_driver.kubeletplugin.claims import ClaimSource
from dra_driver.kubeletplugin.driver import ClaimRef, PrepareResult
from dra_driver.kubeletplugin.statedirs import OperationLock

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


class ClaimSteps(Protocol):
    """The engine's steps recovery drives (computedomain/plugin/engine.py)."""

    def undo(self, record: ClaimRecord, checkpoint: Checkpoint) -> None: ...

    def release(self, record: ClaimRecord, checkpoint: Checkpoint) -> None: ...

    def prepared_again(self, record: ClaimRecord, checkpoint: Checkpoint | None = None) -> PrepareResult: ...

    def unprepare(self, claims: list[ClaimRef]) -> dict[str, str]: ...


class DomainRecovery:
    def __init__(
        self,
        steps: ClaimSteps,
        *,
        store: CheckpointStore[Checkpoint],
        effects: DomainEffects,
        claims: ClaimSource,
        lock: OperationLock,
        state: threading.Lock,
        wall_clock: Callable[[], float] = time.time,
    ) -> None:
        self._steps = steps
        self._store = store
        self._effects = effects
        self._claims = claims
        self._lock = lock
        self._state = state  # the engine's node-state lock
        self._wall = wall_clock

    @contextmanager
    def _exclusive(self) -> Iterator[None]:
        with self._lock.exclusive(timeout=RECOVERY_TIMEOUT_S), self._state:
            yield

    def recover(self) -> DomainRecoveryReport:
        report = DomainRecoveryReport()
        with self._exclusive():
            self._store.sweep_temp_files()
            self._effects.sweep_temp_files()
            checkpoint = self._store.load()
            loss = self._store.take_loss()
            for uid, record in sorted(checkpoint.claims.items()):
                checkpoint = self._finish(uid, record, checkpoint, report)
            report.expired = self._expire_aborted()
            if loss is not None:
                # What the lost file recorded is unknown: nothing on the node is removed as unowned.
                report.ownership_known = False
                log.warning("checkpoint lost; keeping every CDI spec, daemon dir and node label", reason=loss)
            else:
                swept = self._effects.sweep(self._store.load(), None, None)
                report.swept = [item for removed in swept.values() for item in removed]
        return report

    def _finish(
        self, uid: str, record: ClaimRecord, checkpoint: Checkpoint, report: DomainRecoveryReport
    ) -> Checkpoint:
        """One record as a crash left it; the checkpoint afterwards."""
        steps = self._steps
        if record.state is ClaimState.PREPARE_STARTED:
            steps.undo(record, checkpoint)
            self._effects.spec.undo(record, record.devices, checkpoint, rollback=True)
            report.rolled_back.append(uid)
            return self._drop(uid)
        if record.state is ClaimState.UNPREPARE_STARTED:
            steps.release(record, checkpoint)
            report.finished.append(uid)
            return self._drop(uid)
        if record.state is ClaimState.PREPARE_ABORTED:
            steps.release(record, checkpoint)  # idempotent: a crash may have cut the abort's undo short
        elif record.state is ClaimState.PREPARE_COMPLETED and self._effects.damage(record, checkpoint, None):
            steps.prepared_again(record, checkpoint)
            report.repaired.append(uid)
        return checkpoint

    def _drop(self, uid: str) -> Checkpoint:
        return self._store.update(lambda c: c.without_claim(uid))

    def _expire_aborted(self) -> list[str]:
        now = self._wall()
        expired = [u for u, r in self._store.load().claims.items()
                   if r.state is ClaimState.PREPARE_ABORTED and now - r.aborted_at >= ABORTED_TTL_S]
        if expired:
            self._store.update(lambda c: dataclasses.replace(
                c, claims={u: r for u, r in c.claims.items() if u not in expired}))
        return expired

    def cleanup(self) -> list[str]:
        """Periodic: expired aborted records; claims prepared here whose ResourceClaim is gone (deleted, or
        re-created under another UID) are unprepared. Returns the UIDs unprepared."""
        with self._lock.shared(timeout=OPERATION_TIMEOUT_S), self._state:
            self._expire_aborted()
        completed = [r for _, r in sorted(self._store.load().claims.items()) if r.state is ClaimState.PREPARE_COMPLETED]
        return release_stale(completed, self._claims, lambda ref: self._steps.unprepare([ref])[ref.uid])
