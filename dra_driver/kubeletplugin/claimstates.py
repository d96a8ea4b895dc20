"""The one claim state machine of every driver on this layer: prepare and unprepare of a claim, idempotent and
crash-safe, its verify and repair, the rollback of a failed prepare, the end of a claim a crash interrupted, and the
locks that keep operations apart. A driver supplies its effects (effect.py) and a `ClaimRules`: the few choices
the drivers make differently (docs/architecture.md "One claim engine").

    prepare(claim)                       the node's operation lock shared, the rules' claim keys held
      read the checkpoint (the operation's one read on the common path)
      PrepareCompleted ──► every effect verifies it ──► the recorded answer
                             └─ damaged: repaired under the record's keys (repair_claim), then answered
      GET the ResourceClaim, the rules plan it (None: nothing of this driver to prepare)
      hold the plan's keys; under the node-state lock, where the rules have one:
        a record a crash or an unprepare left: PrepareCompleted meanwhile ─► its answer; PrepareAborted of this
          allocation ─► refused as stale; PrepareStarted of this allocation where the rules keep pending
          prepares ─► kept; anything else ─► undone
        PrepareStarted (durable, refusing inside the write what clashes with the store's current state), where an
          effect changes the node or a record was there;  prepare:after-checkpoint-started
        each device effect applies;  prepare:after-devices
      wait for readiness where the rules wait (node-state lock let go): still not ready ─► a retryable answer,
        PrepareStarted stays; under the lock again the record must still be this PrepareStarted
      the claim's CDI spec;  prepare:after-cdi
      PrepareCompleted (expecting the record this call decided on);  prepare:after-checkpoint-completed

    unprepare(claim): read the record ─► hold its keys (and the node-state lock) ─►
      PrepareStarted where the rules abort pending prepares: PrepareAborted, then undone; unprepare:after-abort
      PrepareCompleted holding nothing but its spec: the spec goes, then the record
      otherwise UnprepareStarted (unprepare:after-checkpoint-started), the device effects undone in reverse
      (unprepare:after-devices), the spec removed (unprepare:after-cdi), the record dropped
      (unprepare:after-checkpoint). A record that changed meanwhile is decided again (3 tries).

Crash points are named `<rules.fault_prefix><point>`; a point a driver does not name is never armed. Nothing here
knows a driver or a device kind: the effects and the rules do.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable
from contextlib import AbstractContextManager
from dataclasses import replace
from typing import TypeVar

import structlog
from structlog.contextvars import bind_contextvars, reset_contextvars

from dra_driver.errors import DraDriverError
from dra_driver.kubeletplugin.claimengine import RecordChanged, expect_record, made_recorder
from dra_driver.kubeletplugin.claimrecord import Checkpoint, ClaimRecord, ClaimState
from dra_driver.kubeletplugin.claimrules import ClaimRules, EngineLimits, Readiness
from dra_driver.kubeletplugin.claimsteps import ClaimSteps, Record
from dra_driver.kubeletplugin.driver import ClaimRef, PrepareResult
from dra_driver.kubeletplugin.effect import D, N, P, X
from dra_driver.observability.logging import claim_fields

log = structlog.get_logger(__name__)

UNPREPARE_ATTEMPTS = 3
R = TypeVar("R")

__all__ = ["ClaimEngine", "ClaimRules", "EngineLimits", "Readiness"]


class ClaimEngine(ClaimSteps[P, D, X, N]):
    """A `Driver` of the kubelet-plugin layer over one driver's effects and rules: the state machine of the module
    docstring, on the steps of claimsteps.py."""

    # --- the Driver protocol ------------------------------------------------------------------------------------

    def prepare(self, claims: list[ClaimRef]) -> dict[str, PrepareResult]:
        return dict(zip((c.uid for c in claims), self._each(self._prepare_one, claims), strict=True))

    def unprepare(self, claims: list[ClaimRef]) -> dict[str, str]:
        return dict(zip((c.uid for c in claims), self._each(self._unprepare_one, claims), strict=True))

    def _each(self, operation: Callable[[ClaimRef], R], claims: list[ClaimRef]) -> list[R]:
        """The claims of one call side by side in the claim pool; a single claim (the kubelet sends one call per
        pod, usually with one claim) runs in the calling thread: handing it to the pool and waiting for it cost
        two thread switches under the GIL and gained nothing."""
        if len(claims) == 1:
            return [operation(claims[0])]
        return list(self._pool.map(operation, claims))

    def _claim_turn(self, ref: ClaimRef) -> _ClaimTurn:
        """One claim's operation: the node's operation lock shared (recovery and a driver reload take it whole) and
        the claim's keys held, each within its timeout."""
        return _ClaimTurn(self.operations.shared(self.limits.operation_timeout), self._hold(self.rules.claim_keys(ref)))

    def _prepare_one(self, ref: ClaimRef) -> PrepareResult:
        started = time.monotonic()
        failure: Exception | None = None
        # The claim bound in the logging context: lines logged deeper down (MIG, CDI, IMEX code) carry it too. Bound
        # and reset by token: structlog's `bound_contextvars` copies the whole context to save what it overrides.
        tokens = bind_contextvars(**claim_fields(ref.namespace, ref.name, ref.uid))
        try:
            try:
                with self._claim_turn(ref):
                    result = self.prepare_claim(ref)
            except Exception as exc:
                failure = exc
                result = PrepareResult(error=self.rules.prepare_error(ref, exc))
            self.rules.prepared(ref, result, failure, time.monotonic() - started)
        finally:
            reset_contextvars(**tokens)
        return result

    def _unprepare_one(self, ref: ClaimRef) -> str:
        started = time.monotonic()
        failure: Exception | None = None
        error = ""
        tokens = bind_contextvars(**claim_fields(ref.namespace, ref.name, ref.uid))
        try:
            try:
                with self._claim_turn(ref):
                    released = self.unprepare_claim(ref)
                if released:
                    log.info("claim unprepared", seconds=round(time.monotonic() - started, 4))
            except Exception as exc:
                failure = exc
                error = self.rules.unprepare_error(ref, exc)
            self.rules.unprepared(ref, error, failure, time.monotonic() - started)
        finally:
            reset_contextvars(**tokens)
        return error

    # --- prepare ------------------------------------------------------------------------------------------------

    def prepare_claim(self, ref: ClaimRef) -> PrepareResult:
        """One claim's prepare; the caller holds the operation lock and the claim's keys. Raises on failure."""
        checkpoint = self.store.load()
        existing = checkpoint.claims.get(ref.uid)
        if existing is not None and existing.state is ClaimState.PREPARE_COMPLETED:
            # The checkpoint is a record, not proof: what it returns must still exist as recorded.
            answer = self._prepared_again(existing, checkpoint)
            if answer is not None:
                return answer
            # The record changed state meanwhile (a concurrent unprepare): prepare from scratch, reading it again.
        node = self.rules.node()
        plan = self.rules.plan(ref, self.claims.get_claim(ref.namespace, ref.name), node)
        if plan is None:
            return PrepareResult()
        with self._hold(self.rules.plan_keys(plan)):
            try:
                return self._prepare_planned(ref, plan, node, None if existing is not None else checkpoint)
            except RecordChanged as changed:
                return self._settled(ref, self.rules.pending(plan), changed.record)

    def _prepare_planned(self, ref: ClaimRef, plan: P, node: N, checkpoint: Checkpoint[D, X] | None) -> PrepareResult:
        """Under the plan's keys. `checkpoint`: as read before them, None where it must be read again."""
        pending = self.rules.pending(plan)
        with self._node_state:
            if checkpoint is None or self.node_lock is not None:
                checkpoint = self.store.load()  # a record to undo, or others' records changed while it waited
            checkpoint, decided = self._clear_leftover(ref, plan, pending, checkpoint, node)
            # PrepareStarted is what lets a crash be rolled back: durable before the node changes. A claim that
            # changes nothing but its CDI spec has nothing to roll back but the spec, which recovery removes as an
            # orphan: one fsynced write fewer (its checks then run inside the PrepareCompleted write).
            started = decided is not None or self.effects.changes_node(plan)

            def checked(cp: Checkpoint[D, X]) -> Checkpoint[D, X]:
                """`cp` when this claim may be prepared in it; raises otherwise (inside a write: the current state)."""
                expect_record(cp, ref.uid, decided)
                self.rules.refuse(plan, cp, node)
                return cp

            if started:
                checkpoint = self.store.update(lambda cp: checked(cp).with_claim(pending))
            self._reached("prepare:after-checkpoint-started")
            recorder = made_recorder(self.store, ref.uid, (self.rules.planned_in,))
            records = self._planned(pending)
            try:
                records = self.effects.apply_devices(plan, records, checkpoint, recorder)
                self._reached("prepare:after-devices")
            except BaseException:
                self._failed(ref, pending, records, checkpoint, started)
                raise
        problem = self._wait_ready(plan)
        if problem:
            # Retryable: PrepareStarted and what it made stay (a daemon keeps starting); the kubelet asks again
            # (an unprepare meanwhile aborts the claim where the rules say).
            return PrepareResult(error=problem)
        with self._node_state:
            if self.rules.readiness is not None:
                checkpoint = self._still_pending(ref, pending)
            try:
                self.effects.spec.apply(plan, records, checkpoint, recorder)
                self._reached("prepare:after-cdi")
            except BaseException:
                self._failed(ref, pending, records, checkpoint, started)
                raise
            return self._complete(ref, plan, pending, records, checked, started=started)

    def _clear_leftover(
        self, ref: ClaimRef, plan: P, pending: Record[D, X], checkpoint: Checkpoint[D, X], node: N
    ) -> tuple[Checkpoint[D, X], Record[D, X] | None]:
        """What a crash, an unprepare or another instance left of the claim, dealt with before preparing; the
        checkpoint and the record this prepare decided on (None: absent)."""
        current = checkpoint.claims.get(ref.uid)
        if current is None:
            return checkpoint, None
        if current.state is ClaimState.PREPARE_COMPLETED:
            raise RecordChanged(current)  # a concurrent call finished it while this one waited
        same = current.allocation == pending.allocation
        if current.state is ClaimState.PREPARE_ABORTED and same:
            raise self.rules.stale(ref)
        if current.state is ClaimState.PREPARE_STARTED and same and self.rules.keeps_pending:
            return checkpoint, current  # the node label stays while the daemon starts
        self.rules.refuse(plan, checkpoint, node)
        self._undo(current, checkpoint)  # as it is now; the PrepareStarted write replaces the record
        self.effects.spec.undo(current, current.devices, checkpoint, rollback=True)
        return checkpoint, current

    def _failed(
        self, ref: ClaimRef, pending: Record[D, X], records: tuple[D, ...], checkpoint: Checkpoint[D, X], started: bool
    ) -> None:
        """A prepare failed while applying: roll back its PrepareStarted record, or remove the spec it may have
        written (recovery removes an orphan spec otherwise)."""
        if started:
            self._roll_back(ref)
            return
        with contextlib.suppress(Exception):
            self.effects.spec.undo(pending, records, checkpoint, rollback=True)

    def _wait_ready(self, plan: P) -> str:
        readiness = self.rules.readiness
        if readiness is None:
            return ""
        deadline = readiness.monotonic() + readiness.wait_s
        while True:
            problem = self.effects.ready(plan)
            if not problem or readiness.monotonic() >= deadline:
                return problem
            readiness.sleep(readiness.poll_s)

    def _still_pending(self, ref: ClaimRef, pending: Record[D, X]) -> Checkpoint[D, X]:
        """After the readiness wait: the checkpoint, when the claim's record is still this PrepareStarted."""
        checkpoint = self.store.load()
        current = checkpoint.claims.get(ref.uid)
        if not _is_pending(current, pending):
            raise RecordChanged(current)  # another instance finished it, or an unprepare aborted it
        return checkpoint

    def _complete(
        self,
        ref: ClaimRef,
        plan: P,
        pending: Record[D, X],
        records: tuple[D, ...],
        checked: Callable[[Checkpoint[D, X]], Checkpoint[D, X]],
        *,
        started: bool,
    ) -> PrepareResult:
        done = self.rules.completed(plan, records)

        def completed(cp: Checkpoint[D, X]) -> Checkpoint[D, X]:
            if started and not _is_pending(cp.claims.get(ref.uid), pending):
                raise RecordChanged(cp.claims.get(ref.uid))
            return (cp if started else checked(cp)).with_claim(done)

        try:
            self._write(completed)
        except RecordChanged as changed:
            if not _completes(changed.record, pending):
                self.effects.spec.undo(pending, records, Checkpoint(), rollback=True)  # no spec may name it
            raise
        except DraDriverError:
            if not started:  # refused inside the write: only the spec was made
                with contextlib.suppress(Exception):
                    self.effects.spec.undo(pending, records, Checkpoint(), rollback=True)
            raise
        self._reached("prepare:after-checkpoint-completed")
        return self.rules.answer(done, plan)

    def _settled(self, ref: ClaimRef, pending: Record[D, X], record: Record[D, X] | None) -> PrepareResult:
        """The answer when a concurrent call, or another plugin instance on the node, changed the claim's record
        while this call worked on it."""
        if _completes(record, pending):
            assert record is not None
            return self.rules.answer(record, None)  # it prepared the same allocation: the same answer
        if (
            record is not None
            and record.state is ClaimState.PREPARE_ABORTED
            and (record.allocation == pending.allocation)
        ):
            raise self.rules.stale(ref)
        raise DraDriverError(
            f"ResourceClaim {ref.namespace}/{ref.name}: its record in the checkpoint changed while this prepare ran "
            f"(now {record.state.value if record else 'absent'}; another plugin instance on this node works on the "
            "claim); nothing was changed by this call, the kubelet retries"
        )

    # --- verify and repair --------------------------------------------------------------------------------------

    def _prepared_again(self, record: Record[D, X], checkpoint: Checkpoint[D, X]) -> PrepareResult | None:
        """The answer for a completed claim, repaired first where it no longer matches its record; None when it
        is not completed any more."""
        if record.lost is not None:
            raise DraDriverError(record.lost)  # lost for good (a driver reload): never re-made under the same name
        if not self.effects.damage(record, checkpoint, self.rules.node()):
            return self.rules.answer(record, None)
        repaired = self.repair_claim(record.uid)
        return None if repaired is None else self.rules.answer(repaired, None)

    # --- unprepare ----------------------------------------------------------------------------------------------

    def unprepare_claim(self, ref: ClaimRef) -> bool:
        """False when the claim is not prepared here (nothing to do, still a success)."""
        record = self.store.load().claims.get(ref.uid)
        if record is None or record.state is ClaimState.PREPARE_ABORTED:
            return False
        with self._hold(self.rules.record_keys(record)), self._node_state:
            for _ in range(UNPREPARE_ATTEMPTS):
                try:
                    return self._unprepare_record(ref.uid, record)
                except RecordChanged as changed:  # changed while this call waited: decided again as it is now
                    if changed.record is None or changed.record.state is ClaimState.PREPARE_ABORTED:
                        return False
                    record = changed.record
        raise DraDriverError(f"the claim's record kept changing under another plugin instance ({UNPREPARE_ATTEMPTS} "
                             "tries); the kubelet retries")  # fmt: skip

    def _unprepare_record(self, uid: str, record: Record[D, X]) -> bool:
        if record.state is ClaimState.PREPARE_STARTED and self.rules.aborts_pending:
            # NVIDIA #1162: the prepare may still be pending (waiting for readiness) or be retried late. The abort
            # is recorded first, so that from now on nothing can complete it (a crash in between is finished by
            # recovery, which undoes aborted records again); then what it did is undone.
            aborted = replace(record, state=ClaimState.PREPARE_ABORTED, aborted_at=self._wall())
            checkpoint = self._write(lambda cp: expect_record(cp, uid, record).with_claim(aborted))
            self._reached("unprepare:after-abort")
            self._release(aborted, checkpoint)
            log.info("pending prepare aborted by unprepare")
            return True
        if record.state is ClaimState.PREPARE_COMPLETED and not self.effects.holds(record):
            # Nothing on the node but its spec: no UnprepareStarted, no device undo. The spec goes first, then the
            # record (a crash in between leaves a completed record without its spec, which recovery writes again).
            self._reached("unprepare:after-devices")
            self.effects.spec.undo(record, record.devices, Checkpoint(), rollback=False)
            self._reached("unprepare:after-cdi")
            return self._forget(uid)
        if record.state is ClaimState.PREPARE_COMPLETED:
            # Recorded before anything is released: a crash from here on finishes the release at startup instead of
            # finding a "damaged" claim and repairing it back.
            started = replace(record, state=ClaimState.UNPREPARE_STARTED)
            checkpoint = self._write(lambda cp: expect_record(cp, uid, record).with_claim(started))
            self._reached("unprepare:after-checkpoint-started")
        else:
            checkpoint = self.store.load()  # a record a crash left half-done: undone as it is now
            expect_record(checkpoint, uid, record)
        self._release(checkpoint.claims[uid], checkpoint)
        return self._forget(uid)


