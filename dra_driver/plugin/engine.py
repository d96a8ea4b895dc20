"""The prepare engine: a per-claim state machine that is idempotent and crash-safe.

    prepare(claim):
      checkpoint says Completed ──► verify what it recorded (CDI spec bytes, MIG instance identity) ──► return
                                      └─ damaged: repair it (re-create the instance at the same placement,
                                         rewrite the spec) under the GPU locks, then return
      GET claim → check UID, allocation → pick our results (driver, pool)
      resolve + validate opaque config
      lock the physical GPUs involved (sorted; other GPUs prepare concurrently)
        refuse devices another claim holds
        undo a PrepareStarted / UnprepareStarted left by a crash
        checkpoint PrepareStarted (with the allocated devices, so a crash can be rolled back)
        actuate each device (e.g. carve a MIG partition)
        set the time-slice of each whole GPU whose config is TimeSlicing (plugin/sharing.py)
        start (or re-limit) the MPS daemon of the claim's MPS devices or GPU shares (plugin/mps.py)
        write the claim's CDI spec
        checkpoint PrepareCompleted (with the live identities)
      return CDI ids

    unprepare(claim): checkpoint UnprepareStarted → stop an MPS daemon no other record holds (or re-limit it to
      the shares left) → release each device by its full recorded identity (and reset a time-slice no other
      record holds) → remove the CDI spec → drop the record. Idempotent (an unknown claim is a success).

Each step after a checkpoint write is undone or finished by the next call or by startup recovery: a
PrepareStarted record is rolled back, an UnprepareStarted record is released to the end (never repaired back).
Startup recovery (`recover`) also rebuilds ownership from what exists when the checkpoint was lost or corrupt,
verifies and repairs every completed claim, and sweeps crash leftovers it can prove are its own.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, replace
from functools import partial
from typing import Any, TypeVar

import structlog

from dra_driver.claimconfig.api import DeviceConfig
from dra_driver.claimconfig.resolve import configs_for_results
from dra_driver.errors import DraDriverError
from dra_driver.inventory.catalog import AllocatableDevice, DeviceKind, supports_mig_toggle
from dra_driver.k8s.client import ApiError, JsonObject
from dra_driver.kubeletplugin.claims import ClaimSource
from dra_driver.kubeletplugin.driver import ClaimRef, DeviceResult, PrepareResult
from dra_driver.kubeletplugin.names import InvalidNameError
from dra_driver.kubeletplugin.statedirs import OPERATION_LOCK_NAME, OperationLock
from dra_driver.observability.logging import claim_fields
from dra_driver.observability.metrics import PluginMetrics
from dra_driver.plugin.actuator import DeviceActuator, PrepareError
from dra_driver.plugin.cdi import ClaimSpecWriter, DeviceForCdi, MpsClient
from dra_driver.plugin.checkpoint import (
    Checkpoint,
    CheckpointStore,
    ClaimRecord,
    ClaimState,
    MigRecord,
    MpsRecord,
    PreparedDevice,
)
from dra_driver.plugin.faults import FaultPoints
from dra_driver.plugin.mps import Holder, MpsDaemons, daemon_spec, mps_records, share_env, whole_gpus
from dra_driver.plugin.mps import holders as mps_holders
from dra_driver.plugin.ownership import AllocatedClaim, RecoveryReport, claims_allocated_here, reserved_placements
from dra_driver.plugin.sharing import TimeSlicer, holders, time_slicing_notes, wanted_time_slice

log = structlog.get_logger(__name__)
R = TypeVar("R")


@dataclass(frozen=True)
class EngineSettings:
    driver_name: str
    pool_name: str
    lock_timeout: float = 10.0
    max_parallel_claims: int = 64
    # Recovery holds the node's operation lock exclusively: wait this long for in-flight claims (of any plugin
    # instance on the node) to finish.
    recovery_lock_timeout: float = 120.0


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


@dataclass(frozen=True)
class _Plan:
    """What a claim's allocation asks of this node, before anything is touched."""

    devices: tuple[AllocatableDevice, ...]
    configs: tuple[DeviceConfig, ...]
    planned: tuple[PreparedDevice, ...]
    admin: frozenset[str]  # devices requested with adminAccess


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
        operation_lock: OperationLock | None = None,
        time_slicer: TimeSlicer | None = None,
        mps: MpsDaemons | None = None,
    ) -> None:
        self.settings = settings
        self.metrics = metrics or PluginMetrics()
        self._claims = claims
        self._catalog = catalog
        self._actuator = actuator
        self._cdi = cdi
        self._checkpoint = checkpoint
        self._faults = faults or FaultPoints()
        self._time_slicer = time_slicer  # None: TimeSlicing configs are refused as not enabled
        self._mps = mps  # None: MPS configs and GPU shares are refused as not enabled
        self._locks = DeviceLocks()
        self._pool = ThreadPoolExecutor(max_workers=settings.max_parallel_claims, thread_name_prefix="claim")
        # Claim operations hold it shared, recovery exclusive, across every plugin instance of the node.
        self._operations = operation_lock or OperationLock(checkpoint.path.with_name(OPERATION_LOCK_NAME))
        # Set while ownership was lost and could not be rebuilt yet (API unreachable): retried by `reconcile`.
        self._pending_rebuild: str | None = None
        self._recovery_lock = threading.Lock()
        self.after_operation: Callable[[], None] | None = None  # e.g. wake the usage sampler
        self._recorded: Checkpoint | None = None  # the checkpoint `record_prepared` last put in the metrics
        self._recording = threading.Lock()
        # Called with each ResourceClaim a prepare read (e.g. the usage sampler learns its pod without a GET).
        self.claim_read: Callable[[str, JsonObject], None] | None = None

    def close(self) -> None:
        self._pool.shutdown(wait=True)
        self._operations.close()

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
        with contextlib.suppress(DraDriverError):  # an unreadable checkpoint is reported in the claim's error
            self.record_prepared(self._checkpoint.load())
        if self.after_operation is not None:
            self.after_operation()
        return result

    def record_prepared(self, checkpoint: Checkpoint) -> None:
        """Prepared claims, devices by type and MPS daemons in the metrics (from the cached checkpoint: cheap). The
        checkpoint is immutable: one already recorded is skipped (concurrent claims often finish on the same one,
        and counting every record per operation made a burst of claims quadratic)."""
        with self._recording:
            if checkpoint is self._recorded:
                return
            done = [r for r in checkpoint.claims.values() if r.state is ClaimState.PREPARE_COMPLETED]
            devices = {"gpu": 0, "mig": 0, "share": 0}
            daemons: set[str] = set()
            for record in done:
                for device in record.devices:
                    devices[prepared_type(device)] += 1
                    if device.mps is not None:
                        daemons.add(device.mps.daemon)
            self.metrics.set_prepared(len(done), devices, len(daemons))
            self._recorded = checkpoint

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
        existing = self._checkpoint.load().claims.get(ref.uid)
        if existing is not None and existing.state is ClaimState.PREPARE_COMPLETED:
            # The checkpoint is a record, not proof: what it returns must still exist as recorded.
            if not self._damage(existing):
                return _result(existing.devices)
            repaired = self.repair_claim(ref.uid)
            if repaired is not None:
                return _result(repaired.devices)
            # The record changed state meanwhile (a concurrent unprepare): prepare from scratch.

        claim = self._claims.get_claim(ref.namespace, ref.name)
        allocation, allocated = self._our_results(ref, claim)
        if claim is not None and self.claim_read is not None:
            self.claim_read(ref.uid, claim)
        if not allocated:
            return PrepareResult()
        catalog = self._catalog()
        plan = self._plan(ref.uid, allocation, allocated, catalog)

        with self._locks.hold([d.gpu.uuid for d in plan.devices], self.settings.lock_timeout):
            checkpoint = self._checkpoint.load()
            current = checkpoint.claims.get(ref.uid)
            if current is not None and current.state is ClaimState.PREPARE_COMPLETED:
                return _result(current.devices)  # a concurrent call finished it while we waited
            _refuse_overlap(ref, plan.devices, plan.admin, checkpoint, catalog)
            _refuse_other_time_slice(ref, plan.planned, checkpoint)
            if current is not None:
                self._undo(current)
            # PrepareStarted is what lets a crash be rolled back: it must be durable before the hardware changes.
            # A claim that changes nothing on the hardware (whole GPUs and static MIG devices, used exclusively)
            # has nothing to roll back but its CDI spec, which recovery removes as an orphan: one fsynced write
            # fewer on the most common prepare.
            started = current is not None or not _hardware_untouched(plan)
            if started:
                self._checkpoint.update(
                    lambda cp: cp.with_claim(
                        ClaimRecord(
                            ref.uid, ref.namespace, ref.name, ClaimState.PREPARE_STARTED, allocated=plan.planned
                        )
                    )
                )
            self._faults.reached("prepare:after-checkpoint-started")
            try:
                prepared = self._actuate(ref, plan, allocated)
                self._apply_time_slices(plan.planned)
                self._ensure_mps(ref, [p for p, _ in prepared])
                self._faults.reached("prepare:after-devices")
                cdi_ids = self._cdi.write(ref.uid, [cdi for _, cdi in prepared])
                self._faults.reached("prepare:after-cdi")
            except BaseException:
                if started:
                    self._rollback_started(ref)
                else:
                    with contextlib.suppress(Exception):  # recovery removes an orphan spec otherwise
                        self._cdi.remove(ref.uid)
                raise
            done = tuple(replace(p, cdi_device_ids=(cdi_ids[p.device],)) for p, _ in prepared)
            self._checkpoint.update(
                lambda cp: cp.with_claim(
                    ClaimRecord(
                        ref.uid,
                        ref.namespace,
                        ref.name,
                        ClaimState.PREPARE_COMPLETED,
                        devices=done,
                        allocated=plan.planned,
                    )
                )
            )
            self._faults.reached("prepare:after-checkpoint-completed")
            return replace(_result(done), notes=time_slicing_notes(plan.devices, plan.configs))

    def _plan(
        self,
        claim_uid: str,
        allocation: JsonObject,
        allocated: Sequence[JsonObject],
        catalog: Mapping[str, AllocatableDevice],
    ) -> _Plan:
        devices = tuple(self._lookup(catalog, r) for r in allocated)
        configs = tuple(
            configs_for_results(allocation, self.settings.driver_name, allocated, lambda r: catalog_type(catalog, r))
        )
        mps = self._mps_records(claim_uid, devices, configs, allocated, [_known_uuid(d) for d in devices])
        planned = tuple(
            PreparedDevice(
                # A firstAvailable result names "<request>/<subrequest>"; containers reference the request.
                request_names=(str(r["request"]).split("/", 1)[0],),
                pool=self.settings.pool_name,
                device=str(r["device"]),
                share_id=r.get("shareID"),
                gpu_uuid=d.gpu.uuid,
                mig=_mig_spec(d),
                time_slice=self._wanted_time_slice(d, c),
                mps=m,
            )
            for r, d, c, m in zip(allocated, devices, configs, mps, strict=True)
        )
        admin = frozenset(str(r["device"]) for r in allocated if r.get("adminAccess"))
        return _Plan(devices, configs, planned, admin)

    def _our_results(self, ref: ClaimRef, claim: JsonObject | None) -> tuple[JsonObject, list[JsonObject]]:
        """The allocation and its results for our driver and pool. The object comes from the API server, so every
        level is type-checked: a malformed one fails the claim naming the field instead of an internal error."""
        if claim is None:
            raise PrepareError("the ResourceClaim does not exist (deleted?)")
        metadata = claim.get("metadata")
        uid = metadata.get("uid") if isinstance(metadata, dict) else None
        if uid != ref.uid:
            raise PrepareError(f"the ResourceClaim has UID {uid}, not {ref.uid}: it was deleted and re-created")
        status = claim.get("status")
        allocation = status.get("allocation") if isinstance(status, dict) else None
        if not allocation:
            raise PrepareError("the ResourceClaim is not allocated")
        if not isinstance(allocation, dict):
            raise PrepareError("status.allocation of the ResourceClaim is not an object")
        devices = allocation.get("devices") or {}
        results = devices.get("results") if isinstance(devices, dict) else None
        if not isinstance(results, list | None):
            raise PrepareError("status.allocation.devices.results of the ResourceClaim is not a list")
        ours = []
        for i, result in enumerate(results or ()):
            if not isinstance(result, dict):
                raise PrepareError(f"status.allocation.devices.results[{i}] of the ResourceClaim is not an object")
            if result.get("driver") != self.settings.driver_name or result.get("pool") != self.settings.pool_name:
                continue
            for field in ("request", "device"):
                if not isinstance(result.get(field), str) or not result[field]:
                    raise PrepareError(f"status.allocation.devices.results[{i}].{field}: must be a non-empty string")
            ours.append(result)
        return allocation, ours

    def _mps_records(
        self,
        claim_uid: str,
        devices: Sequence[AllocatableDevice],
        configs: Sequence[DeviceConfig],
        results: Sequence[JsonObject],
        uuids: Sequence[str | None],
    ) -> tuple[MpsRecord | None, ...]:
        records = mps_records(devices, configs, results, uuids, claim_uid, self.settings.driver_name)
        if self._mps is None and any(r is not None for r in records):
            raise PrepareError(
                "MPS (sharing strategy MPS, or a share of a GPU) is not enabled on this node; use strategy Exclusive "
                "or remove the sharing config"
            )
        return records

    def _ensure_mps(self, ref: ClaimRef, devices: Sequence[PreparedDevice]) -> None:
        """Start the MPS daemon(s) the claim's devices name, or re-limit a running one to its holders (every other
        record that names it, and this claim's devices)."""
        if self._mps is None:
            return
        claims = self._checkpoint.load().claims.values()
        for daemon in sorted({d.mps.daemon for d in devices if d.mps is not None}):
            held = mps_holders(claims, daemon, excluding=ref.uid) + [
                Holder(f"{ref.namespace}/{ref.name}", d)
                for d in devices
                if d.mps is not None and d.mps.daemon == daemon
            ]
            self._mps.ensure(daemon_spec(self._mps.root, daemon, held), whole_gpus(held))

    def _release_mps(self, record: ClaimRecord) -> None:
        """Before the devices are released (a MIG instance cannot be destroyed while an MPS server holds it): stop
        each daemon no other record holds, or re-limit it to the holders left."""
        if self._mps is None:
            return
        devices = record.allocated if record.state is ClaimState.PREPARE_STARTED else record.devices
        claims = self._checkpoint.load().claims.values()
        for daemon in sorted({d.mps.daemon for d in devices if d.mps is not None}):
            left = mps_holders(claims, daemon, excluding=record.uid)
            if left:
                self._mps.ensure(daemon_spec(self._mps.root, daemon, left), whole_gpus(left))
                continue
            mine = whole_gpus(_held("", devices, daemon))
            self._mps.release(daemon, sorted({*mine, *self._mps.recorded_gpus(daemon)}))

    def _mps_problems(self, uid: str, devices: Sequence[PreparedDevice]) -> list[str]:
        if self._mps is None:
            return []
        claims = self._checkpoint.load().claims.values()
        problems = []
        for daemon in sorted({d.mps.daemon for d in devices if d.mps is not None}):
            held = mps_holders(claims, daemon, excluding=uid) + _held("", devices, daemon)
            problems += self._mps.problems(daemon_spec(self._mps.root, daemon, held), whole_gpus(held))
        return problems

    def _sweep_unowned_mps(self) -> list[str]:
        """Recovery, with ownership known: MPS daemons whose directory no record names (a lost checkpoint, or a
        crash between the last record going and the directory going) are stopped and their GPUs reset."""
        if self._mps is None:
            return []
        claims = list(self._checkpoint.load().claims.values())
        swept = []
        for daemon in self._mps.on_disk():
            if mps_holders(claims, daemon):
                continue
            try:
                self._mps.release(daemon, self._mps.recorded_gpus(daemon))
            except DraDriverError as exc:
                log.warning("stopping an MPS daemon no claim holds failed", daemon=daemon, error=str(exc))
                continue
            swept.append(daemon)
            log.info("stopped an MPS daemon no claim holds", daemon=daemon)
        return swept

    def _mps_client(self, device: PreparedDevice) -> MpsClient | None:
        if device.mps is None or self._mps is None:
            return None
        spec = daemon_spec(self._mps.root, device.mps.daemon, ())
        return MpsClient(spec.pipe_directory, spec.shm_directory, share_env(device))

    def _wanted_time_slice(self, device: AllocatableDevice, config: DeviceConfig) -> str | None:
        interval = wanted_time_slice(device, config)
        if interval is not None and self._time_slicer is None:
            raise PrepareError(
                f"sharing strategy TimeSlicing ({config.kind}) is not enabled on this node; "
                "use strategy Exclusive or remove the sharing config"
            )
        return interval

    def _apply_time_slices(self, planned: Sequence[PreparedDevice]) -> None:
        """Set the time-slice of every GPU a device asks one for (recorded in PrepareStarted beforehand)."""
        for device in planned:
            if device.time_slice is not None and device.gpu_uuid is not None:
                assert self._time_slicer is not None  # refused in _plan otherwise
                self._time_slicer.apply(device.gpu_uuid, device.device, device.time_slice)

    def _release_time_slices(self, record: ClaimRecord) -> None:
        """Reset a GPU to the Default time-slice once no other record holds a time-slice on it."""
        if self._time_slicer is None:
            return
        devices = record.allocated if record.state is ClaimState.PREPARE_STARTED else record.devices
        gpus = sorted({d.gpu_uuid for d in devices if d.time_slice is not None and d.gpu_uuid is not None})
        claims = self._checkpoint.load().claims.values()
        for gpu in gpus:
            if not holders(claims, gpu, excluding=record.uid):
                self._time_slicer.reset(gpu, set_by_us=True)

    def _reset_unowned_time_slices(self) -> list[str]:
        """Recovery, with ownership known: whole GPUs at a non-default time-slice that no record holds (left
        behind by a lost checkpoint) go back to Default."""
        if self._time_slicer is None:
            return []
        claims = self._checkpoint.load().claims.values()
        gpus = sorted({d.gpu.uuid for d in self._catalog().values() if d.kind.whole_gpu})
        reset = []
        for gpu in gpus:
            if holders(claims, gpu, excluding=""):
                continue
            try:
                if self._time_slicer.reset(gpu):
                    reset.append(gpu)
                    log.info("reset a time-slice no claim holds", gpu_uuid=gpu)
            except DraDriverError as exc:
                log.warning("resetting a time-slice no claim holds failed", gpu_uuid=gpu, error=str(exc))
        return reset

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
        self, ref: ClaimRef, plan: _Plan, results: Sequence[JsonObject]
    ) -> list[tuple[PreparedDevice, DeviceForCdi]]:
        actuated = []
        for device, config, planned in zip(plan.devices, plan.configs, plan.planned, strict=True):
            hw = self._actuator.prepare(ref, device, config, partial(self._record_created, ref.uid, planned.device))
            sharing = "MPS" if planned.mps is not None else str(config.sharing.strategy)
            actuated.append((replace(planned, gpu_uuid=hw.gpu_uuid, mig=hw.mig, sharing=sharing), hw.visible_uuid))
        # What each device is to CUDA is known now (a dynamic MIG device has its UUID): the MPS limits keyed by UUID
        # resolve, and the daemon serves exactly these UUIDs.
        mps = self._mps_records(ref.uid, plan.devices, plan.configs, results, [uuid for _, uuid in actuated])
        prepared = []
        for device, (record, uuid), limits in zip(plan.devices, actuated, mps, strict=True):
            record = replace(record, mps=limits)
            prepared.append((record, _cdi_device(device, record, uuid, self._mps_client(record))))
        return prepared

    def _record_created(self, uid: str, device_name: str, mig: MigRecord) -> None:
        """Name a just-created MIG instance in the PrepareStarted record (so rollback removes exactly it)."""

        def change(cp: Checkpoint) -> Checkpoint:
            record = cp.claims[uid]
            allocated = tuple(replace(d, mig=mig) if d.device == device_name else d for d in record.allocated)
            return cp.with_claim(replace(record, allocated=allocated))

        self._checkpoint.update(change)

    # --- verification and repair of prepared claims -------------------------------------------------

    def _damage(self, record: ClaimRecord) -> list[str]:
        """What no longer matches the record of a completed claim: its CDI spec (must hold exactly the bytes we
        would write now) and each device's hardware state (a MIG instance with the recorded identity)."""
        problems = [p for p in (self._actuator.verify(d) for d in record.devices) if p is not None]
        problems += self._time_slice_problems(record.devices)
        problems += self._mps_problems(record.uid, record.devices)
        cdi_devices = self._cdi_devices(record.devices, self._catalog())
        if cdi_devices is None:
            # A device left the catalog (GPU gone): the spec cannot be re-rendered, only checked to exist.
            if not self._cdi.spec_path(record.uid).is_file():
                problems.append(f"CDI spec {self._cdi.spec_path(record.uid)} is missing")
        else:
            spec_problem = self._cdi.problem(record.uid, cdi_devices)
            if spec_problem is not None:
                problems.append(spec_problem)
        return problems

    def _time_slice_problems(self, devices: Sequence[PreparedDevice]) -> list[str]:
        problems = []
        for device in devices:
            if device.time_slice is None or device.gpu_uuid is None or self._time_slicer is None:
                continue
            now = self._time_slicer.current(device.gpu_uuid)
            if now is not None and now != device.time_slice:
                problems.append(f"GPU {device.device} runs time-slice {now}, recorded {device.time_slice}")
        return problems

    def repair_claim(self, uid: str) -> ClaimRecord | None:
        """Verify a completed claim under its GPU locks and make again whatever is missing. Returns the record
        as it is afterwards, or None when the claim is not (any more) completed. Raises PrepareError when the
        repair is impossible; the record is then left as it was."""
        record = self._checkpoint.load().claims.get(uid)
        if record is None or record.state is not ClaimState.PREPARE_COMPLETED:
            return None
        with self._locks.hold(_gpus(record), self.settings.lock_timeout):
            record = self._checkpoint.load().claims.get(uid)
            if record is None or record.state is not ClaimState.PREPARE_COMPLETED:
                return None
            problems = self._damage(record)
            if not problems:
                return record
            log.warning(
                "a prepared claim no longer matches its record; repairing it",
                problems=problems,
                **claim_fields(record.namespace, record.name, record.uid),
            )
            return self._repair(record)

    def _repair(self, record: ClaimRecord) -> ClaimRecord:
        """Called with the claim's GPU locks. Hardware first (each re-created instance is recorded the moment it
        exists, like a first prepare), then the spec; the CDI ids stay the same, so the kubelet's copy stays valid."""
        catalog = self._catalog()
        gone = [d.device for d in record.devices if d.device not in catalog]
        if gone:
            raise PrepareError(
                f"the prepared claim cannot be repaired: device(s) {', '.join(gone)} are no longer offered by this "
                "node (GPU lost or re-configured?); delete the pod so that the claim is released and allocated again"
            )
        devices = list(record.devices)
        for i, device in enumerate(devices):
            problem = self._actuator.verify(device)
            if problem is None:
                continue
            self._actuator.release(device)  # whatever is left of it, by its recorded identity only
            hw = self._actuator.recreate(
                catalog[device.device], partial(self._record_repaired, record.uid, device.device)
            )
            devices[i] = replace(device, gpu_uuid=hw.gpu_uuid, mig=hw.mig)
            self._set_device(record.uid, devices[i])
            log.info("re-created a prepared device", device=device.device, problem=problem)
        if self._time_slice_problems(devices):
            self._apply_time_slices(devices)
        if self._mps_problems(record.uid, devices):
            self._ensure_mps(ClaimRef(record.namespace, record.name, record.uid), devices)
        cdi_devices = self._cdi_devices(devices, catalog)
        assert cdi_devices is not None  # every device is in the catalog (checked above)
        self._cdi.write(record.uid, cdi_devices)
        return replace(record, devices=tuple(devices))

    def _record_repaired(self, uid: str, device_name: str, mig: MigRecord) -> None:
        """Name a re-created MIG instance in the completed record the moment it exists."""
        record = self._checkpoint.load().claims.get(uid)
        if record is not None:
            device = next(d for d in record.devices if d.device == device_name)
            self._set_device(uid, replace(device, mig=mig))

    def _set_device(self, uid: str, device: PreparedDevice) -> None:
        def swap(devices: tuple[PreparedDevice, ...]) -> tuple[PreparedDevice, ...]:
            return tuple(device if d.device == device.device else d for d in devices)

        def change(cp: Checkpoint) -> Checkpoint:
            record = cp.claims[uid]
            return cp.with_claim(replace(record, devices=swap(record.devices), allocated=swap(record.allocated)))

        self._checkpoint.update(change)

    def _cdi_devices(
        self, devices: Sequence[PreparedDevice], catalog: Mapping[str, AllocatableDevice]
    ) -> list[DeviceForCdi] | None:
        """The CDI layer's view of recorded devices (None if one is no longer in the catalog)."""
        out = []
        for device in devices:
            allocatable = catalog.get(device.device)
            if allocatable is None:
                return None
            out.append(_cdi_device(allocatable, device, _visible_uuid(allocatable, device), self._mps_client(device)))
        return out

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
        with self._locks.hold(_gpus(record), self.settings.lock_timeout):
            record = self._checkpoint.load().claims.get(ref.uid)
            if record is None:
                return False
            # A completed claim with nothing on the hardware to release skips UnprepareStarted and the device undo:
            # the spec goes first, then the record (a crash in between leaves a completed record without its spec,
            # which recovery writes again; no hardware is "repaired back"). Two durable writes instead of three.
            if not (record.state is ClaimState.PREPARE_COMPLETED and _releases_nothing(record)):
                if record.state is ClaimState.PREPARE_COMPLETED:
                    # Recorded before anything is released: a crash from here on finishes the release at startup
                    # instead of finding a "damaged" claim and repairing it back.
                    record = replace(record, state=ClaimState.UNPREPARE_STARTED)
                    self._checkpoint.update(
                        lambda cp: cp.with_claim(replace(cp.claims[ref.uid], state=ClaimState.UNPREPARE_STARTED))
                    )
                self._undo_devices(record)
            self._faults.reached("unprepare:after-devices")
            self._cdi.remove(ref.uid)
            self._faults.reached("unprepare:after-cdi")
            self._checkpoint.update(lambda cp: cp.without_claim(ref.uid))
            self._faults.reached("unprepare:after-checkpoint")
        return True

    # --- undoing -----------------------------------------------------------------------------------

    def _undo_devices(self, record: ClaimRecord) -> None:
        self._release_mps(record)
        if record.state is ClaimState.PREPARE_STARTED:
            for device in record.allocated:
                self._actuator.rollback(device)
        else:
            for device in record.devices:
                self._actuator.release(device)
        self._release_time_slices(record)

    def _undo(self, record: ClaimRecord) -> None:
        self._undo_devices(record)
        self._cdi.remove(record.uid)

    def _rollback_started(self, ref: ClaimRef) -> None:
        record = self._checkpoint.load().claims.get(ref.uid)
        if record is None or record.state is not ClaimState.PREPARE_STARTED:
            return
        try:
            self._undo(record)
        except Exception:
            # Keep the PrepareStarted record: the next call or startup recovery tries again.
            log.exception("rollback after a failed prepare failed", **claim_fields(ref.namespace, ref.name, ref.uid))
            return
        self._checkpoint.update(lambda cp: cp.without_claim(ref.uid))

    # --- recovery ----------------------------------------------------------------------------------

    def recover(self) -> RecoveryReport:
        """At startup, before the plugin serves: rebuild ownership if the checkpoint was lost or corrupt, finish
        interrupted prepares (roll back) and unprepares (release), destroy MIG instances and delete CDI specs that
        provably belong to no claim, verify and repair every completed claim, and delete our own crash-leftover
        temp files. Holds the node's operation lock exclusively: no instance is in the middle of a claim."""
        with self._operations.exclusive(self.settings.recovery_lock_timeout):
            missing = None
            if not self._checkpoint.exists() and (
                self._cdi.claim_uids_on_disk() or self._actuator.count_instances(self._managed_gpus())
            ):
                # Something was prepared here without a record of it. A first start finds nothing and asks the
                # API nothing (a cluster-wide LIST per node would be a real load during a fleet-wide install).
                missing = "there is no checkpoint file, but CDI specs or MIG instances of this driver exist (deleted?)"
            self._checkpoint.load()  # moves a corrupt file aside and records the loss
            reason = self._checkpoint.take_loss() or missing
            removed_temp = [str(p) for p in (*self._checkpoint.sweep_temp_files(), *self._cdi.sweep_temp_files())]
            for path in removed_temp:
                log.info("removed a temp file left by an interrupted write", path=path)
            report = self._reconcile(reason)
        return replace(report, removed_temp_files=tuple(removed_temp))

    def reconcile(self) -> RecoveryReport | None:
        """While serving: if the checkpoint was lost or corrupted since startup, or ownership could not be
        rebuilt then (API unreachable), rebuild it now, holding the node's operation lock exclusively (claims of
        every instance wait meanwhile). None when there was nothing to do."""
        reason = self._checkpoint.take_loss() or self._pending_rebuild
        if reason is None:
            return None
        self._pending_rebuild = reason  # kept until a rebuild gets through (busy node, NVML or API errors)
        with self._operations.exclusive(self.settings.recovery_lock_timeout):
            return self._reconcile(reason)

    def _reconcile(self, reason: str | None) -> RecoveryReport:
        with self._recovery_lock:
            allocated: dict[str, AllocatedClaim] | None = None
            adopted: list[str] = []
            if reason is not None:
                allocated, adopted = self._rebuild(reason)
            finished = self._finish_interrupted()
            known = reason is None or allocated is not None
            self._pending_rebuild = None if known else reason
            destroyed, removed = 0, []
            if known:
                destroyed = self._destroy_unowned(allocated)
                removed = self._remove_orphan_specs(allocated)
                self._reset_unowned_time_slices()
                self._sweep_unowned_mps()
            else:
                log.warning(
                    "ownership of the CDI specs and MIG instances on this node is unknown (the checkpoint was lost and "
                    "the API could not be read): keeping all of them, nothing is deleted or destroyed; retrying "
                    "every --cleanup-interval",
                    reason=reason,
                )
            repaired = self._repair_all()
            return RecoveryReport(
                rebuild_reason=reason,
                ownership_known=known,
                adopted=tuple(adopted),
                finished=tuple(finished),
                repaired=tuple(repaired),
                destroyed_instances=destroyed,
                removed_specs=tuple(removed),
            )

    def _rebuild(self, reason: str) -> tuple[dict[str, AllocatedClaim] | None, list[str]]:
        """Recreate completed records for the claims the API server has allocated to this pool and for which
        something exists here (our CDI spec, or a MIG instance at exactly an allocated placement)."""
        log.info("rebuilding claim ownership from what exists on this node", reason=reason)
        try:
            allocated = claims_allocated_here(
                self._claims.list_claims(), self.settings.driver_name, self.settings.pool_name
            )
        except ApiError as exc:
            log.warning("listing ResourceClaims to rebuild ownership failed", error=str(exc))
            return None, []
        catalog = self._catalog()
        with_spec = self._cdi.claim_uids_on_disk()
        known = self._checkpoint.load().claims
        records = [
            record
            for uid, claim in sorted(allocated.items())
            if uid not in known and (record := self._adopt(claim, catalog, uid in with_spec)) is not None
        ]
        if records:
            self._checkpoint.update(
                lambda cp: Checkpoint(cp.node_boot_id, {**{r.uid: r for r in records}, **cp.claims})
            )
        for record in records:
            log.warning(
                "adopted a prepared claim found on this node",
                devices=[d.device for d in record.devices],
                **claim_fields(record.namespace, record.name, record.uid),
            )
        return allocated, [r.uid for r in records]

    def _adopt(
        self, claim: AllocatedClaim, catalog: Mapping[str, AllocatableDevice], has_spec: bool
    ) -> ClaimRecord | None:
        ref = claim.ref
        try:
            allocation, allocated = self._our_results(ref, claim.claim)
            plan = self._plan(ref.uid, allocation, allocated, catalog)
        except DraDriverError as exc:
            log.warning(
                "not adopting a claim allocated here; its CDI spec and MIG instances are kept",
                error=str(exc),
                **claim_fields(ref.namespace, ref.name, ref.uid),
            )
            return None
        found = {
            p.device: mig
            for p, d in zip(plan.planned, plan.devices, strict=True)
            if (mig := self._actuator.adopt(d)) is not None
        }
        if not has_spec and not found:
            return None  # nothing of it exists here: the kubelet's next prepare starts from scratch
        devices = tuple(
            replace(
                p,
                cdi_device_ids=(self._cdi.cdi_id(ref.uid, p.device),),
                mig=found.get(p.device, p.mig),
                sharing="MPS" if p.mps is not None else str(config.sharing.strategy),
            )
            for p, config in zip(plan.planned, plan.configs, strict=True)
        )
        return ClaimRecord(
            ref.uid, ref.namespace, ref.name, ClaimState.PREPARE_COMPLETED, devices=devices, allocated=devices
        )

    def _finish_interrupted(self) -> list[str]:
        finished = []
        for record in list(self._checkpoint.load().claims.values()):
            if record.state is ClaimState.PREPARE_COMPLETED:
                continue
            ref = ClaimRef(record.namespace, record.name, record.uid)
            try:
                self.unprepare_claim(ref)
            except DraDriverError as exc:
                log.warning(
                    "finishing an interrupted claim failed; retried on the next call",
                    state=str(record.state),
                    error=str(exc),
                    **claim_fields(ref.namespace, ref.name, ref.uid),
                )
                continue
            finished.append(record.uid)
            what = (
                "rolled back a half-prepared claim"
                if record.state is ClaimState.PREPARE_STARTED
                else "finished an interrupted unprepare"
            )
            log.info(what, **claim_fields(ref.namespace, ref.name, ref.uid))
        return finished

    def _managed_gpus(self) -> dict[str, bool]:
        """GPUs whose MIG layout this driver owns (dynamic MIG) -> whether MIG may be toggled on them."""
        return {
            d.gpu.uuid: supports_mig_toggle(d.gpu) for d in self._catalog().values() if d.kind is DeviceKind.MIG_DYNAMIC
        }

    def _destroy_unowned(self, allocated: Mapping[str, AllocatedClaim] | None) -> int:
        catalog = self._catalog()
        managed = self._managed_gpus()
        if not managed:
            return 0
        records = self._checkpoint.load().claims.values()
        owned = [d.mig for r in records for d in (*r.devices, *r.allocated) if d.mig is not None]
        # After a rebuild, a placement allocated here may hold that claim's instance in a shape we could not adopt.
        reserved = reserved_placements(allocated.values(), catalog) if allocated is not None else set()
        return self._actuator.destroy_unowned(managed, owned, reserved)

    def _remove_orphan_specs(self, allocated: Mapping[str, AllocatedClaim] | None) -> list[str]:
        keep = set(self._checkpoint.load().claims) | set(allocated or ())
        removed = []
        for uid in sorted(self._cdi.claim_uids_on_disk() - keep):
            self._cdi.remove(uid)
            removed.append(uid)
            log.info("removed a CDI spec no claim owns", claim_uid=uid)
        return removed

    def _repair_all(self) -> list[str]:
        repaired = []
        for record in list(self._checkpoint.load().claims.values()):
            if record.state is not ClaimState.PREPARE_COMPLETED or not self._damage(record):
                continue
            try:
                self.repair_claim(record.uid)
            except DraDriverError as exc:
                log.warning(
                    "a prepared claim could not be repaired; its next prepare call reports why",
                    error=str(exc),
                    **claim_fields(record.namespace, record.name, record.uid),
                )
                continue
            repaired.append(record.uid)
        return repaired

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
            except InvalidNameError as exc:
                # Only a damaged or hand-edited checkpoint gets here: the gRPC layer admits valid names only.
                log.warning(
                    "stale-claim check skipped: the recorded name is invalid", error=str(exc), claim_uid=record.uid
                )
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


