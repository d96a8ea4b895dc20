"""The prepare engine: a per-claim state machine that is idempotent and crash-safe.

    prepare(claim):
      checkpoint says Completed ───────────────────────────────────────► return recorded devices
      GET claim → check UID, allocation → pick our results (driver, pool)
      resolve + validate opaque config
      lock the physical GPUs involved (sorted; other GPUs prepare concurrently)
        refuse devices another claim holds
        roll back a PrepareStarted left by a crash
        checkpoint PrepareStarted (with the allocated devices, so a crash can be rolled back)
        actuate each device (e.g. carve a MIG partition)
        write the claim's CDI spec
        checkpoint PrepareCompleted (with the live identities)
      return CDI ids

    unprepare(claim): the exact inverse, idempotent (an unknown claim is a success).

Each step after the checkpoint write is undone by `rollback`, so a failure or a SIGKILL anywhere leaves
either a completed claim or a PrepareStarted record that the next call (or startup recovery) rolls back.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, replace
from functools import partial
from typing import Any, Protocol, TypeVar

import structlog

from dra_driver.claimconfig.api import ConfigError
from dra_driver.claimconfig.resolve import configs_for_results
from dra_driver.inventory.catalog import AllocatableDevice, DeviceKind
from dra_driver.k8s.client import ApiError, JsonObject
from dra_driver.observability.logging import claim_fields
from dra_driver.observability.metrics import PluginMetrics
from dra_driver.plugin.actuator import DeviceActuator, PrepareError
from dra_driver.plugin.cdi import ClaimSpecWriter, DeviceForCdi
from dra_driver.plugin.checkpoint import (
    Checkpoint,
    CheckpointStore,
    ClaimRecord,
    ClaimState,
    MigRecord,
    PreparedDevice,
)
from dra_driver.plugin.faults import FaultPoints
from dra_driver.plugin.types import ClaimRef, DeviceResult, PrepareResult

log = structlog.get_logger(__name__)
R = TypeVar("R")


class ClaimSource(Protocol):
    def get_claim(self, namespace: str, name: str) -> JsonObject | None:
        """The ResourceClaim, None when it does not exist. Raises ApiError."""


@dataclass(frozen=True)
class EngineSettings:
    driver_name: str
    pool_name: str
    lock_timeout: float = 10.0
    max_parallel_claims: int = 16


class DeviceLocks:
    """One lock per physical GPU, created on demand. Locks are taken in sorted order (no deadlock) with a
    timeout (the kubelet retries a busy claim instead of piling up calls)."""

    def __init__(self) -> None:
        self._locks: dict[str, threading.Lock] = {}
        self._guard = threading.Lock()

    @contextmanager
    def hold(self, keys: Sequence[str], timeout: float) -> Iterator[None]:
        with ExitStack() as stack:
            deadline = time.monotonic() + timeout
            for key in sorted(set(keys)):
                with self._guard:
                    lock = self._locks.setdefault(key, threading.Lock())
                if not lock.acquire(timeout=max(0.0, deadline - time.monotonic())):
                    raise PrepareError(f"GPU {key} is busy with another claim; the kubelet will retry")
                stack.callback(lock.release)
            yield


class PrepareEngine:
    def __init__(
        self,
        *,
        settings: EngineSettings,
        claims: ClaimSource,
        catalog: Callable[[], Mapping[str, AllocatableDevice]],
        actuator: DeviceActuator,
        cdi: ClaimSpecWriter,
        checkpoint: CheckpointStore,
        faults: FaultPoints | None = None,
        metrics: PluginMetrics | None = None,
    ) -> None:
        self.settings = settings
        self.metrics = metrics or PluginMetrics()
        self._claims = claims
        self._catalog = catalog
        self._actuator = actuator
        self._cdi = cdi
        self._checkpoint = checkpoint
        self._faults = faults or FaultPoints()
        self._locks = DeviceLocks()
        self._pool = ThreadPoolExecutor(max_workers=settings.max_parallel_claims, thread_name_prefix="claim")

    def close(self) -> None:
        self._pool.shutdown(wait=True)

    # --- the gRPC-facing API ------------------------------------------------------------------------

    def prepare(self, claims: list[ClaimRef]) -> dict[str, PrepareResult]:
        return dict(zip((c.uid for c in claims), self._pool.map(self._prepare_safely, claims), strict=True))

    def unprepare(self, claims: list[ClaimRef]) -> dict[str, str]:
        return dict(zip((c.uid for c in claims), self._pool.map(self._unprepare_safely, claims), strict=True))

    # --- prepare -----------------------------------------------------------------------------------

    def _observed(
        self, operation: str, ref: ClaimRef, run: Callable[[ClaimRef, float], R], ok: Callable[[R], bool]
    ) -> R:
        """Run one claim's operation with the claim bound in the logging context (so lines logged deeper down,
        in MIG or CDI code, carry it too) and record its outcome and duration in the metrics."""
        started = time.monotonic()
        with structlog.contextvars.bound_contextvars(**claim_fields(ref.namespace, ref.name, ref.uid)):
            result = run(ref, started)
        self.metrics.observe(operation, time.monotonic() - started, ok=ok(result))
        self.metrics.prepared_claims.set(len(self._checkpoint.load().claims))
        return result

    def _prepare_safely(self, ref: ClaimRef) -> PrepareResult:
        return self._observed("prepare", ref, self._prepare_logged, lambda r: not r.error)

    def _prepare_logged(self, ref: ClaimRef, started: float) -> PrepareResult:
        try:
            result = self.prepare_claim(ref)
        except (PrepareError, ConfigError) as exc:
            log.warning("prepare failed", error=str(exc))
            return PrepareResult(error=f"prepare {ref.namespace}/{ref.name}: {exc}")
        except ApiError as exc:
            log.warning("prepare failed: API error", error=str(exc))
            return PrepareResult(error=f"prepare {ref.namespace}/{ref.name}: reading the ResourceClaim failed: {exc}")
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
        existing = self._checkpoint.load().claims.get(ref.uid)
        if existing is not None and existing.state is ClaimState.PREPARE_COMPLETED:
            return _result(existing.devices)

        allocation, allocated = self._our_results(ref, self._claims.get_claim(ref.namespace, ref.name))
        if not allocated:
            return PrepareResult()
        catalog = self._catalog()
        devices = [self._lookup(catalog, r) for r in allocated]
        configs = configs_for_results(
            allocation, self.settings.driver_name, allocated, lambda r: catalog_type(catalog, r)
        )
        planned = tuple(
            PreparedDevice(
                # A firstAvailable result names "<request>/<subrequest>"; containers reference the request.
                request_names=(str(r["request"]).split("/", 1)[0],),
                pool=self.settings.pool_name,
                device=str(r["device"]),
                share_id=r.get("shareID"),
                gpu_uuid=d.gpu.uuid,
                mig=_mig_spec(d),
            )
            for r, d in zip(allocated, devices, strict=True)
        )
        admin = {str(r["device"]) for r in allocated if r.get("adminAccess")}

        with self._locks.hold([d.gpu.uuid for d in devices], self.settings.lock_timeout):
            checkpoint = self._checkpoint.load()
            current = checkpoint.claims.get(ref.uid)
            if current is not None and current.state is ClaimState.PREPARE_COMPLETED:
                return _result(current.devices)  # a concurrent call finished it while we waited
            _refuse_overlap(ref, devices, admin, checkpoint, catalog)
            if current is not None:
                self._rollback(current)
            self._checkpoint.update(
                lambda cp: cp.with_claim(
                    ClaimRecord(ref.uid, ref.namespace, ref.name, ClaimState.PREPARE_STARTED, allocated=planned)
                )
            )
            self._faults.reached("prepare:after-checkpoint-started")
            try:
                prepared = self._actuate(ref, devices, configs, planned)
                self._faults.reached("prepare:after-devices")
                cdi_ids = self._cdi.write(ref.uid, [cdi for _, cdi in prepared])
                self._faults.reached("prepare:after-cdi")
            except BaseException:
                self._rollback_started(ref)
                raise
            done = tuple(
                PreparedDevice(
                    request_names=p.request_names,
                    pool=p.pool,
                    device=p.device,
                    cdi_device_ids=(cdi_ids[p.device],),
                    share_id=p.share_id,
                    gpu_uuid=p.gpu_uuid,
                    mig=p.mig,
                    sharing=p.sharing,
                )
                for p, _ in prepared
            )
            self._checkpoint.update(
                lambda cp: cp.with_claim(
                    ClaimRecord(
                        ref.uid, ref.namespace, ref.name, ClaimState.PREPARE_COMPLETED, devices=done, allocated=planned
                    )
                )
            )
            self._faults.reached("prepare:after-checkpoint-completed")
            return _result(done)

    def _our_results(self, ref: ClaimRef, claim: JsonObject | None) -> tuple[JsonObject, list[JsonObject]]:
        if claim is None:
            raise PrepareError("the ResourceClaim does not exist (deleted?)")
        uid = claim.get("metadata", {}).get("uid")
        if uid != ref.uid:
            raise PrepareError(f"the ResourceClaim has UID {uid}, not {ref.uid}: it was deleted and re-created")
        allocation = (claim.get("status") or {}).get("allocation")
        if not allocation:
            raise PrepareError("the ResourceClaim is not allocated")
        results = (allocation.get("devices") or {}).get("results") or []
        ours = [
            r
            for r in results
            if r.get("driver") == self.settings.driver_name and r.get("pool") == self.settings.pool_name
        ]
        return allocation, ours

    def _lookup(self, catalog: Mapping[str, AllocatableDevice], result: JsonObject) -> AllocatableDevice:
        name = str(result.get("device"))
        device = catalog.get(name)
        if device is None:
            raise PrepareError(
                f"device {name!r} (request {result.get('request')!r}) is not offered by pool "
                f"{self.settings.pool_name!r}; the allocation is stale or the GPU disappeared"
            )
        return device

    def _actuate(
        self,
        ref: ClaimRef,
        devices: Sequence[AllocatableDevice],
        configs: Sequence[Any],
        planned: Sequence[PreparedDevice],
    ) -> list[tuple[PreparedDevice, DeviceForCdi]]:
        prepared = []
        for device, config, plan in zip(devices, configs, planned, strict=True):
            hw = self._actuator.prepare(ref, device, config, partial(self._record_created, ref.uid, plan.device))
            record = PreparedDevice(
                request_names=plan.request_names,
                pool=plan.pool,
                device=plan.device,
                share_id=plan.share_id,
                gpu_uuid=hw.gpu_uuid,
                mig=hw.mig,
                sharing=str(config.sharing.strategy),
            )
            cdi = DeviceForCdi(
                allocatable=device,
                visible_uuid=hw.visible_uuid,
                sharing=str(config.sharing.strategy),
                request_names=plan.request_names,
                gpu_instance_id=hw.mig.gpu_instance_id if hw.mig else None,
                compute_instance_id=hw.mig.compute_instance_id if hw.mig else None,
            )
            prepared.append((record, cdi))
        return prepared

    def _record_created(self, uid: str, device_name: str, mig: MigRecord) -> None:
        """Name a just-created MIG instance in the PrepareStarted record (so rollback removes exactly it)."""

        def change(cp: Checkpoint) -> Checkpoint:
            record = cp.claims[uid]
            allocated = tuple(replace(d, mig=mig) if d.device == device_name else d for d in record.allocated)
            return cp.with_claim(replace(record, allocated=allocated))

        self._checkpoint.update(change)

    # --- unprepare ---------------------------------------------------------------------------------

    def _unprepare_safely(self, ref: ClaimRef) -> str:
        return self._observed("unprepare", ref, self._unprepare_logged, lambda error: not error)

    def _unprepare_logged(self, ref: ClaimRef, started: float) -> str:
        try:
            released = self.unprepare_claim(ref)
        except PrepareError as exc:
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
        gpus = [d.gpu_uuid for d in (*record.devices, *record.allocated) if d.gpu_uuid]
        with self._locks.hold(gpus, self.settings.lock_timeout):
            record = self._checkpoint.load().claims.get(ref.uid)
            if record is None:
                return False
            if record.state is ClaimState.PREPARE_COMPLETED:
                for device in record.devices:
                    self._actuator.release(device)
            else:
                for device in record.allocated:
                    self._actuator.rollback(device)
            self._faults.reached("unprepare:after-devices")
            self._cdi.remove(ref.uid)
            self._faults.reached("unprepare:after-cdi")
            self._checkpoint.update(lambda cp: cp.without_claim(ref.uid))
            self._faults.reached("unprepare:after-checkpoint")
        return True

    # --- recovery ----------------------------------------------------------------------------------

    def _rollback(self, record: ClaimRecord) -> None:
        for device in record.allocated:
            self._actuator.rollback(device)
        self._cdi.remove(record.uid)

    def _rollback_started(self, ref: ClaimRef) -> None:
        record = self._checkpoint.load().claims.get(ref.uid)
        if record is None or record.state is not ClaimState.PREPARE_STARTED:
            return
        try:
            self._rollback(record)
        except Exception:
            # Keep the PrepareStarted record: the next call or startup recovery tries again.
            log.exception("rollback after a failed prepare failed", **claim_fields(ref.namespace, ref.name, ref.uid))
            return
        self._checkpoint.update(lambda cp: cp.without_claim(ref.uid))

    def recover(self) -> list[str]:
        """At startup: roll back every claim a crash left half-prepared; delete CDI specs of claims we do
        not know. Returns the UIDs rolled back."""
        checkpoint = self._checkpoint.load()
        rolled_back = []
        for record in checkpoint.claims.values():
            if record.state is ClaimState.PREPARE_STARTED:
                ref = ClaimRef(record.namespace, record.name, record.uid)
                self.unprepare_claim(ref)
                rolled_back.append(record.uid)
                log.info("rolled back a claim left half-prepared", **claim_fields(ref.namespace, ref.name, ref.uid))
        known = set(self._checkpoint.load().claims)
        for uid in sorted(self._cdi.claim_uids_on_disk() - known):
            self._cdi.remove(uid)
            log.info("removed an orphaned CDI spec", claim_uid=uid)
        return rolled_back

    def cleanup_stale(self) -> list[str]:
        """Unprepare claims whose ResourceClaim is gone or was re-created (another UID). API errors leave
        the claim alone until the next round."""
        stale = []
        for record in list(self._checkpoint.load().claims.values()):
            try:
                claim = self._claims.get_claim(record.namespace, record.name)
            except ApiError as exc:
                log.warning("stale-claim check skipped: API error", error=str(exc), claim_uid=record.uid)
                continue
            if claim is not None and claim.get("metadata", {}).get("uid") == record.uid:
                continue
            ref = ClaimRef(record.namespace, record.name, record.uid)
            if not self._unprepare_safely(ref):
                stale.append(record.uid)
                log.info(
                    "unprepared a claim whose ResourceClaim is gone", **claim_fields(ref.namespace, ref.name, ref.uid)
                )
        return stale

    def prepared_claims(self) -> Checkpoint:
        return self._checkpoint.load()


def _mig_spec(device: AllocatableDevice) -> MigRecord | None:
    """What a dynamic MIG device will be (its live ids come later): enough to find and roll it back."""
    if device.kind is not DeviceKind.MIG_DYNAMIC or device.profile is None or device.placement is None:
        return None
    return MigRecord(device.gpu.uuid, device.profile.id, device.placement.start, device.placement.size)


def owned_mig_instances(checkpoint: Checkpoint) -> set[tuple[str, int]]:
    """(parent UUID, GPU instance id) of every MIG instance a completed claim holds."""
    return {
        (d.mig.parent_uuid, d.mig.gpu_instance_id)
        for rec in checkpoint.claims.values()
        if rec.state is ClaimState.PREPARE_COMPLETED
        for d in rec.devices
        if d.mig is not None and d.mig.gpu_instance_id is not None
    }


def catalog_type(catalog: Mapping[str, AllocatableDevice], result: Mapping[str, Any]) -> str:
    device = catalog.get(str(result.get("device")))
    return device.kind.type_attribute if device else "gpu"


def _result(devices: Sequence[PreparedDevice]) -> PrepareResult:
    return PrepareResult(
        devices=tuple(
            DeviceResult(
                request_names=d.request_names,
                pool=d.pool,
                device=d.device,
                cdi_device_ids=d.cdi_device_ids,
                share_id=d.share_id,
            )
            for d in devices
        )
    )


def _refuse_overlap(
    ref: ClaimRef,
    devices: Sequence[AllocatableDevice],
    admin: set[str],
    checkpoint: Checkpoint,
    catalog: Mapping[str, AllocatableDevice],
) -> None:
    """The last line of defence against a double allocation: a device (or an overlapping MIG partition of the
    same GPU) already prepared for another claim is refused, naming both claims."""
    for other in checkpoint.claims.values():
        if other.uid == ref.uid:
            continue
        for held in (*other.devices, *other.allocated):
            if held.share_id is not None:
                continue
            for device in devices:
                if device.name in admin:
                    continue
                if _collides(device, held, catalog):
                    raise PrepareError(
                        f"device {device.name} is already prepared for claim {other.namespace}/{other.name} "
                        f"(uid {other.uid}); refusing to prepare it for {ref.namespace}/{ref.name} (uid {ref.uid})"
                    )


def _collides(device: AllocatableDevice, held: PreparedDevice, catalog: Mapping[str, AllocatableDevice]) -> bool:
    if device.name == held.device:
        return True
    other = catalog.get(held.device)
    if other is None or other.gpu.uuid != device.gpu.uuid:
        return False
    if device.placement is None or other.placement is None:
        # A whole GPU collides with any partition of it (only possible with dynamic MIG).
        return device.partitioned and other.partitioned
    return device.placement.overlaps(other.placement)
