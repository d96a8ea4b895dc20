"""Dynamic MIG: carve the allocated partition at prepare time, remove it at unprepare.

Prepare (for a `mig-dynamic` device): enable MIG if it is off (Hopper+ only: Ampere needs a GPU reset, so
Ampere GPUs are only offered when MIG is already on) → create the GPU instance at EXACTLY the allocated
placement → create one compute instance spanning all its slices → look the MIG device up by (GI, CI) among
the parent's MIG devices (never through the compute instance's `device`, which is the parent). Any failure
destroys what was made, so a failed prepare leaves nothing behind.

Unprepare destroys the compute instance, then the GPU instance; on Hopper+ MIG goes off again after the
last partition, so the whole GPU is usable by CUDA again. Release, rollback and repair find the instance by its
full recorded identity (GPU, GI id, profile, placement, compute instance), never by the GI id alone: NVML reuses
ids, so an id can name another claim's partition by the time a retried unprepare runs.
"""

from __future__ import annotations

import threading
from collections.abc import Collection, Iterable, Mapping
from contextlib import AbstractContextManager, nullcontext

import structlog

from dra_driver.inventory.catalog import AllocatableDevice, DeviceKind, architecture_toggles_mig, supports_mig_toggle
from dra_driver.nvml.backend import NvmlBackend
from dra_driver.nvml.types import ComputeInstanceProfile, GpuInstance, NvmlError, NvmlReturn, Placement
from dra_driver.observability.metrics import PluginMetrics
from dra_driver.plugin.actuator import PrepareError, RecordCreated, ignore_created
from dra_driver.plugin.checkpoint import MigRecord, PreparedDevice
from dra_driver.plugin.faults import FaultPoints

log = structlog.get_logger(__name__)

_GONE = {NvmlReturn.NOT_FOUND, NvmlReturn.INVALID_ARGUMENT}


_IS_GONE = "is gone"


def _same_instance(gi: GpuInstance, mig: MigRecord) -> bool:
    """Same GPU instance as recorded: id, profile and placement (checkpoints written before the placement size was
    recorded carry 0 there, so only the start can be compared for them)."""
    return (
        gi.id == mig.gpu_instance_id
        and gi.profile_id == mig.profile_id
        and gi.placement.start == mig.placement_start
        and mig.placement_size in (0, gi.placement.size)
    )


def full_compute_profile(profiles: Iterable[ComputeInstanceProfile], slices: int) -> ComputeInstanceProfile | None:
    """The compute-instance profile that uses every slice of the GPU instance (the most SMs among those)."""
    full = [p for p in profiles if p.slice_count == slices]
    return max(full, key=lambda p: (p.multiprocessors, -p.index), default=None)