def prepared_type(device: PreparedDevice) -> str:
    """What a prepared device is, for the metrics: `share` (a consumable-capacity share or a shared GPU), `mig`
    (a MIG device, dynamic or static) or `gpu`."""
    if device.share_id is not None or device.device.endswith("-shared"):
        return "share"
    if device.mps is not None and device.mps.share:
        return "share"
    if device.mig is not None or "-mig-" in device.device:
        return "mig"
    return "gpu"


def _refuse_other_time_slice(ref: ClaimRef, planned: Sequence[PreparedDevice], checkpoint: Checkpoint) -> None:
    """A GPU runs one time-slice: a claim asking for another one than the GPU holds for other claims (possible
    once claims share a GPU) is refused, naming them."""
    for device in planned:
        if device.time_slice is None or device.gpu_uuid is None:
            continue
        others = holders(checkpoint.claims.values(), device.gpu_uuid, excluding=ref.uid)
        clash = sorted(f"{claim} ({interval})" for claim, interval in others.items() if interval != device.time_slice)
        if clash:
            raise PrepareError(
                f"GPU {device.device} runs another time-slice for claim(s) {', '.join(clash)}; refusing time-slice "
                f"{device.time_slice} for {ref.namespace}/{ref.name}"
            )


def _gpus(record: ClaimRecord) -> list[str]:
    return [d.gpu_uuid for d in (*record.devices, *record.allocated) if d.gpu_uuid]


