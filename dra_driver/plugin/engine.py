"""The GPU driver's claim engine: the layer's one claim state machine (kubeletplugin/claimstates.py, which draws
prepare and unprepare step by step) over the GPU effects (plugin/effects/registry.py) and the GPU rules, with
startup recovery (recovery.py) and the prepared claims' gauges (preparedmetrics.py).

The GPU rules (`GpuClaimRules`): one lock per physical GPU (a claim waits for the GPUs it needs, others prepare
concurrently); a record a crash left is undone before preparing again; PrepareStarted only where an effect changes
the node (a whole GPU used as it is changes nothing but its CDI spec, which recovery removes as an orphan); no
readiness wait and no PrepareAborted; the planned devices in the record's `allocated` (a rollback undoes exactly
them, with what MIG made recorded the moment it exists), the prepared ones in `devices`; the device catalog as what
the effects read of the node; and the kubelet's answers, metrics and log lines of each claim. Nothing here knows a
device kind: the effects do.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Literal

import structlog

from dra_driver.errors import DraDriverError
from dra_driver.inventory.catalog import AllocatableDevice
from dra_driver.k8s.client import ApiError, JsonObject
from dra_driver.kubeletplugin import claimrecord
from dra_driver.kubeletplugin.claims import ClaimSource
from dra_driver.kubeletplugin.claimstates import ClaimEngine, EngineLimits, Readiness
from dra_driver.kubeletplugin.driver import ClaimRef, PrepareResult
from dra_driver.kubeletplugin.effect import Effect
from dra_driver.kubeletplugin.statedirs import OPERATION_LOCK_NAME, OperationLock
from dra_driver.observability.metrics import PluginMetrics
from dra_driver.plugin.actuator import PrepareError
from dra_driver.plugin.checkpoint import Checkpoint, CheckpointStore, ClaimRecord, ClaimState, PreparedDevice
from dra_driver.plugin.claimplan import plan_claim, refuse
from dra_driver.plugin.effects.base import Catalog, ClaimPlan
from dra_driver.plugin.effects.registry import ClaimEffects
from dra_driver.plugin.engineparts import EngineParts, EngineSettings, claim_gpus, prepare_result
from dra_driver.plugin.faults import FaultPoints
from dra_driver.plugin.preparedmetrics import PreparedMetrics
from dra_driver.plugin.recovery import Recovery

__all__ = ["ClaimSource", "EngineSettings", "GpuClaimRules", "PrepareEngine"]

log = structlog.get_logger(__name__)


class GpuClaimRules:
    """The GPU driver's choices in the claim engine (module docstring)."""

    fault_prefix = ""  # prepare:after-checkpoint-started, ... (plugin/faults.py)
    planned_in: Literal["devices", "allocated"] = "allocated"
    keeps_pending = False
    aborts_pending = False
    readiness: Readiness | None = None

    def __init__(self, parts: EngineParts, metrics: PluginMetrics) -> None:
        self.parts, self.metrics = parts, metrics
        self.after_operation: Callable[[], None] | None = None  # e.g. wake the usage sampler
        # Called with each ResourceClaim a prepare read (e.g. the usage sampler learns its pod without a GET).
        self.claim_read: Callable[[str, JsonObject], None] | None = None

    def claim_keys(self, ref: ClaimRef) -> Sequence[str]:
        return ()

    def plan_keys(self, plan: ClaimPlan) -> Sequence[str]:
        return [d.gpu.uuid for d in plan.devices]

    def record_keys(self, record: ClaimRecord) -> Sequence[str]:
        return claim_gpus(record)

    def node(self) -> Catalog:
        return self.parts.catalog()

    def plan(self, ref: ClaimRef, claim: JsonObject | None, node: Catalog) -> ClaimPlan | None:
        plan = plan_claim(self.parts.settings, self.parts.effects, ref, claim, node)
        if claim is not None and self.claim_read is not None:
            self.claim_read(ref.uid, claim)
        return plan if plan.devices else None

    def refuse(self, plan: ClaimPlan, checkpoint: Checkpoint, node: Catalog) -> None:
        refuse(plan, self.parts.effects, checkpoint, node)

    # The records are built with the layer's class, not through the `ClaimRecord[PreparedDevice, None]` alias:
    # calling a subscripted generic sets `__orig_class__` on the instance, which a frozen dataclass refuses with an
    # exception that typing catches (≈ 10 µs per record, two records per prepare). The type is the same.
    def pending(self, plan: ClaimPlan) -> ClaimRecord:
        ref = plan.ref
        return claimrecord.ClaimRecord(ref.uid, ref.namespace, ref.name, ClaimState.PREPARE_STARTED,
                                       allocated=plan.records, pod_claim_name=plan.pod_claim_name)  # fmt: skip

    def completed(self, plan: ClaimPlan, devices: tuple[PreparedDevice, ...]) -> ClaimRecord:
        ref = plan.ref
        return claimrecord.ClaimRecord(ref.uid, ref.namespace, ref.name, ClaimState.PREPARE_COMPLETED,
                                       devices=devices, allocated=plan.records,
                                       pod_claim_name=plan.pod_claim_name)  # fmt: skip

    def answer(self, record: ClaimRecord, plan: ClaimPlan | None) -> PrepareResult:
        """The kubelet's answer, carrying the record it came from (the prepare pipeline's observers read it
        instead of the checkpoint: kubeletplugin/pipeline.py); built once, not replaced to add the record."""
        return prepare_result(record.devices, plan.notes if plan is not None else (), record=record)

    def stale(self, ref: ClaimRef) -> DraDriverError:
        return PrepareError("the claim was unprepared while this prepare was pending; the kubelet retries")

    def unrepairable(self, record: ClaimRecord, node: Catalog) -> str:
        gone = [d.device for d in record.devices if d.device not in node]
        if not gone:
            return ""
        return (
            f"the prepared claim cannot be repaired: device(s) {', '.join(gone)} are no longer offered by this "
            "node (GPU lost or re-configured?); delete the pod so that the claim is released and allocated again"
        )

    def undone(self, effect: Effect[ClaimPlan, PreparedDevice, None, Catalog]) -> None:
        return None

    def prepare_error(self, ref: ClaimRef, exc: Exception) -> str:
        if isinstance(exc, ApiError):
            log.warning("prepare failed: API error", error=str(exc))
            return f"prepare {ref.namespace}/{ref.name}: reading the ResourceClaim failed: {exc}"
        if isinstance(exc, DraDriverError):  # refused on purpose: the message is for the user
            log.warning("prepare failed", error=str(exc))
            return f"prepare {ref.namespace}/{ref.name}: {exc}"
        log.exception("prepare failed unexpectedly")
        return f"prepare {ref.namespace}/{ref.name}: internal error: {exc}"

    def unprepare_error(self, ref: ClaimRef, exc: Exception) -> str:
        if isinstance(exc, DraDriverError):
            log.warning("unprepare failed", error=str(exc))
            return f"unprepare {ref.namespace}/{ref.name}: {exc}"
        log.exception("unprepare failed unexpectedly")
        return f"unprepare {ref.namespace}/{ref.name}: internal error: {exc}"

    def prepared(self, ref: ClaimRef, result: PrepareResult, failure: Exception | None, seconds: float) -> None:
        if not result.error:
            log.info("claim prepared", devices=[d.device for d in result.devices], seconds=round(seconds, 4))
        self._observed("prepare", seconds, ok=not result.error)

    def unprepared(self, ref: ClaimRef, error: str, failure: Exception | None, seconds: float) -> None:
        self._observed("unprepare", seconds, ok=not error)

    def _observed(self, operation: str, seconds: float, *, ok: bool) -> None:
        self.metrics.observe(operation, seconds, ok=ok)
        if self.after_operation is not None:
            self.after_operation()


