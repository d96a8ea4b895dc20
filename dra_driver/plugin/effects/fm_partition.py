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

from dra_driver.inventory.catalog import AllocatableDevice, DeviceKind
from dra_driver.plugin.actuator import PrepareError
from dra_driver.plugin.checkpoint import Checkpoint, FmPartitionRecord, PreparedDevice
from dra_driver.plugin.effects.base import Catalog, ClaimPlan, NodeTools
from dra_driver.plugin.effects.vmdevices import Recorded, VmDeviceEffect, held_elsewhere, holder, refusing
from dra_driver.plugin.fmpartition import FabricPartitioner

FM_PARTITIONS_NOT_ENABLED = (
    "device {name} is a Fabric Manager partition, but this plugin does not pass partitions through "
    "(--fabric-partitions is off)"
)


class FmPartition(VmDeviceEffect[FabricPartitioner, FmPartitionRecord]):
    kind = "fm-partition"
    device_kind = DeviceKind.FM_PARTITION
    held_as = "fm_partition"
    mixed = "Fabric Manager partitions"
    not_enabled = FM_PARTITIONS_NOT_ENABLED

    def __init__(self, tools: NodeTools) -> None:
        super().__init__(tools.fm_partitions, tools.rediscover)

    def refuse(self, claim: ClaimPlan, checkpoint: Checkpoint, catalog: Catalog) -> None:
        """A partition's GPUs are the VM's alone: no other claim may hold one of them (containers, MIG, vGPU, a
        single passthrough or another partition), in either order. The counters keep the scheduler from both
        (slices/counters.py); this is the last line of defence, against a stale allocation. Runs inside the
        checkpoint write, so two claims preparing at once see each other's records."""
        if self.neither_side_holds(claim, checkpoint):
            return
        pairs = zip(claim.devices, claim.records, strict=True)
        mine = [(d.name, _gpus(r), r.fm_partition is not None) for d, r in pairs]
        for other, held in held_elsewhere(claim, checkpoint):
            theirs = _gpus(held)
            for name, own, partition in mine:
                shared = own & theirs
                if shared and (partition or held.fm_partition is not None):
                    raise PrepareError(
                        f"GPU {', '.join(sorted(shared))} of device {name} is held by {holder(other, held)}, and a "
                        f"Fabric Manager partition takes its GPUs whole; {refusing(claim)}"
                    )

    def _of(self, device: PreparedDevice) -> FmPartitionRecord | None:
        return device.fm_partition

    def _make(
        self,
        tool: FabricPartitioner,
        device: AllocatableDevice,
        partition: FmPartitionRecord,
        recorded: Recorded[FmPartitionRecord],
        owner: str,
    ) -> FmPartitionRecord:
        return tool.activate(device, partition, recorded)

    def _remove(self, tool: FabricPartitioner, device: PreparedDevice, partition: FmPartitionRecord) -> None:
        tool.release(partition)

    def _remake(
        self, tool: FabricPartitioner, device: AllocatableDevice, partition: FmPartitionRecord
    ) -> FmPartitionRecord:
        """Members back on vfio-pci and the partition active again where this plugin activated it and Fabric
        Manager lost it (restarted in shared NVSwitch mode); plugin/fmpartition.py `repair`."""
        return tool.repair(device, partition)


def _gpus(record: PreparedDevice) -> frozenset[str]:
    """The GPUs (by UUID) a device record takes: a partition's members, else its own GPU."""
    if record.fm_partition is not None and record.fm_partition.uuids:
        return frozenset(record.fm_partition.uuids)
    return frozenset({record.gpu_uuid}) if record.gpu_uuid is not None else frozenset()
