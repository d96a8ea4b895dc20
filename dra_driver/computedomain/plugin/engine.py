"""Prepare, unprepare and recovery of compute-domain claims: the compute-domain plugin's `Driver`, the layer's one
claim engine (kubeletplugin/claimstates.py) over this driver's effects and its rules (`DomainClaimRules`).

Prepare (docs/compute-domains.md, "The compute-domain kubelet plugin"):

    checkpoint says PrepareCompleted -> verify (CDI spec bytes, daemon dir) -> repair if needed -> recorded ids
    GET the ResourceClaim; our results (driver, pool = node); resolve the opaque configs (one domain per claim)
    find the ComputeDomain by UID (LIST; the config names the UID only)
    ── under the node-state lock ──
      PrepareAborted for this very allocation -> permanent "stale prepare ... already aborted" (NVIDIA #1162)
      PrepareStarted of this allocation (a retry while the IMEX daemon starts) -> kept; any other record undone
      refuse: namespace (channel: the domain's; daemon: the driver's), channel held by another claim
      checkpoint PrepareStarted (durable) -> apply: one domain per clique, node label, daemon dir
    ── node state unlocked ── readiness (1.34/1.35 or without binding conditions): wait up to --readiness-wait for
      this node's clique entry to be Ready; still not -> retryable error, PrepareStarted and the label stay
    ── under the node-state lock ── the record must still be our PrepareStarted (completed meanwhile by another
      plugin instance's call of the claim -> its answer; an unprepare meanwhile aborted it -> refused as stale)
      -> write the CDI spec -> checkpoint PrepareCompleted

Every prepare and unprepare of one claim holds that claim's lock (the rules' claim key) from start to answer:
identical concurrent calls (the kubelet's retry while the first call still waits for IMEX, a hostile client) run
one after the other, and the later ones find the claim PrepareCompleted and return the same CDI ids. Other claims
are not held up (the readiness wait holds no node-wide lock).

Unprepare: unknown or aborted claim -> success. PrepareStarted -> record PrepareAborted (expires after
ABORTED_TTL_S) and undo what it did. Completed -> UnprepareStarted, undo (daemon dir, node label when no other claim
of the domain on this node holds a channel), remove the CDI spec, drop the record.

Recovery and the periodic cleanup: recovery.py (`engine.recovery`). Planning: claimplan.py. What the engine steps
through: the effect kinds of effects/registry.py, then the claim's CDI spec (effects/cdi_spec.py).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Literal

import structlog

from dra_driver.computedomain.plugin.cdi import SpecFiles
from dra_driver.computedomain.plugin.checkpoint import Checkpoint, ClaimRecord, ClaimState, DomainClaim, DomainDevice
from dra_driver.computedomain.plugin.claimplan import DomainEngineSettings, plan_domain_claim
from dra_driver.computedomain.plugin.effects.base import DomainEffects, DomainPlan, DomainTools, PermanentError
from dra_driver.computedomain.plugin.effects.cdi_spec import DomainCdiSpec
from dra_driver.computedomain.plugin.effects.daemon_dir import DaemonDir
from dra_driver.computedomain.plugin.effects.registry import DOMAIN_EFFECTS
from dra_driver.computedomain.plugin.metrics import CdPluginMetrics
from dra_driver.computedomain.plugin.recovery import OPERATION_TIMEOUT_S, DomainRecovery
from dra_driver.errors import DraDriverError
from dra_driver.k8s.client import ApiError, JsonObject
from dra_driver.kubeletplugin.checkpoint import CheckpointStore
from dra_driver.kubeletplugin.claimrecord import device_result
from dra_driver.kubeletplugin.claims import ClaimSource
from dra_driver.kubeletplugin.claimstates import ClaimEngine, EngineLimits, Readiness
from dra_driver.kubeletplugin.driver import ClaimRef, PrepareResult
from dra_driver.kubeletplugin.effect import Effect
from dra_driver.kubeletplugin.statedirs import KeyedLocks, NodeStateBusyError, OperationLock

log = structlog.get_logger(__name__)


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


class DomainClaimRules:
    """This driver's choices in the claim engine: one lock per claim; a PrepareStarted record kept across the
    kubelet's retries while the IMEX daemon starts, waited for with the node-state lock let go; an unprepare of a
    pending prepare records PrepareAborted; the planned devices in the record's `devices`."""

    fault_prefix = "cd-"
    planned_in: Literal["devices", "allocated"] = "devices"
    keeps_pending = True
    aborts_pending = True

    def __init__(
        self,
        settings: DomainEngineSettings,
        effects: DomainEffects,
        tools: DomainTools,
        clique_id: Callable[[], str],
        readiness: Readiness,
        metrics: CdPluginMetrics | None,
    ) -> None:
        self.settings, self.effects, self.tools, self.clique_id = settings, effects, tools, clique_id
        self.readiness: Readiness | None = readiness
        self.metrics = metrics

    def claim_keys(self, ref: ClaimRef) -> Sequence[str]:
        return (ref.uid,)

    def plan_keys(self, plan: DomainPlan) -> Sequence[str]:
        return ()

    def record_keys(self, record: ClaimRecord) -> Sequence[str]:
        return ()

    def node(self) -> None:
        return None

    def plan(self, ref: ClaimRef, claim: JsonObject | None, node: None) -> DomainPlan:
        return plan_domain_claim(self.settings, self.effects, self.tools.domains, self.clique_id(), ref, claim)

    def refuse(self, plan: DomainPlan, checkpoint: Checkpoint, node: None) -> None:
        self.effects.refuse(plan, checkpoint, node)

    def pending(self, plan: DomainPlan) -> ClaimRecord:
        return plan.record

    def completed(self, plan: DomainPlan, devices: tuple[DomainDevice, ...]) -> ClaimRecord:
        return ClaimRecord(plan.record.uid, plan.record.namespace, plan.record.name, ClaimState.PREPARE_COMPLETED,
                           devices=devices, details=plan.record.details, allocation=plan.record.allocation)

    def answer(self, record: ClaimRecord, plan: DomainPlan | None) -> PrepareResult:
        if plan is not None:
            log.info("claim prepared", domain=f"{plan.domain.namespace}/{plan.domain.name}",
                     devices=[d.device for d in record.devices])
        return PrepareResult(devices=tuple(device_result(d) for d in record.devices))

    def stale(self, ref: ClaimRef) -> DraDriverError:
        return StalePrepareError(
            f"stale prepare of ResourceClaim {ref.namespace}/{ref.name} (UID {ref.uid}): it was unprepared while this "
            "prepare was pending and is already aborted (PrepareAborted); nothing was prepared. A new allocation of "
            "the claim is prepared normally")

    def unrepairable(self, record: ClaimRecord, node: None) -> str:
        return ""

    def undone(self, effect: Effect[DomainPlan, DomainDevice, DomainClaim, None]) -> None:
        step = "daemon-dir" if effect.kind == DaemonDir.kind else "node-label"
        self.tools.faults.reached(f"cd-unprepare:after-{step}")

    def prepare_error(self, ref: ClaimRef, exc: Exception) -> str:
        if isinstance(exc, DraDriverError):
            error = str(exc)
        elif isinstance(exc, ApiError):
            error = f"reading the API for ResourceClaim {ref.namespace}/{ref.name}: {exc}; the kubelet retries"
        else:
            log.exception("prepare failed")
            error = f"internal error: {exc}"
        return error

    def unprepare_error(self, ref: ClaimRef, exc: Exception) -> str:
        if not isinstance(exc, DraDriverError | ApiError | OSError):
            log.exception("unprepare failed unexpectedly")
        error = f"unprepare of ResourceClaim {ref.namespace}/{ref.name}: {exc}"
        log.warning("unprepare failed", error=error)
        return error

    def prepared(self, ref: ClaimRef, result: PrepareResult, failure: Exception | None, seconds: float) -> None:
        if result.error:
            log.warning("prepare refused", error=result.error)
        if self.metrics is not None:
            self.metrics.prepared(seconds, _reason(failure) if result.error else "")

    def unprepared(self, ref: ClaimRef, error: str, failure: Exception | None, seconds: float) -> None:
        if self.metrics is not None:
            self.metrics.unprepared(not error)