def _hardware_untouched(plan: _Plan) -> bool:
    """Whether preparing the plan changes nothing on the hardware: every device a whole GPU that needs no MIG
    mode change, or a static MIG device, with no time-slice and no MPS daemon."""
    for device, planned in zip(plan.devices, plan.planned, strict=True):
        if planned.mig is not None or planned.time_slice is not None or planned.mps is not None:
            return False
        if device.kind is DeviceKind.MIG_STATIC:
            continue
        if not device.kind.whole_gpu or device.partitioned:
            return False
    return True


def _releases_nothing(record: ClaimRecord) -> bool:
    """Whether releasing a completed record changes nothing on the hardware (no MIG instance, time-slice, MPS)."""
    return all(d.mig is None and d.time_slice is None and d.mps is None for d in record.devices)


def _mig_spec(device: AllocatableDevice) -> MigRecord | None:
    """What a dynamic MIG device will be (its live ids come later): enough to find and roll it back."""
    if device.kind is not DeviceKind.MIG_DYNAMIC or device.profile is None or device.placement is None:
        return None
    return MigRecord(device.gpu.uuid, device.profile.id, device.placement.start, device.placement.size)


def _visible_uuid(allocatable: AllocatableDevice, device: PreparedDevice) -> str:
    """What the container addresses: the MIG UUID of a dynamic or static MIG device, else the GPU UUID."""
    if device.mig is not None and device.mig.uuid:
        return device.mig.uuid
    if allocatable.kind is DeviceKind.MIG_STATIC and allocatable.mig is not None:
        return allocatable.mig.uuid
    return allocatable.gpu.uuid


