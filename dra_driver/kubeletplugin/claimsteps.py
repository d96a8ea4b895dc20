"""What the claim engine (claimstates.py), repair and recovery do to one claim record, whatever the driver: undo
its device effects in reverse order and remove its spec (release), drop it (forget), roll back a failed prepare,
verify and repair a completed claim under its keys, and take the records a crash interrupted to their end. The
state machine that decides when is `ClaimEngine` (claimstates.py), built on `ClaimSteps`.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import AbstractContextManager
from dataclasses import replace
from typing import Generic

import structlog

from dra_driver.errors import DraDriverError
from dra_driver.kubeletplugin.checkpoint import CheckpointStore
from dra_driver.kubeletplugin.claimengine import made_recorder
from dra_driver.kubeletplugin.claimrecord import Checkpoint, ClaimRecord, ClaimState
from dra_driver.kubeletplugin.claimrules import ClaimRules, EngineLimits
from dra_driver.kubeletplugin.claims import ClaimSource
from dra_driver.kubeletplugin.driver import ClaimRef
from dra_driver.kubeletplugin.effect import ClaimEffects, Created, D, N, P, X
from dra_driver.kubeletplugin.faults import FaultPoints
from dra_driver.kubeletplugin.statedirs import KeyedLocks, OperationLock
from dra_driver.observability.logging import claim_fields

log = structlog.get_logger(__name__)

Record = ClaimRecord[D, X]
_UNLOCKED = contextlib.nullcontext()  # stateless: shared by every engine without a node-state lock


class ClaimSteps(Generic[P, D, X, N]):
    """The claim engine's parts and the steps on one record (module docstring)."""

    def __init__(
        self,
        rules: ClaimRules[P, D, X, N],
        *,
        effects: ClaimEffects[P, D, X, N],
        store: CheckpointStore[Checkpoint[D, X]],
        claims: ClaimSource,
        operations: OperationLock,
        locks: KeyedLocks,
        limits: EngineLimits,
        faults: FaultPoints,
        node_lock: threading.Lock | None = None,
        wall_clock: Callable[[], float] = time.time,
    ) -> None:
        self.rules, self.effects, self.store, self.claims = rules, effects, store, claims
        self.operations, self.locks, self.limits, self.faults = operations, locks, limits, faults
        # Serialises the decisions on the node's shared claim state within this process where keys do not (the
        # ComputeDomain driver's node label and daemon dirs); None where the keys do (the GPU driver's GPUs).
        self.node_lock = node_lock
        self._node_state: AbstractContextManager[object] = node_lock if node_lock is not None else _UNLOCKED
        self._wall = wall_clock
        self._pool = ThreadPoolExecutor(max_workers=limits.max_parallel_claims, thread_name_prefix="claim")

    def close(self) -> None:
        self._pool.shutdown(wait=True)
        self.operations.close()

    def node_locked(self) -> AbstractContextManager[object]:
        """The node-state lock where the rules have one."""
        return self._node_state

    def _hold(self, keys: Sequence[str]) -> AbstractContextManager[object]:
        """The keys' locks; no call into the locks where there are none (the GPU driver's claim keys)."""
        return self.locks.hold(keys, self.limits.key_timeout) if keys else _UNLOCKED

    def _reached(self, point: str) -> None:
        self.faults.reached(self.rules.fault_prefix + point)

    def _write(self, change: Callable[[Checkpoint[D, X]], Checkpoint[D, X]]) -> Checkpoint[D, X]:
        checkpoint = self.store.update(change)
        self.checkpoint_written(checkpoint)
        return checkpoint

    def checkpoint_written(self, checkpoint: Checkpoint[D, X]) -> None:
        """Told each checkpoint a prepare's completion or an unprepare wrote (a driver's gauges read it)."""

    def _planned(self, record: ClaimRecord[D, X]) -> tuple[D, ...]:
        return record.allocated if self.rules.planned_in == "allocated" else record.devices

    def _roll_back(self, ref: ClaimRef) -> None:
        checkpoint = self.store.load()  # a failed prepare: what its PrepareStarted record holds now
        record = checkpoint.claims.get(ref.uid)
        if record is None or record.state is not ClaimState.PREPARE_STARTED:
            return
        try:
            self._undo(record, checkpoint)
            self.effects.spec.undo(record, self._planned(record), checkpoint, rollback=True)
        except Exception:
            # Keep the PrepareStarted record: the next call or startup recovery tries again.
            log.exception("rollback after a failed prepare failed", **claim_fields(ref.namespace, ref.name, ref.uid))
            return
        self.store.update(lambda cp: cp.without_claim(ref.uid))

    def damage(self, record: Record[D, X], checkpoint: Checkpoint[D, X], node: N) -> list[str]:
        """What no longer matches the record of a completed claim, by every effect kind."""
        return self.effects.damage(record, checkpoint, node)

    def repair_claim(self, uid: str) -> Record[D, X] | None:
        """Verify a completed claim under its keys and make again whatever is missing, hardware first (each thing
        made recorded the moment it exists), the CDI spec last with the same CDI ids. The record afterwards, or
        None when the claim is not (any more) completed. Raises when the repair is impossible (record unchanged)."""
        record = self.store.load().claims.get(uid)
        if record is None or record.state is not ClaimState.PREPARE_COMPLETED:
            return None
        with self._hold(self.rules.record_keys(record)), self._node_state:
            checkpoint = self.store.load()  # again under the locks: what it holds now is what is repaired
            record = checkpoint.claims.get(uid)
            if record is None or record.state is not ClaimState.PREPARE_COMPLETED:
                return None
            if record.lost is not None:
                raise DraDriverError(record.lost)
            node = self.rules.node()
            problems = self.effects.damage(record, checkpoint, node)
            if not problems:
                return record
            log.warning("a prepared claim no longer matches its record; repairing it", problems=problems,
                        **claim_fields(record.namespace, record.name, record.uid))  # fmt: skip
            unrepairable = self.rules.unrepairable(record, node)
            if unrepairable:
                raise DraDriverError(unrepairable)
            created: Created[D] = made_recorder(self.store, uid, ("devices", "allocated"))
            devices = self.effects.repair(record, checkpoint, node, created)
            changed = tuple(d for d, before in zip(devices, record.devices, strict=True) if d is not before)
            if not changed:
                return record
            repaired = replace(record, devices=devices, allocated=_swap(record.allocated, changed))
            self.store.update(lambda cp: cp.with_claim(repaired))
            return repaired

    def repair_damaged(self) -> list[str]:
        """Every completed claim (not lost) verified, and repaired where damaged; the UIDs repaired. A claim that
        cannot be repaired is logged and left: its next prepare says why."""
        repaired = []
        checkpoint = self.store.load()
        node = self.rules.node()
        for record in list(checkpoint.claims.values()):
            if record.state is not ClaimState.PREPARE_COMPLETED or record.lost is not None:
                continue
            if not self.effects.damage(record, checkpoint, node):
                continue
            try:
                self.repair_claim(record.uid)
            except DraDriverError as exc:
                log.warning("a prepared claim could not be repaired; its next prepare call reports why",
                            error=str(exc), **claim_fields(record.namespace, record.name, record.uid))  # fmt: skip
                continue
            repaired.append(record.uid)
        return repaired

    def _release(self, record: Record[D, X], checkpoint: Checkpoint[D, X]) -> None:
        """Undo what the record names and remove its CDI spec (the record itself stays)."""
        self._undo(record, checkpoint)
        self._reached("unprepare:after-devices")
        rollback = record.state is ClaimState.PREPARE_STARTED
        self.effects.spec.undo(record, self._planned(record) if rollback else record.devices, checkpoint,
                               rollback=rollback)  # fmt: skip
        self._reached("unprepare:after-cdi")

    def _forget(self, uid: str) -> bool:
        self._write(lambda cp: cp.without_claim(uid))
        self._reached("unprepare:after-checkpoint")
        return True

    def _undo(self, record: Record[D, X], checkpoint: Checkpoint[D, X]) -> None:
        """The device effects of a record, in reverse order (a daemon stops before what it stands on goes)."""
        rollback = record.state is ClaimState.PREPARE_STARTED
        devices = self._planned(record) if rollback else record.devices
        self.effects.undo_devices(record, devices, checkpoint, rollback=rollback, after=self.rules.undone)

    def finish_interrupted(self) -> list[Record[D, X]]:
        """At recovery (no claim operation of any instance running): each record a crash left unfinished taken to
        its end: PrepareStarted rolled back and UnprepareStarted released, both dropped (the kubelet prepares
        again); PrepareAborted released again and kept (a crash may have cut the abort's undo short). The records
        finished, as they were; one that fails is logged and left for the next call."""
        finished = []
        for record in list(self.store.load().claims.values()):
            if record.state is ClaimState.PREPARE_COMPLETED:
                continue
            try:
                checkpoint = self.store.load()
                current = checkpoint.claims.get(record.uid)
                if current is None:
                    continue
                self._release(current, checkpoint)
                if current.state is not ClaimState.PREPARE_ABORTED:
                    self._forget(current.uid)
            except DraDriverError as exc:
                log.warning("finishing an interrupted claim failed; retried on the next call", state=str(record.state),
                            error=str(exc), **claim_fields(record.namespace, record.name, record.uid))  # fmt: skip
                continue
            finished.append(record)
        return finished


def _swap(records: tuple[D, ...], changed: tuple[D, ...]) -> tuple[D, ...]:
    """`records` with each device that `changed` holds anew (by name) replaced by it."""
    by_name = {d.device: d for d in changed}
    return tuple(by_name.get(d.device, d) for d in records)