def _reason(failure: Exception | None) -> str:
    if failure is None:
        return "not-ready"  # the one error the engine answers rather than raises
    if isinstance(failure, DraDriverError):
        return error_reason(failure)
    return "api" if isinstance(failure, ApiError) else "internal"


class ComputeDomainEngine(ClaimEngine[DomainPlan, DomainDevice, DomainClaim, None]):
    """A `Driver` of the kubelet-plugin layer: the claim engine with this driver's effects and rules."""

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
        self.settings, self.specs, self.tools = settings, specs, tools
        devices = tuple(kind(tools) for kind in DOMAIN_EFFECTS)
        effects = DomainEffects(devices=devices, spec=DomainCdiSpec(specs, devices))
        readiness = Readiness(settings.readiness_wait_s, settings.readiness_poll_s, monotonic, sleep)
        super().__init__(
            DomainClaimRules(settings, effects, tools, clique_id, readiness, metrics),
            effects=effects, store=store, claims=claims, operations=lock, faults=tools.faults,
            locks=KeyedLocks(busy=lambda uid: ClaimBusyError(
                f"another prepare or unprepare of the claim with UID {uid} is still running in this plugin (it may "
                "be waiting for the node's IMEX daemon); the kubelet retries")),
            # A call waits for another call of the same claim: that one's readiness wait and API reads.
            limits=EngineLimits(OPERATION_TIMEOUT_S, settings.readiness_wait_s + OPERATION_TIMEOUT_S),
            node_lock=threading.Lock(), wall_clock=wall_clock,
        )  # fmt: skip
        self.recovery = DomainRecovery(self, wall_clock=wall_clock)

    def prepared(self) -> Mapping[str, ClaimRecord]:
        return {u: r for u, r in self.store.load().claims.items() if r.state is ClaimState.PREPARE_COMPLETED}
