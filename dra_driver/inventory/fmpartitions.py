"""The offer of Fabric Manager partitions (`--fabric-partitions`; docs/passthrough.md "Fabric Manager partitions"):
one `fm-partition-<id>` device per partition FM lists whose every GPU this node's inventory knows (a partition with
a GPU the plugin cannot see is not offered: it could not be checked or bound)."""

from __future__ import annotations

from dra_driver.inventory.catalog import AllocatableDevice, DeviceKind
from dra_driver.inventory.model import NodeInventory
from dra_driver.nvml.fabricmanager import FabricPartition


def partition_device_name(partition_id: int) -> str:
    return f"fm-partition-{partition_id}"


def partition_devices(
    inventory: NodeInventory, partitions: tuple[FabricPartition, ...]
) -> dict[str, AllocatableDevice]:
    """The partitions as devices, by name, in FM's order; each names its member GPUs (`gpu`: the first)."""
    by_uuid = {g.uuid: g for g in inventory.gpus}
    out: dict[str, AllocatableDevice] = {}
    for partition in partitions:
        members = tuple(by_uuid.get(g.uuid) for g in partition.gpus)
        known = tuple(m for m in members if m is not None)
        if not known or len(known) != len(members):
            continue
        name = partition_device_name(partition.id)
        out[name] = AllocatableDevice(
            name=name,
            kind=DeviceKind.FM_PARTITION,
            gpu=known[0],
            partition_id=partition.id,
            members=known,
        )
    return out


def with_partitions(
    devices: dict[str, AllocatableDevice], inventory: NodeInventory, partitions: tuple[FabricPartition, ...]
) -> dict[str, AllocatableDevice]:
    """The node's devices with the partitions added (what keeps them and their GPUs' other uses apart at allocation
    is the slices' fabric counter set, slices/fabricpartitions.py)."""
    return {**devices, **partition_devices(inventory, partitions)}
