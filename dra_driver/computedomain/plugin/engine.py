"""Prepare, unprepare and recovery of compute-domain claims: the compute-domain plugin's `Driver`.

Prepare (docs/compute-domains.md, "The compute-domain kubelet plugin"):

    checkpoint says PrepareCompleted -> verify (CDI spec bytes, daemon dir) -> repair if needed -> recorded ids
    GET the ResourceClaim; our results (driver, pool = node); resolve the opaque configs (one domain per claim)
    find the ComputeDomain by UID (LIST; the config names the UID only)
    ── under the node-state lock ──
      PrepareAborted for this very allocation -> permanent "stale prepare ... already aborted" (NVIDIA #1162)
      UnprepareStarted (a crash mid-unprepare) -> finish it first
      refuse: namespace (channel: the domain's; daemon: the driver's), channel held by another claim
      checkpoint PrepareStarted (durable) -> apply: one domain per clique, node label, daemon dir
    ── node state unlocked ── readiness (1.34/1.35 or without binding conditions): wait up to --readiness-wait for
      this node's clique entry to be Ready; still not -> retryable error, PrepareStarted and the label stay
    ── under the node-state lock ── PrepareCompleted for this allocation (another plugin instance's call of the
      claim finished it) -> its answer; the record must otherwise still be our PrepareStarted (an unprepare
      meanwhile aborted it: refused as stale) -> write the CDI spec -> checkpoint PrepareCompleted

Every prepare and unprepare of one claim holds that claim's lock (the layer's KeyedLocks, as the GPU engine holds
its GPUs' locks) from start to answer: identical concurrent calls (the kubelet's retry while the first call still
waits for IMEX, a hostile client) run one after the other, and the later ones find the claim PrepareCompleted and
return the same CDI ids. Other claims are not held up (the readiness wait holds no node-wide lock).

Unprepare: unknown or aborted claim -> success. PrepareStarted -> undo what it did and record PrepareAborted
(expires after ABORTED_TTL_S). Completed -> UnprepareStarted, undo (daemon dir, node label when no other claim of
the domain on this node holds a channel), remove the CDI spec, drop the record.

Recovery and the periodic cleanup: recovery.py (`engine.recovery`). Planning: claimplan.py. What the engine steps
through: the effect kinds of effects/registry.py, then the claim's CDI spec (effects/cdi_spec.py), on the layer's
effect protocol (kubeletplugin/effect.py).
"""

from __future__ import annotations

import dataclasses
import threading
import time
from collections.abc import Callable, Mapping

import structlog

from dra_driver.computedomain.plugin.cdi import SpecFiles
from dra_driver.computedomain.plugin.checkpoint import (
    Checkpoint,
    ClaimRecord,
    ClaimState,
    DomainClaim,
    DomainDevice,
)
from dra_driver.computedomain.plugin.claimplan import DomainEngineSettings, plan_domain_claim
from dra_driver.computedomain.plugin.effects.base import DomainEffects, DomainPlan, DomainTools, PermanentError
from dra_driver.computedomain.plugin.effects.cdi_spec import DomainCdiSpec
from dra_driver.computedomain.plugin.effects.daemon_dir import DaemonDir
from dra_driver.computedomain.plugin.effects.registry import DOMAIN_EFFECTS
from dra_driver.computedomain.plugin.metrics import CdPluginMetrics
from dra_driver.computedomain.plugin.recovery import OPERATION_TIMEOUT_S, DomainRecovery
from dra_driver.errors import DraDriverError
from dra_driver.k8s.client import ApiError
from dra_driver.kubeletplugin.checkpoint import CheckpointStore
from dra_driver.kubeletplugin.claimengine import RecordChanged, expect_record, made_recorder
from dra_driver.kubeletplugin.claims import ClaimSource
from dra_driver.kubeletplugin.driver import ClaimRef, DeviceResult, PrepareResult
from dra_driver.kubeletplugin.effect import Created, Effect
from dra_driver.kubeletplugin.statedirs import KeyedLocks, NodeStateBusyError, OperationLock

log = structlog.get_logger(__name__)

UNPREPARE_ATTEMPTS = 3


class StalePrepareError(PermanentError):
    pass


class ClaimBusyError(DraDriverError):
    """Another call of the same claim in this process did not finish within the wait: retryable."""


def error_reason(exc: DraDriverError) -> str:
    """The `reason` label of a refused prepare (metrics.PREPARE_ERROR_REASONS)."""
    if isinstance(exc, StalePrepareError):
        return "stale"
    if isinstance(exc, PermanentError):
        return "invalid"
    if isinstance(exc, NodeStateBusyError | ClaimBusyError):
        return "busy"
    return "failed"