class PrepareEngine(ClaimEngine[ClaimPlan, PreparedDevice, None, Catalog]):
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
        self.gpu_rules = GpuClaimRules(self.parts, self.metrics)
        limits = EngineLimits(settings.lock_timeout, settings.lock_timeout, settings.max_parallel_claims)
        super().__init__(
            self.gpu_rules, effects=effects, store=checkpoint, claims=claims, operations=self.parts.operations,
            locks=self.parts.locks, limits=limits, faults=self.parts.faults,
        )  # fmt: skip
        # The stages bench/prepare_profile.py times, by the names it wraps.
        self._claims, self._checkpoint, self._operations, self._locks = claims, checkpoint, self.operations, self.locks
        self._prepared = PreparedMetrics(self.metrics)
        self.recovery = Recovery(self, self.parts)

    @property
    def after_operation(self) -> Callable[[], None] | None:
        return self.gpu_rules.after_operation

    @after_operation.setter
    def after_operation(self, call: Callable[[], None] | None) -> None:
        self.gpu_rules.after_operation = call

    @property
    def claim_read(self) -> Callable[[str, JsonObject], None] | None:
        return self.gpu_rules.claim_read

    @claim_read.setter
    def claim_read(self, call: Callable[[str, JsonObject], None] | None) -> None:
        self.gpu_rules.claim_read = call

    def checkpoint_written(self, checkpoint: Checkpoint) -> None:
        self.record_prepared(checkpoint)  # each claim change's checkpoint is what the metrics show

    def prepared_claims(self) -> Checkpoint:
        return self.store.load()

    def record_prepared(self, checkpoint: Checkpoint) -> None:
        """Prepared claims, devices by type and MPS daemons in the metrics (cheap: a recorded one is skipped)."""
        self._prepared.record(checkpoint)
