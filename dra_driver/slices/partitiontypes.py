"""KEP-5677 partition types (gate DRAPartitionableDevicesType, alpha in 1.37): the `partitionType` attribute and the
slice's `spec.partitionTypeAttribute` naming it, so that a ResourcePoolStatusRequest reports per partition type how
many devices the pool has and how many still fit (`partitionSummary`). Pure.

What kube-controller-manager 1.37.2 accepts decides the values (docs/reference/dra-in-flight.md, "Partition types"):
- the API server refuses the field on a slice none of whose devices consumes counters, and on one where such a device
  lacks the attribute or carries it as anything but a string;
- the controller groups the pool's counter-consuming devices by the attribute's value and requires every device of a
  group to consume exactly the same counters (counter set names included), else the pool gets a
  `PartitionCostMismatch` validation error and no summary; more than 32 groups is `PartitionSummaryOverCap`.

Each GPU has its own counter set and each MIG placement its own memory slices, so a type is scoped to its GPU
(`gpu-0/whole`, `gpu-0/shared`, `gpu-0/vfio`, `gpu-0/vgpu-<type id>`), a MIG type to its placement
(`gpu-0/1g.10gb@6`), and a device over several GPUs (a Fabric Manager partition) is a type of its own (its name):
the only devices that share a cost in this driver's counters are a GPU's vGPU slots of one type.
The plugin sends the attribute and the field only where the pool passes both controller checks (`summarizable`):
a pool over 32 types (dynamic MIG on more than one GPU) publishes neither, rather than a pool status error.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any, Final

from dra_driver.inventory.catalog import AllocatableDevice, DeviceKind, gpu_device_name

PARTITION_TYPE_ATTRIBUTE: Final = "partitionType"
MAX_PARTITION_TYPES: Final = 32  # the controller's cap on partitionSummary entries (maxStatusListItems)
MAX_STRING: Final = 64

_SHAPE_OF_KIND: Final[Mapping[DeviceKind, str]] = {
    DeviceKind.GPU: "whole",
    DeviceKind.GPU_CONSUMABLE: "whole",
    DeviceKind.GPU_SHARED: "shared",
    DeviceKind.VFIO: "vfio",
}


def partition_type(device: AllocatableDevice) -> str:
    """The device's partition type: its GPU, then its shape (a MIG type names its profile and first memory slice,
    a vGPU slot its type id)."""
    gpu = gpu_device_name(device.gpu)
    if device.vgpu is not None:
        shape = f"vgpu-{device.vgpu.id}"
    elif device.profile is not None:
        start = device.placement.start if device.placement is not None else 0
        shape = f"{device.profile.name}@{start}"
    elif device.kind in _SHAPE_OF_KIND:
        shape = _SHAPE_OF_KIND[device.kind]
    else:  # a device over several GPUs (a Fabric Manager partition): a type of its own, so one cost
        return device.name[:MAX_STRING]
    return f"{gpu}/{shape}"[:MAX_STRING]


def _cost(device: Mapping[str, Any]) -> tuple[tuple[str, str, str], ...]:
    """The device's counter cost as the controller compares it (`consumesCountersKey`): set, counter and value."""
    return tuple(sorted(
        (str(c.get("counterSet")), str(name), str((value or {}).get("value")))
        for c in device.get("consumesCounters") or ()
        for name, value in (c.get("counters") or {}).items()
    ))


def summarizable(devices: Iterable[Mapping[str, Any]]) -> bool:
    """Whether kube-controller-manager would summarise these (built) devices: at least one consumes counters, each
    such device carries the attribute, the devices of one type consume the same counters, at most 32 types."""
    costs: dict[str, tuple[tuple[str, str, str], ...]] = {}
    for device in devices:
        if not device.get("consumesCounters"):
            continue
        value = (device.get("attributes") or {}).get(PARTITION_TYPE_ATTRIBUTE, {}).get("string")
        if not isinstance(value, str):
            return False
        if costs.setdefault(value, _cost(device)) != _cost(device):
            return False
    return 0 < len(costs) <= MAX_PARTITION_TYPES


def with_partition_types(specs: Sequence[dict[str, Any]], driver: str) -> list[dict[str, Any]]:
    """The slice specs with `partitionTypeAttribute` on each one that has a counter-consuming device (the API server
    refuses it on any other)."""
    name = f"{driver}/{PARTITION_TYPE_ATTRIBUTE}"
    return [
        {**spec, "partitionTypeAttribute": name} if any(d.get("consumesCounters") for d in spec.get("devices") or ())
        else dict(spec)
        for spec in specs
    ]
