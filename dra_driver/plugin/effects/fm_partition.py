"""Fabric Manager partitions: an `fm-partition` device (`fm-partition-<id>`) is a partition of an NVSwitch board's
GPUs passed through together to one VM: prepare binds each member GPU to vfio-pci and activates the partition,
unprepare deactivates it and gives the GPUs back (the hardware code is plugin/fmpartition.py; docs/passthrough.md
"Fabric Manager partitions"). The claim's CDI spec then names each member GPU's `/dev/vfio/<group>`.

Records: `fm_partition` (an FmPartitionRecord) of each such device: planned with the partition id and one passthrough
record per member GPU; each GPU's functions are recorded (`created`, durable) before they move, and the intent to
activate before FM is asked, so the rollback of a failed prepare (NVIDIA's driver: none, its #1255), an unprepare and
the recovery after a crash at any step deactivate exactly the partition this plugin activated (its #1331: a
partition never released) and rebind exactly the functions it moved. A partition no record names is never touched
(`sweep` removes nothing). Without `--fabric-partitions` (`partitioner` None) such a device is refused at plan time.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

from dra_driver.claimconfig.api import VfioDeviceConfig
from dra_driver.inventory.catalog import AllocatableDevice, DeviceKind
from dra_driver.plugin.actuator import PrepareError
from dra_driver.plugin.checkpoint import Checkpoint, ClaimRecord, FmPartitionRecord, PreparedDevice
from dra_driver.plugin.effects.base import Catalog, ClaimPlan, Created, GpuEffect, NodeTools, Records
from dra_driver.plugin.effects.vmdevices import plan_vm_devices
from dra_driver.plugin.fmpartition import FabricPartitioner

FM_PARTITIONS_NOT_ENABLED = (
    "device {name} is a Fabric Manager partition, but this plugin does not pass partitions through "
    "(--fabric-partitions is off)"
)
VM_KINDS = (DeviceKind.VFIO, DeviceKind.VGPU, DeviceKind.FM_PARTITION)


class FmPartition(GpuEffect):
    kind = "fm-partition"

    @classmethod
    def build(cls, tools: NodeTools) -> FmPartition:
        return cls(tools.fm_partitions, tools.rediscover)

    def __init__(self, partitioner: FabricPartitioner | None, rediscover: Callable[[], None] | None = None) -> None:
        self.partitioner = partitioner
        self._rediscover = rediscover

    def plan(self, claim: ClaimPlan) -> ClaimPlan:
        return plan_vm_devices(
            claim, DeviceKind.FM_PARTITION, beside=VM_KINDS, mixed="Fabric Manager partitions", plan=self._plan
        )

    def _plan(self, device: AllocatableDevice, config: VfioDeviceConfig, record: PreparedDevice) -> PreparedDevice:
        if self.partitioner is None:
            raise PrepareError(FM_PARTITIONS_NOT_ENABLED.format(name=device.name))
        return replace(record, fm_partition=self.partitioner.plan(device, config))

    def refuse(self, claim: ClaimPlan, checkpoint: Checkpoint, catalog: Catalog) -> None:
        """A partition's GPUs are the VM's alone: no other claim may hold one of them (containers, MIG, vGPU, a
        single passthrough or another partition), in either order. The counters keep the scheduler from both
        (slices/counters.py); this is the last line of defence, against a stale allocation. Runs inside the
        checkpoint write, so two claims preparing at once see each other's records."""
        others = [o for o in checkpoint.claims.values() if o.uid != claim.ref.uid]
        mine = [(d.name, _gpus(r)) for d, r in zip(claim.devices, claim.records, strict=True)]
        for other in others:
            for held in (*other.devices, *other.allocated):
                theirs = _gpus(held)
                for name, own in mine:
                    shared = own & theirs
                    partitioned = held.fm_partition is not None or any(
                        r.fm_partition is not None and r.device == name for r in claim.records
                    )
                    if shared and partitioned:
                        raise PrepareError(
                            f"GPU {', '.join(sorted(shared))} of device {name} is held by claim {other.namespace}/"
                            f"{other.name} (uid {other.uid}, device {held.device}), and a Fabric Manager partition "
                            f"takes its GPUs whole; refusing {claim.ref.namespace}/{claim.ref.name}"
                        )

    def in_records(self, records: Records) -> bool:
        return any(r.fm_partition is not None for r in records)

    def apply(self, claim: ClaimPlan, records: Records, checkpoint: Checkpoint, created: Created) -> Records:
        if self.partitioner is None or not self.in_records(records):
            return records
        out: list[PreparedDevice] = []
        try:
            for device, record in zip(claim.devices, records, strict=True):
                if record.fm_partition is not None:
                    name = record.device

                    def recorded(made: FmPartitionRecord, name: str = name) -> None:
                        created(name, made)

                    record = replace(
                        record, fm_partition=self.partitioner.activate(device, record.fm_partition, recorded)
                    )
                out.append(record)
        finally:
            self._changed()
        return tuple(out)

    def undo(self, owner: ClaimRecord, records: Records, checkpoint: Checkpoint, *, rollback: bool) -> None:
        if self.partitioner is None:
            return
        made = [r.fm_partition for r in records if r.fm_partition is not None and r.fm_partition.started]
        for partition in made:
            self.partitioner.release(partition)
        if made:
            self._changed()

    def verify(self, owner: ClaimRecord, records: Records, checkpoint: Checkpoint, catalog: Catalog) -> list[str]:
        if self.partitioner is None:
            return []
        return [p for r in records if r.fm_partition is not None for p in self.partitioner.problems(r.fm_partition)]

    def repair(
        self, owner: ClaimRecord, records: Records, checkpoint: Checkpoint, catalog: Catalog, created: Created
    ) -> Records:
        """Members back on vfio-pci and the partition active again where this plugin activated it and Fabric
        Manager lost it (restarted in shared NVSwitch mode); plugin/fmpartition.py `repair`."""
        if self.partitioner is None:
            return records
        out: list[PreparedDevice] = []
        for record in records:
            if record.fm_partition is not None and self.partitioner.problems(record.fm_partition):
                repaired = self.partitioner.repair(catalog.get(record.device), record.fm_partition)
                if repaired is not record.fm_partition:
                    record = replace(record, fm_partition=repaired)
                    self._changed()
            out.append(record)
        return tuple(out)

    def _changed(self) -> None:
        """GPUs left or came back to the nvidia driver: the plugin re-reads the hardware and republishes."""
        if self._rediscover is not None:
            self._rediscover()


def _gpus(record: PreparedDevice) -> frozenset[str]:
    """The GPUs (by UUID) a device record takes: a partition's members, else its own GPU."""
    if record.fm_partition is not None and record.fm_partition.uuids:
        return frozenset(record.fm_partition.uuids)
    return frozenset({record.gpu_uuid}) if record.gpu_uuid is not None else frozenset()
