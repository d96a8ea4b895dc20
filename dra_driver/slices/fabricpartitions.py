"""The counters that keep a Fabric Manager partition and every other use of its GPUs apart (docs/passthrough.md
"Fabric Manager partitions").

A partition is several GPUs, and the API lets a device consume at most two counter sets
(`ResourceSliceMaxDeviceCounterConsumptionsPerDevice` = 2, k8s.io/api/resource/v1), so it cannot take each member's
own set. Instead the node publishes one more set, `fabric-partitions-counter-set`, with one counter per GPU that is a
member of an offered partition, `gpu-<minor>` = the number of that GPU's other devices (at least 1), as the shared
IOMMU group's set does (slices/iommu.py):

- every other device of such a GPU (whole GPU, MIG, shares, VFIO, vGPU) consumes 1 of its GPU's counter;
- a partition consumes all of each member's counter, in one consumption.

So an allocated partition leaves nothing of its GPUs allocatable, any allocated use of a member GPU keeps every
partition holding it out, and two partitions sharing a GPU exclude each other; the GPU's other uses never run short
among themselves (one unit per device, a multi-allocatable device charged once, KEP-4815 with KEP-5075).

Published only where counter sets stand in slices of their own (1.35 and later, `SliceSettings.split_counters`). A
partition with a GPU in a shared IOMMU group is not offered: that GPU's devices already consume two sets.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from dra_driver.inventory.catalog import AllocatableDevice, DeviceKind, gpu_device_name
from dra_driver.k8s.quantity import Quantity

FABRIC_COUNTER_SET = "fabric-partitions-counter-set"


@dataclass(frozen=True)
class FabricCounters:
    """Per member GPU (by UUID): its counter's name and value."""

    counters: Mapping[str, tuple[str, int]]


def offered_partitions(ordered: Sequence[AllocatableDevice], shared_gpus: frozenset[str]) -> list[AllocatableDevice]:
    """The devices without the partitions that hold a GPU of a shared IOMMU group."""
    return [
        d
        for d in ordered
        if d.kind is not DeviceKind.FM_PARTITION or not any(m.uuid in shared_gpus for m in d.members)
    ]


def fabric_counters(ordered: Sequence[AllocatableDevice]) -> FabricCounters | None:
    partitions = [d for d in ordered if d.kind is DeviceKind.FM_PARTITION]
    if not partitions:
        return None
    members = {m.uuid: m for d in partitions for m in d.members}
    counters = {
        uuid: (
            gpu_device_name(gpu),
            max(1, sum(1 for d in ordered if d.kind is not DeviceKind.FM_PARTITION and d.gpu.uuid == uuid)),
        )
        for uuid, gpu in members.items()
    }
    return FabricCounters(counters)


def fabric_counter_set(fabric: FabricCounters) -> dict[str, Any]:
    return {
        "name": FABRIC_COUNTER_SET,
        "counters": {name: {"value": str(Quantity.from_int(n))} for name, n in sorted(fabric.counters.values())},
    }


def fabric_consumption(device: AllocatableDevice, fabric: FabricCounters | None) -> dict[str, Any] | None:
    """What the device takes of the fabric set: all of each member's counter (a partition), 1 of its GPU's (another
    device of a member GPU), or nothing."""
    if fabric is None:
        return None
    if device.kind is DeviceKind.FM_PARTITION:
        used = dict(fabric.counters[m.uuid] for m in device.members)
    elif device.gpu.uuid in fabric.counters:
        name, _ = fabric.counters[device.gpu.uuid]
        used = {name: 1}
    else:
        return None
    return {
        "counterSet": FABRIC_COUNTER_SET,
        "counters": {k: {"value": str(Quantity.from_int(v))} for k, v in sorted(used.items())},
    }