class MigActuator:
    """Dynamic MIG on the GPUs: carve, find, destroy and sweep instances, and MIG mode for whole GPUs in the
    dynamic layout (the MIG partition effect, plugin/effects/mig_partition.py, decides when)."""

    def __init__(
        self, nvml: NvmlBackend, faults: FaultPoints | None = None, metrics: PluginMetrics | None = None
    ) -> None:
        self._nvml = nvml
        self._faults = faults or FaultPoints()
        self._metrics = metrics
        self._gpu_locks: dict[str, threading.Lock] = {}
        self._guard = threading.Lock()

    def _lock(self, gpu_uuid: str) -> threading.Lock:
        with self._guard:
            return self._gpu_locks.setdefault(gpu_uuid, threading.Lock())

    # --- prepare ---------------------------------------------------------------------------------

    def ensure_mig_off(self, device: AllocatableDevice) -> None:
        """A whole Hopper+ GPU handed to CUDA must not be in MIG mode (it would show no usable device)."""
        with self._lock(device.gpu.uuid):
            self._ensure_mig_off(device)

    def create(self, device: AllocatableDevice, record: RecordCreated = ignore_created) -> MigRecord:
        """Carve a `mig-dynamic` device at exactly its placement; returns its full live identity (MIG UUID
        included). `record` is called the moment the GPU instance exists."""
        assert device.kind is DeviceKind.MIG_DYNAMIC and device.profile is not None and device.placement is not None
        with self._lock(device.gpu.uuid), self._timed("create"):
            return self._create_instance(device, record)

    def _ensure_mig_off(self, device: AllocatableDevice) -> None:
        mode = self._nvml.mig_mode(device.gpu.uuid)
        if mode is None or not mode.current:
            return
        if self._nvml.gpu_instances(device.gpu.uuid):
            raise PrepareError(f"GPU {device.name} still has MIG partitions; it cannot be used whole")
        self._set_mig(device, enabled=False)

    def _set_mig(self, device: AllocatableDevice, *, enabled: bool) -> None:
        if not supports_mig_toggle(device.gpu):
            raise PrepareError(
                f"MIG is {'off' if enabled else 'on'} on {device.gpu.info.name} {device.gpu.uuid}; "
                f"{device.gpu.info.architecture.label} GPUs need a GPU reset to change MIG mode, so the driver never "
                "does it (ask an admin to run `nvidia-smi -mig` and reset the GPU)"
            )
        try:
            status = self._nvml.set_mig_mode(device.gpu.uuid, enabled)
        except NvmlError as exc:
            raise PrepareError(
                f"turning MIG {'on' if enabled else 'off'} on GPU {device.gpu.uuid} failed: {exc}"
            ) from exc
        if status is not NvmlReturn.SUCCESS:
            raise PrepareError(
                f"turning MIG {'on' if enabled else 'off'} on GPU {device.gpu.uuid} did not take effect "
                f"(activation status {status.name}); is a process using the GPU?"
            )
        log.info("MIG mode changed", gpu_uuid=device.gpu.uuid, enabled=enabled)

    def _timed(self, operation: str) -> AbstractContextManager[None]:
        return self._metrics.mig_operation(operation) if self._metrics is not None else nullcontext()

    def _create_instance(self, device: AllocatableDevice, record: RecordCreated) -> MigRecord:
        gpu, profile, placement = device.gpu, device.profile, device.placement
        assert profile is not None and placement is not None
        mode = self._nvml.mig_mode(gpu.uuid)
        if mode is None:
            raise PrepareError(f"GPU {gpu.uuid} is not MIG-capable (any more?)")
        if not mode.current:
            self._set_mig(device, enabled=True)
            self._faults.reached("mig:after-enable")
        try:
            gi = self._nvml.create_gpu_instance(gpu.uuid, profile.id, placement)
        except NvmlError as exc:
            self._maybe_mig_off(device)
            if exc.code is NvmlReturn.INSUFFICIENT_RESOURCES:
                raise PrepareError(
                    f"MIG placement {placement.start}:{placement.size} for {profile.name} on GPU {gpu.uuid} is "
                    "occupied (an instance not made by this driver, or a stale allocation); nothing was created"
                ) from exc
            raise PrepareError(
                f"creating MIG {profile.name} at {placement.start} on GPU {gpu.uuid} failed: {exc}"
            ) from exc
        self._faults.reached("mig:after-gpu-instance")
        try:
            record(MigRecord(gpu.uuid, profile.id, placement.start, placement.size, gi.id))
            ci_profile = full_compute_profile(
                self._nvml.compute_instance_profiles(gpu.uuid, gi.id), profile.slice_count
            )
            if ci_profile is None:
                raise PrepareError(
                    f"no compute-instance profile spans all {profile.slice_count} slices of {profile.name}"
                )
            ci = self._nvml.create_compute_instance(gpu.uuid, gi.id, ci_profile.id)
            self._faults.reached("mig:after-compute-instance")
            mig_uuid = next(
                (
                    m.uuid
                    for m in self._nvml.mig_devices(gpu.uuid)
                    if m.gpu_instance_id == gi.id and m.compute_instance_id == ci.id
                ),
                None,
            )
            if mig_uuid is None:
                raise PrepareError(f"MIG device for GI {gi.id} / CI {ci.id} on GPU {gpu.uuid} did not appear")
        except (NvmlError, PrepareError) as exc:
            self._destroy_instance(gpu.uuid, gi)
            self._maybe_mig_off(device)
            if isinstance(exc, PrepareError):
                raise
            raise PrepareError(f"creating the compute instance for {device.name} failed: {exc}") from exc
        log.info(
            "MIG device created",
            device=device.name,
            gpu_uuid=gpu.uuid,
            gpu_instance_id=gi.id,
            compute_instance_id=ci.id,
            mig_uuid=mig_uuid,
        )
        return MigRecord(gpu.uuid, profile.id, placement.start, placement.size, gi.id, ci.id, mig_uuid)

    # --- identity -----------------------------------------------------------------------------------

    def _find_ours(self, mig: MigRecord) -> tuple[GpuInstance | None, str]:
        """The live GPU instance that is exactly the one recorded, or (None, why not). Called with the GPU lock.

        Identity is the GPU, the GI id, the profile, the placement and, once recorded, the compute instance. A GI
        id alone proves nothing: NVML hands a destroyed instance's id to the next instance of that size, which
        may belong to another claim at another placement. A GI whose id, profile and placement match holds at
        most the recorded compute instance (or, before the CI id was recorded, only what our prepare made)."""
        assert mig.gpu_instance_id is not None
        gi = next((g for g in self._list(mig.parent_uuid) if g.id == mig.gpu_instance_id), None)
        if gi is None:
            return None, _IS_GONE
        if not _same_instance(gi, mig):
            return None, (
                f"now has profile {gi.profile_id} at {gi.placement.start}:{gi.placement.size} (recorded: profile "
                f"{mig.profile_id} at {mig.placement_start}:{mig.placement_size}): the id now names another instance"
            )
        if mig.compute_instance_id is not None:
            foreign = [
                ci.id for ci in self._nvml.compute_instances(mig.parent_uuid, gi.id) if ci.id != mig.compute_instance_id
            ]
            if foreign:
                return None, (
                    f"holds compute instance(s) {foreign} this driver did not record (recorded: "
                    f"{mig.compute_instance_id}): it is not the instance this claim created"
                )
        return gi, ""

    # --- release and rollback ----------------------------------------------------------------------

    def release(self, device: PreparedDevice) -> None:
        """Destroy the claim's MIG instance, by its full recorded identity only (see `_find_ours`)."""
        mig = device.mig
        if mig is None or mig.gpu_instance_id is None:
            return
        with self._lock(mig.parent_uuid):
            self._destroy_if_ours(device.device, mig)
            self._maybe_mig_off_uuid(mig.parent_uuid)

    def rollback(self, device: PreparedDevice) -> None:
        """Remove the instance a failed or crashed prepare recorded, if it is still the one we made (same rule as
        `release`). An instance created but not yet recorded when the plugin died is found by the startup sweep
        (`destroy_unowned`), never by guessing from the placement here."""
        mig = device.mig
        if mig is None or mig.gpu_instance_id is None:
            return
        with self._lock(mig.parent_uuid):
            if self._destroy_if_ours(device.device, mig):
                log.info("rolled back a MIG instance", gpu_uuid=mig.parent_uuid, gpu_instance_id=mig.gpu_instance_id)
            self._maybe_mig_off_uuid(mig.parent_uuid)

    def _destroy_if_ours(self, device_name: str, mig: MigRecord) -> bool:
        gi, why = self._find_ours(mig)
        if gi is not None:
            self._destroy_instance(mig.parent_uuid, gi)
            return True
        if why != _IS_GONE:
            log.warning(
                "MIG instance left alone: it is not the one this claim created",
                device=device_name,
                gpu_uuid=mig.parent_uuid,
                gpu_instance_id=mig.gpu_instance_id,
                reason=why,
            )
        return False

    # --- verification, repair and adoption ------------------------------------------------------------

    def verify(self, device: PreparedDevice) -> str | None:
        mig = device.mig
        if mig is None:
            return None  # nothing of it is on the GPU: a whole GPU or a static MIG device
        where = (
            f"MIG device {device.device} (profile {mig.profile_id} at {mig.placement_start} on GPU {mig.parent_uuid})"
        )
        if mig.gpu_instance_id is None or mig.compute_instance_id is None or not mig.uuid:
            # Without the MIG UUID the container could only be handed the parent GPU: make it again, completely.
            return f"{where} was never completely recorded"
        try:
            with self._lock(mig.parent_uuid):
                gi, why = self._find_ours(mig)
                if gi is None:
                    return f"{where}: GPU instance {mig.gpu_instance_id} {why}"
                if all(ci.id != mig.compute_instance_id for ci in self._nvml.compute_instances(mig.parent_uuid, gi.id)):
                    return f"{where}: compute instance {mig.compute_instance_id} is gone"
        except NvmlError as exc:
            return f"{where}: reading its state failed: {exc}"
        return None

    def adopt(self, device: AllocatableDevice) -> MigRecord | None:
        """The live instance at exactly this device's profile and placement, with exactly one compute instance
        (what prepare makes). Anything else there is not adopted: the caller keeps it and says so."""
        if device.kind is not DeviceKind.MIG_DYNAMIC or device.profile is None or device.placement is None:
            return None
        parent = device.gpu.uuid
        with self._lock(parent):
            gi = next(
                (
                    g
                    for g in self._list(parent)
                    if g.profile_id == device.profile.id and g.placement == device.placement
                ),
                None,
            )
            if gi is None:
                return None
            cis = self._nvml.compute_instances(parent, gi.id)
            if len(cis) != 1:
                return None
            mig_uuid = next(
                (
                    m.uuid
                    for m in self._nvml.mig_devices(parent)
                    if m.gpu_instance_id == gi.id and m.compute_instance_id == cis[0].id
                ),
                None,
            )
        return MigRecord(
            parent, device.profile.id, device.placement.start, device.placement.size, gi.id, cis[0].id, mig_uuid
        )

    def count_instances(self, gpus: Collection[str]) -> int:
        return sum(len(self._list(parent)) for parent in gpus)

    def destroy_unowned(
        self,
        gpus: Mapping[str, bool],
        owned: Collection[MigRecord],
        reserved: Collection[tuple[str, Placement]] = (),
    ) -> list[str]:
        """At startup: destroy GPU instances on dynamically managed GPUs that no record owns (left by a crash
        between creating an instance and recording it; out-of-band MIG changes are not supported there).

        Kept, with a warning: an instance overlapping a `reserved` placement (a device allocated to a claim on
        this node: after a lost checkpoint it may be that claim's, in a shape we cannot prove), and one NVML
        refuses to destroy (processes on it). `gpus` maps GPU UUID -> may toggle MIG. Returns the instances
        destroyed, as `<GPU UUID> GI <id>`."""
        destroyed: list[str] = []
        for parent in sorted(gpus):
            with self._lock(parent):
                mine = [m for m in owned if m.parent_uuid == parent and m.gpu_instance_id is not None]
                for gi in self._list(parent):
                    if any(_same_instance(gi, m) for m in mine):
                        continue
                    held = next((p for g, p in reserved if g == parent and p.overlaps(gi.placement)), None)
                    if held is not None:
                        log.warning(
                            "kept a MIG instance no record owns: it overlaps a device allocated to a claim here",
                            gpu_uuid=parent,
                            gpu_instance_id=gi.id,
                            placement=f"{gi.placement.start}:{gi.placement.size}",
                            allocated_placement=f"{held.start}:{held.size}",
                        )
                        continue
                    try:
                        self._destroy_instance(parent, gi)
                    except PrepareError as exc:
                        log.warning("kept a MIG instance no record owns: destroying it failed", error=str(exc))
                        continue
                    destroyed.append(f"{parent} GI {gi.id}")
                    log.warning("destroyed a MIG instance no claim owns", gpu_uuid=parent, gpu_instance_id=gi.id)
                if gpus[parent]:
                    self._maybe_mig_off_uuid(parent)
        return destroyed

    def _list(self, parent: str) -> list[GpuInstance]:
        try:
            return self._nvml.gpu_instances(parent)
        except NvmlError as exc:
            if exc.code is NvmlReturn.NOT_SUPPORTED:
                return []  # MIG is off: nothing can exist
            raise

    def _destroy_instance(self, parent: str, gi: GpuInstance) -> None:
        with self._timed("destroy"):
            self._destroy_untimed(parent, gi)

    def _destroy_untimed(self, parent: str, gi: GpuInstance) -> None:
        try:
            for ci in self._nvml.compute_instances(parent, gi.id):
                self._nvml.destroy_compute_instance(parent, gi.id, ci.id)
                self._faults.reached("mig:after-destroy-compute-instance")
            self._nvml.destroy_gpu_instance(parent, gi.id)
            self._faults.reached("mig:after-destroy-gpu-instance")
        except NvmlError as exc:
            if exc.code in _GONE:
                return
            raise PrepareError(f"destroying MIG GPU instance {gi.id} on GPU {parent} failed: {exc}") from exc

    def _maybe_mig_off(self, device: AllocatableDevice) -> None:
        if supports_mig_toggle(device.gpu):
            self._maybe_mig_off_uuid(device.gpu.uuid)

    def _maybe_mig_off_uuid(self, parent: str) -> None:
        """Hopper+: MIG off again after the last partition (no reset needed). Ampere is left as it is."""
        try:
            mode = self._nvml.mig_mode(parent)
            if mode is None or not mode.current or self._nvml.gpu_instances(parent):
                return
            arch = next((g.architecture for g in self._nvml.gpus() if g.uuid == parent), None)
            if arch is None or not architecture_toggles_mig(arch):
                return
            self._nvml.set_mig_mode(parent, False)
        except NvmlError as exc:
            log.warning("could not turn MIG off after the last partition", gpu_uuid=parent, error=str(exc))