def _held(claim: str, devices: Sequence[PreparedDevice], daemon: str) -> list[Holder]:
    return [Holder(claim, d) for d in devices if d.mps is not None and d.mps.daemon == daemon]


def _known_uuid(device: AllocatableDevice) -> str | None:
    """What a device is to CUDA before it is prepared: None for a dynamic MIG device (it does not exist yet)."""
    if device.kind is DeviceKind.MIG_DYNAMIC:
        return None
    if device.kind is DeviceKind.MIG_STATIC and device.mig is not None:
        return device.mig.uuid
    return device.gpu.uuid


def _cdi_device(
    allocatable: AllocatableDevice, device: PreparedDevice, visible_uuid: str, mps: MpsClient | None = None
) -> DeviceForCdi:
    return DeviceForCdi(
        allocatable=allocatable,
        visible_uuid=visible_uuid,
        sharing=device.sharing or "Exclusive",
        request_names=device.request_names,
        gpu_instance_id=device.mig.gpu_instance_id if device.mig else None,
        compute_instance_id=device.mig.compute_instance_id if device.mig else None,
        mps=mps,
    )


def catalog_type(catalog: Mapping[str, AllocatableDevice], result: Mapping[str, Any]) -> str:
    """Which config kind applies to a result's device: `gpu` (GpuConfig: whole GPUs and their shares) or `mig`."""
    device = catalog.get(str(result.get("device")))
    return "mig" if device is not None and not device.kind.whole_gpu else "gpu"


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
    admin: frozenset[str],
    checkpoint: Checkpoint,
    catalog: Mapping[str, AllocatableDevice],
) -> None:
    """The last line of defence against a double allocation: a device (or an overlapping MIG partition of the
    same GPU) already prepared for another claim is refused, naming both claims."""
    for other in checkpoint.claims.values():
        if other.uid == ref.uid:
            continue
        for held in (*other.devices, *other.allocated):
            for device in devices:
                if device.name in admin or (held.share_id is not None and device.name == held.device):
                    continue  # another share of the same shared GPU
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
    if device.kind.shared or other.kind.shared:
        return True  # shares of a GPU exclude the whole GPU and its partitions
    if device.placement is None or other.placement is None:
        # A whole GPU collides with any partition of it (only possible with dynamic MIG).
        return device.partitioned and other.partitioned
    return device.placement.overlaps(other.placement)