def _is_pending(record: ClaimRecord[D, X] | None, pending: ClaimRecord[D, X]) -> bool:
    """Whether `record` is still a PrepareStarted record of the allocation `pending` plans."""
    return (
        record is not None and record.state is ClaimState.PREPARE_STARTED and (record.allocation == pending.allocation)
    )


def _completes(record: ClaimRecord[D, X] | None, pending: ClaimRecord[D, X]) -> bool:
    """Whether `record` is the allocation `pending` plans, completed."""
    return (
        record is not None
        and record.state is ClaimState.PREPARE_COMPLETED
        and (record.allocation == pending.allocation)
    )


class _ClaimTurn:
    """The operation lock shared, then the claim's keys; released in the other order (`ClaimEngine._claim_turn`).
    A plain object where a generator context manager cost ≈ 2 µs more per claim operation."""

    __slots__ = ("_keys", "_shared")

    def __init__(self, shared: AbstractContextManager[object], keys: AbstractContextManager[object]) -> None:
        self._shared, self._keys = shared, keys

    def __enter__(self) -> None:
        self._shared.__enter__()
        try:
            self._keys.__enter__()
        except BaseException:
            self._shared.__exit__(None, None, None)
            raise

    def __exit__(self, *exc: object) -> None:
        try:
            self._keys.__exit__(None, None, None)
        finally:
            self._shared.__exit__(None, None, None)