class ComputeDomainEngine:
    """A `Driver` of the kubelet-plugin layer."""

    def __init__(
        self,
        settings: DomainEngineSettings,
        *,
        claims: ClaimSource,
        store: CheckpointStore[Checkpoint],
        specs: SpecFiles,
        tools: DomainTools,
        clique_id: Callable[[], str],
        lock: OperationLock,
        wall_clock: Callable[[], float] = time.time,
        monotonic: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], None] = time.sleep,
        metrics: CdPluginMetrics | None = None,
    ) -> None:
        self.settings = settings
        self._claims = claims
        self.store = store
        self.specs = specs
        self.tools = tools
        self._clique_id = clique_id
        self._lock = lock
        self._wall = wall_clock
        self._monotonic = monotonic
        self._sleep = sleep
        self._faults = tools.faults
        self._metrics = metrics
        devices = tuple(kind(tools) for kind in DOMAIN_EFFECTS)
        self.effects = DomainEffects(devices=devices, spec=DomainCdiSpec(specs, devices))
        # Serialises the decisions on the node's claim state (checkpoint, node label, daemon dirs) within this
        # process; the operation lock keeps recovery of every instance apart.
        self._state = threading.Lock()
        self.recovery = DomainRecovery(self, store=store, effects=self.effects, claims=claims, lock=lock,
                                       state=self._state, wall_clock=wall_clock)
        self._claim_locks = KeyedLocks(busy=lambda uid: ClaimBusyError(
            f"another prepare or unprepare of the claim with UID {uid} is still running in this plugin (it may be "
            "waiting for the node's IMEX daemon); the kubelet retries"))

    def _claim_wait_s(self) -> float:
        """How long a call waits for another call of the same claim: that one's readiness wait and API reads."""
        return self.settings.readiness_wait_s + OPERATION_TIMEOUT_S

    # --- the Driver protocol ------------------------------------------------------------------------------------

    def prepare(self, claims: list[ClaimRef]) -> dict[str, PrepareResult]:
        out: dict[str, PrepareResult] = {}
        for ref in claims:
            started = self._monotonic()
            reason = "not-ready"  # the one error _prepare returns rather than raises
            try:
                with self._lock.shared(timeout=OPERATION_TIMEOUT_S), \
                        self._claim_locks.hold([ref.uid], self._claim_wait_s()):
                    out[ref.uid] = self._prepare(ref)
            except DraDriverError as exc:
                reason = error_reason(exc)
                out[ref.uid] = PrepareResult(error=str(exc))
            except ApiError as exc:
                reason = "api"
                out[ref.uid] = PrepareResult(error=f"reading the API for ResourceClaim {ref.namespace}/{ref.name}: "
                                                   f"{exc}; the kubelet retries")
            except Exception as exc:
                reason = "internal"
                log.exception("prepare failed", claim_uid=ref.uid, claim_namespace=ref.namespace, claim_name=ref.name)
                out[ref.uid] = PrepareResult(error=f"internal error: {exc}")
            if out[ref.uid].error:
                log.warning("prepare refused", claim_uid=ref.uid, claim_namespace=ref.namespace,
                            claim_name=ref.name, error=out[ref.uid].error)
            if self._metrics is not None:
                self._metrics.prepared(self._monotonic() - started, reason if out[ref.uid].error else "")
        return out

    def unprepare(self, claims: list[ClaimRef]) -> dict[str, str]:
        out: dict[str, str] = {}
        for ref in claims:
            try:
                with self._lock.shared(timeout=OPERATION_TIMEOUT_S), \
                        self._claim_locks.hold([ref.uid], self._claim_wait_s()), self._state:
                    self._unprepare(ref.uid)
                out[ref.uid] = ""
            except (DraDriverError, ApiError, OSError) as exc:
                out[ref.uid] = f"unprepare of ResourceClaim {ref.namespace}/{ref.name}: {exc}"
                log.warning("unprepare failed", claim_uid=ref.uid, error=out[ref.uid])
            if self._metrics is not None:
                self._metrics.unprepared(not out[ref.uid])
        return out

    # --- prepare ------------------------------------------------------------------------------------------------

    def _prepare(self, ref: ClaimRef) -> PrepareResult:
        loaded = self.store.load()
        recorded = loaded.claims.get(ref.uid)
        if recorded is not None and recorded.state is ClaimState.PREPARE_COMPLETED:
            with self._state:
                return self.prepared_again(recorded, loaded)
        obj = self._claims.get_claim(ref.namespace, ref.name)
        plan = plan_domain_claim(self.settings, self.effects, self.tools.domains, self._clique_id(), ref, obj)
        with self._state:
            checkpoint = self.store.load()
            current = checkpoint.claims.get(ref.uid)
            if current is not None and current.state is ClaimState.PREPARE_COMPLETED:
                return self.prepared_again(current, checkpoint)
            if current is not None and current.state is ClaimState.PREPARE_ABORTED:
                if current.allocation == plan.record.allocation:
                    raise StalePrepareError(self._stale(ref, current))
                checkpoint = self.store.update(lambda c: c.without_claim(ref.uid))  # a new allocation: start afresh
            elif current is not None and current.state is ClaimState.UNPREPARE_STARTED:
                self.release(current, checkpoint)
                checkpoint = self.store.update(lambda c: c.without_claim(ref.uid))
            elif current is not None and current.allocation != plan.record.allocation:
                # A PrepareStarted record of an earlier allocation of this claim: roll it back first.
                self.undo(current, checkpoint)
                checkpoint = self.store.update(lambda c: c.without_claim(ref.uid))
            decided = checkpoint.claims.get(ref.uid)
            try:
                self.effects.refuse(plan, checkpoint, None)
                if self.effects.changes_node(plan):
                    checkpoint = self.store.update(lambda c: expect_record(c, ref.uid, decided).with_claim(plan.record))
                    self._faults.reached("cd-prepare:after-checkpoint-started")
                self.effects.apply_devices(plan, plan.record.devices, checkpoint, self._recorder(ref.uid))
            except RecordChanged as changed:
                return self._settled(ref, plan, changed.record)  # nothing of this call's was made yet
            except Exception:
                self._roll_back(ref.uid)
                raise
        problem = self._wait_ready(plan)
        if problem:
            # Retryable: PrepareStarted and the node label stay, so the daemon keeps starting; the kubelet asks
            # again (an unprepare meanwhile aborts the claim).
            return PrepareResult(error=problem)
        with self._state:
            checkpoint = self.store.load()
            current = checkpoint.claims.get(ref.uid)
            if self._completes(current, plan):
                # Another plugin instance on the node (a rolling update runs two) finished this very prepare while
                # this call waited: the same answer, not a refusal.
                return self._settled(ref, plan, current)
            if current is None or current.state is not ClaimState.PREPARE_STARTED or (
                    current.allocation != plan.record.allocation):
                raise StalePrepareError(self._stale(ref, current))
            record = plan.record
            self.effects.spec.apply(plan, record.devices, checkpoint, self._recorder(ref.uid))
            self._faults.reached("cd-prepare:after-cdi")
            done = dataclasses.replace(record, state=ClaimState.PREPARE_COMPLETED)
            try:
                self.store.update(lambda c: expect_record(c, ref.uid, current).with_claim(done))
            except RecordChanged as changed:
                if not self._completes(changed.record, plan):
                    self.specs.remove(ref.uid)  # the claim is not prepared: no spec may name it
                return self._settled(ref, plan, changed.record)
            self._faults.reached("cd-prepare:after-checkpoint-completed")
            log.info("claim prepared", claim_uid=ref.uid, claim_namespace=ref.namespace, claim_name=ref.name,
                     domain=f"{plan.domain.namespace}/{plan.domain.name}", devices=[d.device for d in done.devices])
            return self._result(done)

    @staticmethod
    def _completes(record: ClaimRecord | None, plan: DomainPlan) -> bool:
        """Whether `record` is this very prepare, completed."""
        return record is not None and record.state is ClaimState.PREPARE_COMPLETED and (
            record.allocation == plan.record.allocation)

    def _settled(self, ref: ClaimRef, plan: DomainPlan, record: ClaimRecord | None) -> PrepareResult:
        """The answer when another plugin instance changed the claim's record while this call worked on it."""
        if self._completes(record, plan):
            assert record is not None
            return self.prepared_again(record)  # it prepared the same allocation: the same answer
        if record is not None and record.state is ClaimState.PREPARE_ABORTED and (
                record.allocation == plan.record.allocation):
            raise StalePrepareError(self._stale(ref, record))
        raise DraDriverError(
            f"ResourceClaim {ref.namespace}/{ref.name}: its record in the checkpoint changed while this prepare ran "
            f"(now {record.state.value if record else 'absent'}; another plugin instance on this node works on the "
            "claim); nothing was changed by this call, the kubelet retries")

    def _stale(self, ref: ClaimRef, current: ClaimRecord | None) -> str:
        return (f"stale prepare of ResourceClaim {ref.namespace}/{ref.name} (UID {ref.uid}): it was unprepared "
                "while this prepare was pending and is already aborted (PrepareAborted); nothing was prepared. A "
                "new allocation of the claim is prepared normally")

    def _recorder(self, uid: str) -> Created[DomainDevice]:
        """Names what an effect made for a device in the claim's record, durably (kubeletplugin/effect.py)."""
        return made_recorder(self.store, uid, ("devices",))

    def _roll_back(self, uid: str) -> None:
        checkpoint = self.store.load()
        record = checkpoint.claims.get(uid)
        if record is not None and record.state is ClaimState.PREPARE_STARTED:
            self.undo(record, checkpoint)
            self.store.update(lambda c: c.without_claim(uid))

    def _wait_ready(self, plan: DomainPlan) -> str:
        deadline = self._monotonic() + self.settings.readiness_wait_s
        while True:
            problem = self.effects.ready(plan)
            if not problem or self._monotonic() >= deadline:
                return problem
            self._sleep(self.settings.readiness_poll_s)

    def _result(self, record: ClaimRecord) -> PrepareResult:
        return PrepareResult(devices=tuple(
            DeviceResult(d.request_names, d.pool, d.device, d.cdi_device_ids) for d in record.devices))

    def prepared_again(self, record: ClaimRecord, checkpoint: Checkpoint | None = None) -> PrepareResult:
        """The answer for a completed claim, repaired first where it no longer matches its record."""
        checkpoint = checkpoint if checkpoint is not None else self.store.load()
        problems = self.effects.damage(record, checkpoint, None)
        if problems:
            log.warning("prepared claim damaged; repairing", claim_uid=record.uid, problems=problems)
            self.effects.repair(record, checkpoint, None, self._recorder(record.uid))
        return self._result(record)

    # --- unprepare ----------------------------------------------------------------------------------------------

    def _unprepare(self, uid: str) -> None:
        for _ in range(UNPREPARE_ATTEMPTS):
            try:
                return self._unprepare_once(uid)
            except RecordChanged:
                continue  # another plugin instance moved the record between our read and our write: decide again
        raise DraDriverError(f"the claim's record kept changing under another plugin instance ({UNPREPARE_ATTEMPTS} "
                             "tries); the kubelet retries")

    def _unprepare_once(self, uid: str) -> None:
        checkpoint = self.store.load()
        record = checkpoint.claims.get(uid)
        if record is None or record.state is ClaimState.PREPARE_ABORTED:
            return
        if record.state is ClaimState.PREPARE_STARTED:
            # NVIDIA #1162: the prepare may still be pending (waiting for IMEX) or be retried late. The abort is
            # recorded first, so that from now on nothing can complete it (a crash in between is finished by
            # recovery, which undoes aborted records again); then what it did is undone.
            aborted = dataclasses.replace(record, state=ClaimState.PREPARE_ABORTED, aborted_at=self._wall())
            checkpoint = self.store.update(lambda c: expect_record(c, uid, record).with_claim(aborted))
            self._faults.reached("cd-unprepare:after-abort")
            self.release(aborted, checkpoint)
            log.info("pending prepare aborted by unprepare", claim_uid=uid, claim_namespace=record.namespace,
                     claim_name=record.name)
            return
        started = dataclasses.replace(record, state=ClaimState.UNPREPARE_STARTED)
        if record.state is not ClaimState.UNPREPARE_STARTED:
            checkpoint = self.store.update(lambda c: expect_record(c, uid, record).with_claim(started))
            self._faults.reached("cd-unprepare:after-checkpoint-started")
        self.release(started, checkpoint)
        self.store.update(lambda c: c.without_claim(uid))
        self._faults.reached("cd-unprepare:after-checkpoint")
        log.info("claim unprepared", claim_uid=uid, claim_namespace=record.namespace, claim_name=record.name)

    def undo(self, record: ClaimRecord, checkpoint: Checkpoint) -> None:
        """Every effect's undo, in reverse order (the daemon dir before the node label)."""
        self.effects.undo_devices(record, record.devices, checkpoint,
                                  rollback=record.state is ClaimState.PREPARE_STARTED, after=self._undone)

    def _undone(self, effect: Effect[DomainPlan, DomainDevice, DomainClaim, None]) -> None:
        step = "daemon-dir" if effect.kind == DaemonDir.kind else "node-label"
        self._faults.reached(f"cd-unprepare:after-{step}")

    def release(self, record: ClaimRecord, checkpoint: Checkpoint) -> None:
        """Undo what the record names and remove its CDI spec (the record itself stays)."""
        self.undo(record, checkpoint)
        self.effects.spec.undo(record, record.devices, checkpoint, rollback=False)
        self._faults.reached("cd-unprepare:after-cdi")

    def prepared(self) -> Mapping[str, ClaimRecord]:
        return {u: r for u, r in self.store.load().claims.items() if r.state is ClaimState.PREPARE_COMPLETED}

    def close(self) -> None:
        self._lock.close()
