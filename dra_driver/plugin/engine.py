"""The prepare path: a per-claim state machine that is idempotent and crash-safe.

    prepare(claim):
      read the checkpoint (the operation's one read)
      it says Completed ──► every effect verifies what it recorded ──► return its CDI ids
                              └─ damaged: repair it under the GPU locks (repair.py), then return
      GET claim → plan it once (claimplan.py: our results, configs, one record per device, each effect's part)
      lock the physical GPUs involved (sorted; other GPUs prepare concurrently)
        checkpoint PrepareStarted, refusing devices another claim holds (inside the write: it sees the store's
          current state) — only where an effect changes the node (a whole GPU used as it is changes nothing
          but its CDI spec, which recovery removes as an orphan)
        apply each device effect in order (plugin/effects/registry.py: MIG partition, time-slice, MPS daemon,
          capacity share)
        write the claim's CDI spec (the CDI spec effect)
        checkpoint PrepareCompleted (with the live identities)
      return CDI ids

    unprepare(claim): read the checkpoint → lock its GPUs → checkpoint UnprepareStarted (where an effect holds
      something on the node) → undo the device effects in reverse order → remove the CDI spec → drop the record.
      Idempotent (an unknown claim is a success).

Each step after a checkpoint write is undone or finished by the next call or by startup recovery (recovery.py):
a PrepareStarted record is rolled back, an UnprepareStarted record is released to the end (never repaired back).
A record a crash left half-done is read again under the locks before it is undone (the one path with a second
read). Nothing here knows a device kind: the effects do.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from typing import TypeVar

import structlog

from dra_driver.errors import DraDriverError
from dra_driver.inventory.catalog import AllocatableDevice
from dra_driver.k8s.client import ApiError, JsonObject
from dra_driver.kubeletplugin.claimengine import RecordChanged, expect_record, made_recorder
from dra_driver.kubeletplugin.claims import ClaimSource
from dra_driver.kubeletplugin.driver import ClaimRef, PrepareResult
from dra_driver.kubeletplugin.statedirs import OPERATION_LOCK_NAME, OperationLock
from dra_driver.observability.logging import claim_fields
from dra_driver.observability.metrics import PluginMetrics
from dra_driver.plugin.actuator import PrepareError
from dra_driver.plugin.checkpoint import (
    Checkpoint,
    CheckpointStore,
    ClaimRecord,
    ClaimState,
)
from dra_driver.plugin.claimplan import plan_claim, refuse
from dra_driver.plugin.effects.base import ClaimPlan, Created, Records
from dra_driver.plugin.effects.registry import ClaimEffects
from dra_driver.plugin.engineparts import EngineParts, EngineSettings, claim_gpus, prepare_result
from dra_driver.plugin.faults import FaultPoints
from dra_driver.plugin.preparedmetrics import PreparedMetrics
from dra_driver.plugin.recovery import Recovery
from dra_driver.plugin.repair import ClaimRepair

__all__ = ["ClaimSource", "EngineSettings", "PrepareEngine"]

log = structlog.get_logger(__name__)
R = TypeVar("R")


class PrepareEngine:
    def __init__(
        self,
        *,
        settings: EngineSettings,
        claims: ClaimSource,
        catalog: Callable[[], Mapping[str, AllocatableDevice]],
        effects: ClaimEffects,
        checkpoint: CheckpointStore,
        faults: FaultPoints | None = None,
        metrics: PluginMetrics | None = None,
        operation_lock: OperationLock | None = None,
    ) -> None:
        self.settings = settings
        self.metrics = metrics or PluginMetrics()
        self.parts = EngineParts(
            settings=settings,
            claims=claims,
            catalog=catalog,
            effects=effects,
            checkpoint=checkpoint,
            operations=operation_lock or OperationLock(checkpoint.path.with_name(OPERATION_LOCK_NAME)),
            faults=faults or FaultPoints(),
        )
        self._claims, self._checkpoint, self._locks = claims, checkpoint, self.parts.locks
        self._operations, self._faults, self._effects = self.parts.operations, self.parts.faults, effects
        self._prepared = PreparedMetrics(self.metrics)
        self._pool = ThreadPoolExecutor(max_workers=settings.max_parallel_claims, thread_name_prefix="claim")
        self.repair = ClaimRepair(self.parts)
        self.recovery = Recovery(
            self.parts, self.repair, unprepare=self.unprepare_claim, release=self._unprepare_safely
        )
        self.after_operation: Callable[[], None] | None = None  # e.g. wake the usage sampler
        # Called with each ResourceClaim a prepare read (e.g. the usage sampler learns its pod without a GET).
        self.claim_read: Callable[[str, JsonObject], None] | None = None

    def close(self) -> None:
        self._pool.shutdown(wait=True)
        self._operations.close()

    def prepared_claims(self) -> Checkpoint:
        return self._checkpoint.load()

    def record_prepared(self, checkpoint: Checkpoint) -> None:
        """Prepared claims, devices by type and MPS daemons in the metrics (cheap: a recorded one is skipped)."""
        self._prepared.record(checkpoint)

    # --- the gRPC-facing API ------------------------------------------------------------------------

    def prepare(self, claims: list[ClaimRef]) -> dict[str, PrepareResult]:
        return dict(zip((c.uid for c in claims), self._each(self._prepare_safely, claims), strict=True))

    def unprepare(self, claims: list[ClaimRef]) -> dict[str, str]:
        return dict(zip((c.uid for c in claims), self._each(self._unprepare_safely, claims), strict=True))

    def _each(self, operation: Callable[[ClaimRef], R], claims: list[ClaimRef]) -> list[R]:
        """The claims of one call side by side in the claim pool; a single claim (the kubelet sends one call per
        pod, usually with one claim) runs in the calling thread: handing it to the pool and waiting for it cost
        two thread switches under the GIL and gained nothing."""
        if len(claims) == 1:
            return [operation(claims[0])]
        return list(self._pool.map(operation, claims))

    def _observed(
        self, operation: str, ref: ClaimRef, run: Callable[[ClaimRef, float], R], ok: Callable[[R], bool]
    ) -> R:
        """Run one claim's operation with the claim bound in the logging context (so lines logged deeper down,
        in MIG or CDI code, carry it too) and record its outcome and duration in the metrics."""
        started = time.monotonic()
        with structlog.contextvars.bound_contextvars(**claim_fields(ref.namespace, ref.name, ref.uid)):
            result = run(ref, started)
        self.metrics.observe(operation, time.monotonic() - started, ok=ok(result))
        if self.after_operation is not None:
            self.after_operation()
        return result

    def _write(self, change: Callable[[Checkpoint], Checkpoint]) -> Checkpoint:
        """A durable state change; the checkpoint it made is what the metrics show."""
        checkpoint = self._checkpoint.update(change)
        self.record_prepared(checkpoint)
        return checkpoint

    # --- prepare -----------------------------------------------------------------------------------

    def _prepare_safely(self, ref: ClaimRef) -> PrepareResult:
        return self._observed("prepare", ref, self._prepare_logged, lambda r: not r.error)

    def _prepare_logged(self, ref: ClaimRef, started: float) -> PrepareResult:
        try:
            with self._operations.shared(self.settings.lock_timeout):
                result = self.prepare_claim(ref)
        except ApiError as exc:
            log.warning("prepare failed: API error", error=str(exc))
            return PrepareResult(error=f"prepare {ref.namespace}/{ref.name}: reading the ResourceClaim failed: {exc}")
        except DraDriverError as exc:  # refused on purpose: the message is for the user
            log.warning("prepare failed", error=str(exc))
            return PrepareResult(error=f"prepare {ref.namespace}/{ref.name}: {exc}")
        except Exception as exc:
            log.exception("prepare failed unexpectedly")
            return PrepareResult(error=f"prepare {ref.namespace}/{ref.name}: internal error: {exc}")
        log.info(
            "claim prepared",
            devices=[d.device for d in result.devices],
            seconds=round(time.monotonic() - started, 4),
        )
        return result

    def prepare_claim(self, ref: ClaimRef) -> PrepareResult:
        checkpoint = self._checkpoint.load()
        existing = checkpoint.claims.get(ref.uid)
        if existing is not None and existing.state is ClaimState.PREPARE_COMPLETED:
            if existing.lost is not None:
                raise PrepareError(existing.lost)  # lost in a driver reload: never re-made under the same name
            # The checkpoint is a record, not proof: what it returns must still exist as recorded.
            if not self.repair.damage(existing, checkpoint, self.parts.catalog()):
                return _answer(existing)
            repaired = self.repair.repair_claim(ref.uid)
            if repaired is not None:
                return _answer(repaired)
            existing = None  # the record changed state meanwhile (a concurrent unprepare): prepare from scratch

        claim = self._claims.get_claim(ref.namespace, ref.name)
        catalog = self.parts.catalog()
        plan = plan_claim(self.settings, self._effects, ref, claim, catalog)
        if claim is not None and self.claim_read is not None:
            self.claim_read(ref.uid, claim)
        if not plan.devices:
            return PrepareResult()
        with self._locks.hold([d.gpu.uuid for d in plan.devices], self.settings.lock_timeout):
            try:
                return self._prepare_locked(plan, checkpoint, leftover=existing is not None, catalog=catalog)
            except RecordChanged as settled:
                assert settled.record is not None
                return _answer(settled.record)  # a concurrent call finished it while we waited

    def _prepare_locked(
        self, plan: ClaimPlan, checkpoint: Checkpoint, *, leftover: bool, catalog: Mapping[str, AllocatableDevice]
    ) -> PrepareResult:
        ref = plan.ref
        if leftover:
            # A PrepareStarted / UnprepareStarted record a crash left: undone first, as it is now.
            checkpoint = self._checkpoint.load()
            current = checkpoint.claims.get(ref.uid)
            if current is not None:
                _expect_unfinished(current)
                refuse(plan, self._effects, checkpoint, catalog)
                self._undo(current, checkpoint)
                self._effects.spec.undo(current, current.devices, checkpoint, rollback=True)

        def checked(cp: Checkpoint) -> Checkpoint:
            """`cp` when this claim may be prepared in it; raises otherwise (inside a write: the current state)."""
            current = cp.claims.get(ref.uid)
            if current is not None:
                _expect_unfinished(current)
            refuse(plan, self._effects, cp, catalog)
            return cp

        # PrepareStarted is what lets a crash be rolled back: it must be durable before the node changes. A claim
        # that changes nothing but its CDI spec (whole GPUs and static MIG devices, used exclusively) has nothing
        # to roll back but the spec, which recovery removes as an orphan: one fsynced write fewer on the most
        # common prepare (its checks then run inside the PrepareCompleted write).
        started = leftover or self._effects.changes_node(plan)
        pending = ClaimRecord(
            ref.uid, ref.namespace, ref.name, ClaimState.PREPARE_STARTED, allocated=plan.records,
            pod_claim_name=plan.pod_claim_name,
        )  # fmt: skip
        if started:
            checkpoint = self._checkpoint.update(lambda cp: checked(cp).with_claim(pending))
        self._faults.reached("prepare:after-checkpoint-started")
        records = plan.records
        try:
            created = self._recorder(ref.uid)
            records = self._effects.apply_devices(plan, records, checkpoint, created)
            self._faults.reached("prepare:after-devices")
            self._effects.spec.apply(plan, records, checkpoint, created)
            self._faults.reached("prepare:after-cdi")
        except BaseException:
            if started:
                self._rollback_started(ref)
            else:
                with contextlib.suppress(Exception):  # recovery removes an orphan spec otherwise
                    self._effects.spec.undo(pending, records, checkpoint, rollback=True)
            raise
        done = ClaimRecord(
            ref.uid, ref.namespace, ref.name, ClaimState.PREPARE_COMPLETED, devices=records, allocated=plan.records,
            pod_claim_name=plan.pod_claim_name,
        )  # fmt: skip

        def completed(cp: Checkpoint) -> Checkpoint:
            return (cp if started else checked(cp)).with_claim(done)

        try:
            self._write(completed)
        except DraDriverError:
            if not started:  # refused inside the write: only the spec was made
                with contextlib.suppress(Exception):
                    self._effects.spec.undo(pending, records, checkpoint, rollback=True)
            raise
        self._faults.reached("prepare:after-checkpoint-completed")
        return _answer(done, plan.notes)

    def _recorder(self, uid: str) -> Created:
        """Names what an effect just made (a MIG instance, the functions a passthrough is about to move) in the
        PrepareStarted record's planned devices (so rollback undoes exactly it)."""
        return made_recorder(self._checkpoint, uid, ("allocated",))

    # --- unprepare ---------------------------------------------------------------------------------

    def _unprepare_safely(self, ref: ClaimRef) -> str:
        return self._observed("unprepare", ref, self._unprepare_logged, lambda error: not error)

    def _unprepare_logged(self, ref: ClaimRef, started: float) -> str:
        try:
            with self._operations.shared(self.settings.lock_timeout):
                released = self.unprepare_claim(ref)
        except DraDriverError as exc:
            log.warning("unprepare failed", error=str(exc))
            return f"unprepare {ref.namespace}/{ref.name}: {exc}"
        except Exception as exc:
            log.exception("unprepare failed unexpectedly")
            return f"unprepare {ref.namespace}/{ref.name}: internal error: {exc}"
        if released:
            log.info("claim unprepared", seconds=round(time.monotonic() - started, 4))
        return ""

    def unprepare_claim(self, ref: ClaimRef) -> bool:
        """False when the claim was not prepared here (nothing to do, still a success)."""
        record = self._checkpoint.load().claims.get(ref.uid)
        if record is None:
            return False
        with self._locks.hold(claim_gpus(record), self.settings.lock_timeout):
            return self._unprepare_locked(ref, record)

    def _unprepare_locked(self, ref: ClaimRef, record: ClaimRecord) -> bool:
        spec = self._effects.spec
        if record.state is ClaimState.PREPARE_COMPLETED and not self._effects.holds(record):
            # Nothing on the node but its spec: no UnprepareStarted, no device undo. The spec goes first, then the
            # record (a crash in between leaves a completed record without its spec, which recovery writes again;
            # no hardware is "repaired back"). Two durable writes instead of three.
            self._faults.reached("unprepare:after-devices")
            spec.undo(record, record.devices, Checkpoint(), rollback=False)
            return self._forget(ref)
        checkpoint: Checkpoint | None = None
        if record.state is ClaimState.PREPARE_COMPLETED:
            # Recorded before anything is released: a crash from here on finishes the release at startup instead of
            # finding a "damaged" claim and repairing it back. The write checks the record is still the one read.
            with contextlib.suppress(RecordChanged):
                checkpoint = self._write(lambda cp: _unprepare_started(cp, ref.uid, expected=record))
        if checkpoint is None:
            # A record a crash left half-done, or one that changed while this call waited for the locks: read again
            # under the locks and undone as it is now.
            checkpoint = self._checkpoint.load()
            current = checkpoint.claims.get(ref.uid)
            if current is None:
                return False
            if current.state is ClaimState.PREPARE_COMPLETED:
                try:
                    checkpoint = self._write(lambda cp: _unprepare_started(cp, ref.uid))
                except RecordChanged:
                    return False
        record = checkpoint.claims[ref.uid]
        self._undo(record, checkpoint)
        self._faults.reached("unprepare:after-devices")
        spec.undo(record, record.devices, checkpoint, rollback=record.state is ClaimState.PREPARE_STARTED)
        return self._forget(ref)

    def _forget(self, ref: ClaimRef) -> bool:
        self._faults.reached("unprepare:after-cdi")
        self._write(lambda cp: cp.without_claim(ref.uid))
        self._faults.reached("unprepare:after-checkpoint")
        return True

    # --- undoing -----------------------------------------------------------------------------------

    def _undo(self, record: ClaimRecord, checkpoint: Checkpoint) -> None:
        """The device effects of a record, in reverse order (an MPS daemon stops before its MIG instance goes)."""
        rollback = record.state is ClaimState.PREPARE_STARTED
        devices: Records = record.allocated if rollback else record.devices
        self._effects.undo_devices(record, devices, checkpoint, rollback=rollback)

    def _rollback_started(self, ref: ClaimRef) -> None:
        checkpoint = self._checkpoint.load()  # a failed prepare: what its PrepareStarted record holds now
        record = checkpoint.claims.get(ref.uid)
        if record is None or record.state is not ClaimState.PREPARE_STARTED:
            return
        try:
            self._undo(record, checkpoint)
            self._effects.spec.undo(record, record.allocated, checkpoint, rollback=True)
        except Exception:
            # Keep the PrepareStarted record: the next call or startup recovery tries again.
            log.exception("rollback after a failed prepare failed", **claim_fields(ref.namespace, ref.name, ref.uid))
            return
        self._checkpoint.update(lambda cp: cp.without_claim(ref.uid))


def _answer(record: ClaimRecord, notes: tuple[str, ...] = ()) -> PrepareResult:
    """The kubelet's answer for a prepared claim, carrying the record it came from (the prepare pipeline's observers
    read it instead of the checkpoint: kubeletplugin/pipeline.py)."""
    return replace(prepare_result(record.devices, notes), record=record)


def _expect_unfinished(current: ClaimRecord) -> None:
    if current.state is ClaimState.PREPARE_COMPLETED:
        raise RecordChanged(current)


def _unprepare_started(cp: Checkpoint, uid: str, expected: ClaimRecord | None = None) -> Checkpoint:
    current = cp.claims.get(uid)
    if current is None:
        raise RecordChanged(current)
    expect_record(cp, uid, expected or current)
    return cp.with_claim(replace(current, state=ClaimState.UNPREPARE_STARTED))
