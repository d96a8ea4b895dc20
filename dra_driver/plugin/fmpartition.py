"""Fabric Manager partitions on the node: pass a partition's GPUs through to one VM and activate the partition on
the NVSwitches, and back (docs/passthrough.md "Fabric Manager partitions").

Prepare (`activate`, for an `fm-partition` device):
    each member GPU, in FM's order, is moved to vfio-pci exactly as a single passthrough is (`VfioBinder.bind`: its
    refusals, its durable record before the first function moves, its `vfio:*` crash points) → the partition is
    read back from FM and must be inactive (an active one is another tool's or another claim's: refused, never
    taken) → `activating` is recorded durably → fmActivateFabricPartition.
Release (`release`, unprepare and every rollback): where `activating` is recorded, fmDeactivateFabricPartition
    (FM_ST_UNINITIALIZED, "not active", counts as done: a crash before the activation, or a release run twice) →
    each bound member GPU back to its drivers (`VfioBinder.restore`, last first). Idempotent, so a crash anywhere is
    finished by running it again; a partition no record marks `activating` is never deactivated.

Repair (`repair`, a prepared claim found damaged): each member GPU that left vfio-pci is moved back
    (`VfioBinder.rebind`); then, where the record says this plugin activated the partition and FM lists it
    inactive, it is activated again. That is what an FM restarted in shared NVSwitch mode leaves (it activates no
    partition at start, and the VM's NVLink traffic stays blocked until the partition is activated again). FM
    started with `--restart` (resiliency mode) is different: it waits for the whole node's list of active
    partitions (fmSetActivatedFabricPartitions) and refuses partition calls meanwhile; the plugin does not send that
    list (docs/passthrough.md says why), so such an FM's refusal is what the repair reports.

Crash points `fmpartition:after-record`, `fmpartition:after-activate`, `fmpartition:after-deactivate`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

import structlog

from dra_driver.claimconfig.api import VfioDeviceConfig
from dra_driver.inventory.catalog import AllocatableDevice, DeviceKind, vfio_device_name
from dra_driver.nvml.fabricmanager import FabricManager, FabricManagerError, FabricPartition, FmReturn
from dra_driver.plugin.actuator import PrepareError
from dra_driver.plugin.checkpoint import FmPartitionRecord, VfioRecord
from dra_driver.plugin.faults import FaultPoints
from dra_driver.plugin.vfio import VfioBinder

log = structlog.get_logger(__name__)


class FabricPartitioner:
    """Activates Fabric Manager partitions over GPUs it binds to vfio-pci (the effect,
    plugin/effects/fm_partition.py, decides when)."""

    def __init__(self, fm: FabricManager, binder: VfioBinder, faults: FaultPoints | None = None) -> None:
        self.fm = fm
        self.binder = binder
        self.faults = faults or FaultPoints()

    def partition(self, partition_id: int) -> FabricPartition:
        """FM's view of one partition now. Raises PrepareError."""
        try:
            listed = self.fm.supported_partitions()
        except FabricManagerError as exc:
            raise PrepareError(f"listing Fabric Manager partitions failed: {exc}") from exc
        found = next((p for p in listed if p.id == partition_id), None)
        if found is None:
            raise PrepareError(f"Fabric Manager has no partition {partition_id} (it lists {[p.id for p in listed]})")
        return found

    def plan(self, device: AllocatableDevice, config: VfioDeviceConfig) -> FmPartitionRecord:
        if device.partition_id is None or not device.members:
            raise PrepareError(f"device {device.name} names no Fabric Manager partition and no GPUs")
        gpus = tuple(self.binder.plan(m, config) for m in members(device))
        return FmPartitionRecord(device.partition_id, gpus, tuple(m.uuid for m in device.members))

    def activate(
        self, device: AllocatableDevice, record: FmPartitionRecord, recorded: Callable[[FmPartitionRecord], None]
    ) -> FmPartitionRecord:
        """Bind the member GPUs, then activate; `recorded` makes each step's record durable before it acts."""
        bound: list[VfioRecord] = list(record.gpus)
        for i, (member, gpu) in enumerate(zip(members(device), record.gpus, strict=True)):

            def moved(vfio: VfioRecord, i: int = i) -> None:
                bound[i] = vfio
                recorded(replace(record, gpus=tuple(bound)))

            bound[i] = self.binder.bind(member, gpu, moved)
        record = replace(record, gpus=tuple(bound))
        if self.partition(record.partition_id).active:
            raise PrepareError(
                f"Fabric Manager partition {record.partition_id} of device {device.name} is already active, and no "
                "claim of this plugin activated it (another tool's, or an admin's): refusing to take it"
            )
        record = replace(record, activating=True)
        recorded(record)
        self.faults.reached("fmpartition:after-record")
        try:
            self.fm.activate(record.partition_id)
        except FabricManagerError as exc:
            raise PrepareError(
                f"Fabric Manager refused to activate partition {record.partition_id} of device {device.name}: {exc}"
            ) from exc
        self.faults.reached("fmpartition:after-activate")
        return record

    def release(self, record: FmPartitionRecord) -> None:
        """Deactivate what the record proves this plugin activated, then give the GPUs back to their drivers."""
        if record.activating:
            try:
                self.fm.deactivate(record.partition_id)
            except FabricManagerError as exc:
                # FM_ST_UNINITIALIZED is the guide's "not active": never activated, or released already. Any other
                # refusal counts as done only where FM lists the partition inactive (a code the guide does not give
                # for it, from another FM version, must not keep a released partition's claim forever).
                if exc.code is not FmReturn.UNINITIALIZED and not self._inactive(record.partition_id):
                    raise PrepareError(
                        f"Fabric Manager could not deactivate partition {record.partition_id}: {exc}; the record is "
                        "kept and the release is retried"
                    ) from exc
            self.faults.reached("fmpartition:after-deactivate")
        uuids: tuple[str | None, ...] = (
            record.uuids if len(record.uuids) == len(record.gpus) else (None,) * len(record.gpus)
        )
        for gpu, uuid in reversed(tuple(zip(record.gpus, uuids, strict=True))):
            if gpu.started:
                self.binder.restore(uuid, gpu)

    def _inactive(self, partition_id: int) -> bool:
        try:
            return not self.partition(partition_id).active
        except PrepareError:
            return False  # FM cannot say: not proven released

    def repair(self, device: AllocatableDevice | None, record: FmPartitionRecord) -> FmPartitionRecord:
        """Make a prepared partition what its record says again: members back on vfio-pci, then the partition active
        again where this plugin activated it. Raises PrepareError (the record is kept; the next repair retries)."""
        gpus = list(record.gpus)
        for i, gpu in enumerate(record.gpus):
            if not self.binder.problems(gpu):
                continue
            if device is None or len(device.members) != len(gpus):
                raise PrepareError(
                    f"member GPU {gpu.address} of Fabric Manager partition {record.partition_id} left vfio-pci, and "
                    "the partition is not in this node's devices any more to move it back"
                )
            gpus[i] = self.binder.rebind(members(device)[i], gpu)
        if gpus != list(record.gpus):
            record = replace(record, gpus=tuple(gpus))
        if record.activating and not self.partition(record.partition_id).active:
            try:
                self.fm.activate(record.partition_id)
            except FabricManagerError as exc:
                raise PrepareError(
                    f"Fabric Manager partition {record.partition_id} is inactive though this plugin activated it "
                    f"(Fabric Manager restarted?), and activating it again failed: {exc}"
                ) from exc
            log.warning(
                "activated a Fabric Manager partition again: Fabric Manager listed it inactive (restarted?)",
                partition=record.partition_id,
            )
        return record

    def problems(self, record: FmPartitionRecord) -> list[str]:
        """What differs from a prepared partition: a member GPU off vfio-pci, or the partition inactive."""
        out = [p for g in record.gpus for p in self.binder.problems(g)]
        try:
            active = self.partition(record.partition_id).active
        except PrepareError as exc:
            return [*out, str(exc)]
        if record.activating and not active:
            out.append(f"Fabric Manager partition {record.partition_id} is not active")
        return out


def members(device: AllocatableDevice) -> tuple[AllocatableDevice, ...]:
    """Each member GPU as the passthrough device the binder moves (named for messages as the GPU's own is)."""
    return tuple(AllocatableDevice(name=vfio_device_name(g), kind=DeviceKind.VFIO, gpu=g) for g in device.members)
