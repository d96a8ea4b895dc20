"""Inventory + node settings -> the desired ResourceSlices of this node's pool (pure).

Layout rules (resource.k8s.io/v1 validation, docs/reference/kubernetes-dra.md §3.6):
- at most 128 devices per slice, 64 when any device in it has taints, consumes counters or (1.36+) carries a
  list-type attribute (1.35+);
- dynamic MIG on 1.35+: counter sets live in their own slice(s) (≤ 8 sets each), devices elsewhere;
  on 1.34: one slice per partitioned GPU holding its counter set and its devices (the combined layout), and one
  slice per shared IOMMU group (slices/iommu.py) holding its GPUs' sets, the group's set and all their devices,
  within 1.34's limits (≤ 32 counters across the slice's sets, ≤ 1024 consumed across its devices); a group that
  does not fit offers none of its GPUs for passthrough (its VFIO devices are left out: safe, never a clash);
- every slice carries the pool's generation and the total slice count.
Devices are ordered by GPU, whole GPU first, then its shared device (`--sharing-mode shares`), then its MIG
devices smallest profile first, each profile's placements from the END of the GPU (`device_order`): the
scheduler takes the first device that fits, so "any MIG device" gets the smallest partition, small partitions
fill from the top and leave slice 0:4 free for 4g/7g partitions as long as possible.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from dra_driver.inventory.catalog import AllocatableDevice, DeviceKind
from dra_driver.inventory.passthrough import NO_PASSTHROUGH, PassthroughSettings
from dra_driver.inventory.sharing import EXCLUSIVE, SharingSettings
from dra_driver.inventory.vgpu import NO_VGPU, VgpuSettings
from dra_driver.nvml.types import SystemInfo
from dra_driver.slices.attributes import (
    consumable_capacity,
    device_attributes,
    device_capacity,
    shared_capacity,
    vfio_capacity,
    vgpu_capacity,
)
from dra_driver.slices.counters import consumption, counter_set
from dra_driver.slices.fabricpartitions import (
    FabricCounters,
    fabric_consumption,
    fabric_counter_set,
    fabric_counters,
    offered_partitions,
)
from dra_driver.slices.iommu import SharedGroup, group_consumption, group_counter_set, shared_groups
from dra_driver.slices.nodeallocatable import NO_OVERHEAD, node_allocatable
from dra_driver.slices.partitiontypes import (
    PARTITION_TYPE_ATTRIBUTE,
    partition_type,
    summarizable,
    with_partition_types,
)

MAX_DEVICES = 128
MAX_DEVICES_ADVANCED = 64
MAX_COUNTER_SETS = 8
MAX_SHARED_COUNTERS_1_34 = 32  # 1.34: counters across all sets of one slice
MAX_CONSUMED_COUNTERS_1_34 = 1024  # 1.34: counters consumed across all devices of one slice
MAX_NAME = 253

JsonObject = dict[str, Any]


@dataclass(frozen=True)
class SliceSettings:
    driver_name: str
    node_name: str
    kube_version: tuple[int, int] = (1, 35)
    # device name -> taints ({key, value, effect}) for devices known to be unhealthy
    taints: Mapping[str, Sequence[JsonObject]] = field(default_factory=dict)
    # share sizes (step, defaults) of the `gpu-<minor>-shared` devices the catalog holds
    sharing: SharingSettings = EXCLUSIVE
    # `--list-attributes` (chart value listAttributes): list-type attributes (KEP-5491, gate DRAListTypeAttributes,
    # alpha in 1.36, off by default), used from 1.36 only: older servers have no list fields.
    list_attributes: bool = False
    # `--passthrough`: the node facts the VFIO devices publish, and `--compatibility-groups`.
    passthrough: PassthroughSettings = NO_PASSTHROUGH
    # `--vgpu`: the GPUs offered as vGPUs (the catalog reads it; the slices' vGPU devices say the rest).
    vgpu: VgpuSettings = NO_VGPU
    # `--fabric-partitions`: Fabric Manager's partitions (the inventory's) offered as fm-partition-<id> devices.
    fabric_partitions: bool = False
    # Whether the API server keeps KEP-5963 compatibility groups (k8s/serverfeatures.py probes it at start): False
    # sends none even with `--compatibility-groups on`, since a server that drops them would see every pass differ.
    compatibility_groups_served: bool = True
    # `--node-allocatable-overhead` (KEP-5517): resource name -> perPod overhead on every container device, sent only
    # where the API server keeps the field (`node_allocatable_served`: the plugin probes it at start).
    node_allocatable_overhead: Mapping[str, str] = field(default_factory=lambda: NO_OVERHEAD)
    node_allocatable_served: bool = False
    # Whether the API server keeps KEP-5677's `spec.partitionTypeAttribute` (DRAPartitionableDevicesType, probed at
    # start): then counter-consuming devices carry `partitionType` and their slices name it, where the pool is one
    # kube-controller-manager can summarise (slices/partitiontypes.py).
    partition_types_served: bool = False

    @property
    def split_counters(self) -> bool:
        return self.kube_version >= (1, 35)

    @property
    def taint_effect_none(self) -> bool:
        """DeviceTaint effect None exists from 1.35 (docs/reference/kubernetes-dra.md, DeviceTaint): a 1.34 server
        with DRADeviceTaints on refuses the slice, so such (informational) taints are left out below 1.35."""
        return self.kube_version >= (1, 35)

    @property
    def publishes_lists(self) -> bool:
        return self.list_attributes and self.kube_version >= (1, 36)


def device_order(device: AllocatableDevice) -> tuple[int, int, int, int, int, int, int]:
    """Where a device stands in the pool (docs/resourceslices.md, "Device order"). kube-scheduler takes the
    first device that fits in slice order, so the order is the placement policy:

    - GPU by GPU (index ascending): first fit then fills the lowest GPU that has room and leaves the later
      ones untouched, for whole GPUs and 7g partitions (a partly used GPU cannot give its whole self or a
      7g: the counters exclude them, so such requests skip to the first untouched GPU);
    - per GPU the whole GPU, then its shared device, then its MIG devices smallest first (memory slices,
      compute slices, memory, profile ID: `1g.10gb` before `1g.10gb+me` before `1g.20gb` before `2g`...),
      so "any MIG device" gets the smallest partition that satisfies it;
    - per profile the placements from the END of the GPU, so small partitions fill from the top and leave
      slice 0:4 free for 4g/7g partitions as long as possible.

    A pure function of the device: the order never depends on allocations, so it is stable across
    re-discoveries (zero writes at steady state)."""
    # The VFIO device last, after the MIG devices: nothing a container asks for is ever found after it.
    # A GPU's vGPU slots after its VFIO device: per type largest first (fewest instances), then by slot.
    whole_first = {DeviceKind.GPU: 0, DeviceKind.GPU_CONSUMABLE: 0, DeviceKind.GPU_SHARED: 1,
                   DeviceKind.VFIO: 3, DeviceKind.VGPU: 4}.get(device.kind, 2)
    if device.partition_id is not None:  # a Fabric Manager partition: after its first GPU's devices, largest first
        return (device.gpu.info.index, 5, -len(device.members), device.partition_id, 0, 0, 0)
    if device.vgpu is not None:
        return (device.gpu.info.index, whole_first, device.vgpu.max_instances, device.vgpu.id, device.slot, 0, 0)
    profile = device.profile
    if profile is None:
        return (device.gpu.info.index, whole_first, 0, 0, 0, -1, 0)
    placement_start = device.placement.start if device.placement else 0
    memory_slices = device.placement.size if device.placement else 0
    return (
        device.gpu.info.index,
        whole_first,
        memory_slices,
        profile.slice_count,
        profile.memory_mib,
        profile.id,
        -placement_start,
    )


def build_device(
    device: AllocatableDevice,
    system: SystemInfo,
    settings: SliceSettings,
    groups: frozenset[str] = frozenset(),
    shared: SharedGroup | None = None,
    fabric: FabricCounters | None = None,
) -> JsonObject:
    out: JsonObject = {
        "name": device.name,
        "attributes": device_attributes(device, system, settings.publishes_lists, settings.passthrough),
    }
    if device.kind is DeviceKind.VFIO:
        out["capacity"] = vfio_capacity(device.gpu, settings.passthrough)
    elif device.kind is DeviceKind.VGPU:
        out["capacity"] = vgpu_capacity(device)
    elif device.kind is DeviceKind.GPU_SHARED:
        # KEP-5075: many claims each get a share (shareID) and consume part of the capacities.
        out["capacity"] = shared_capacity(device, settings.sharing)
        out["allowMultipleAllocations"] = True
    elif device.kind is DeviceKind.GPU_CONSUMABLE:
        # `--consumable-shares`: the whole GPU itself, in NVIDIA's shapes.
        out["capacity"] = consumable_capacity(device, settings.sharing.consumable)
        out["allowMultipleAllocations"] = True
    elif device.kind is not DeviceKind.FM_PARTITION:  # a partition's size is its gpuCount attribute
        out["capacity"] = device_capacity(device)
    counters = consumption(device, groups)
    if shared is not None:  # the GPU shares its IOMMU group with another GPU: the group's set too
        counters.append(group_consumption(device, shared))
    if (on_fabric := fabric_consumption(device, fabric)) is not None:  # a Fabric Manager partition or a member GPU's
        counters.append(on_fabric)
    if counters:
        out["consumesCounters"] = counters
        if settings.partition_types_served:
            out["attributes"][PARTITION_TYPE_ATTRIBUTE] = {"string": partition_type(device)}
    allocatable = node_allocatable(device.kind, settings.node_allocatable_overhead) if (
        settings.node_allocatable_served) else None
    if allocatable:
        out["nodeAllocatableResources"] = allocatable
    taints = [
        dict(t) for t in settings.taints.get(device.name, ()) if settings.taint_effect_none or t.get("effect") != "None"
    ]
    if taints:
        out["taints"] = taints
    return out


LIST_VALUE_KINDS = ("ints", "bools", "strings", "versions")


def _advanced(device: JsonObject) -> bool:
    """Taints, counters or a list-type attribute (KEP-5491) make a device count against the 64-device limit."""
    if device.get("taints") or device.get("consumesCounters"):
        return True
    return any(k in value for value in (device.get("attributes") or {}).values() for k in LIST_VALUE_KINDS)


def _pack(devices: list[JsonObject]) -> list[list[JsonObject]]:
    """Greedy packing in order; a slice closes at 128 devices, or at 64 once it holds an advanced one."""
    chunks: list[list[JsonObject]] = []
    current: list[JsonObject] = []
    advanced = False
    for dev in devices:
        next_advanced = advanced or _advanced(dev)
        limit = MAX_DEVICES_ADVANCED if next_advanced else MAX_DEVICES
        if len(current) + 1 > limit:
            chunks.append(current)
            current, next_advanced = [], _advanced(dev)
        current.append(dev)
        advanced = next_advanced
    if current:
        chunks.append(current)
    return chunks


def name_prefix(settings: SliceSettings) -> str:
    """`<node>-<driver with dashes>-`: the publisher's `generateName`. The API server cuts a prefix to 58
    characters before it appends 5 random ones, so any node name gives a valid name."""
    return f"{settings.node_name}-{settings.driver_name.replace('.', '-')}-"


def slice_name(settings: SliceSettings, index: int) -> str:
    """A fixed name for offline output (`dra-driver inventory --slices`, which `kubectl apply` needs). The
    publisher ignores it: it creates slices with `generateName` (see publisher.py)."""
    base = name_prefix(settings)[:-1]
    suffix = f"-{index}"
    if len(base) + len(suffix) > MAX_NAME:
        digest = hashlib.sha256(base.encode()).hexdigest()[:10]
        base = f"{base[: MAX_NAME - len(suffix) - 11]}-{digest}"
    return base + suffix


def _combined_layout(
    ordered: list[AllocatableDevice],
    system: SystemInfo,
    settings: SliceSettings,
    groups: frozenset[str],
    shared: Mapping[str, SharedGroup],
) -> list[JsonObject]:
    """1.34: a device may consume only counter sets of its own slice. One slice per shared IOMMU group (its GPUs'
    sets, the group's set and every device of its GPUs) where it fits in one slice; else the group's VFIO devices
    are left out and its GPUs laid out like any other. Then one slice per other partitioned GPU, and plain slices
    for the devices that consume nothing. A Fabric Manager partition consumes several GPUs' sets, which no slice of
    this layout holds together: it is left out (offered from 1.35 on)."""
    ordered = [d for d in ordered if d.kind is not DeviceKind.FM_PARTITION]
    specs: list[JsonObject] = []
    placed: set[str] = set()  # GPU UUIDs laid out with their group
    dropped: set[str] = set()  # names of VFIO devices of groups that do not fit
    for group in sorted({g.group: g for g in shared.values()}.values(), key=lambda g: g.group):
        members = [d for d in ordered if d.gpu.uuid in group.gpus]
        gpus = sorted({d.gpu.info.index: d.gpu for d in members if d.partitioned}.items())
        sets = [counter_set(gpu) for _, gpu in gpus] + [group_counter_set(group)]
        built = [build_device(d, system, settings, groups, group) for d in members]
        if _fits_1_34(sets, built):
            specs.append({"sharedCounters": sets, "devices": built})
            placed.update(group.gpus)
        else:
            dropped.update(d.name for d in members if d.kind is DeviceKind.VFIO)
    rest = [d for d in ordered if d.gpu.uuid not in placed and d.name not in dropped]
    plain = [build_device(d, system, settings, groups) for d in rest if not d.partitioned]
    specs.extend({"devices": chunk} for chunk in _pack(plain))
    for _, gpu in sorted({d.gpu.info.index: d.gpu for d in rest if d.partitioned}.items()):
        own = [build_device(d, system, settings, groups) for d in rest if d.partitioned and d.gpu.uuid == gpu.uuid]
        for chunk in _pack(own):
            specs.append({"sharedCounters": [counter_set(gpu)], "devices": chunk})
    return specs


def _fits_1_34(sets: list[JsonObject], devices: list[JsonObject]) -> bool:
    """One 1.34 slice holds these sets and devices (its devices in one chunk, its counter totals within bounds)."""
    counters = sum(len(s["counters"]) for s in sets)
    consumed = sum(len(c["counters"]) for d in devices for c in d.get("consumesCounters", ()))
    return len(_pack(devices)) == 1 and counters <= MAX_SHARED_COUNTERS_1_34 and consumed <= MAX_CONSUMED_COUNTERS_1_34


def _partition_types(specs: list[JsonObject], driver: str) -> list[JsonObject]:
    """The slices naming `partitionType` where the pool can be summarised, else without the attribute at all."""
    devices = [d for spec in specs for d in spec.get("devices") or ()]
    if summarizable(devices):
        return with_partition_types(specs, driver)
    for device in devices:  # built above for this call only: nobody else holds them
        (device.get("attributes") or {}).pop(PARTITION_TYPE_ATTRIBUTE, None)
    return specs


def build_slices(
    system: SystemInfo,
    devices: Mapping[str, AllocatableDevice],
    settings: SliceSettings,
    generation: int,
) -> list[JsonObject]:
    """The complete, deterministic desired state of the pool (at least one slice, possibly empty)."""
    ordered = sorted(devices.values(), key=device_order)
    # `--compatibility-groups on`: the consumptions of every device of a GPU offered for passthrough or as vGPUs
    # name a group.
    groups = (
        frozenset(d.gpu.uuid for d in ordered if d.kind in (DeviceKind.VFIO, DeviceKind.VGPU))
        if settings.passthrough.compatibility_groups and settings.compatibility_groups_served
        else frozenset()
    )
    specs: list[JsonObject] = []  # each: {"devices": [...]} and/or {"sharedCounters": [...]}
    shared = shared_groups(ordered, settings.passthrough.iommu_groups)
    if settings.split_counters:
        ordered = offered_partitions(ordered, frozenset(shared))
        fabric = fabric_counters(ordered)
        partitioned_gpus = sorted({d.gpu.info.index: d.gpu for d in ordered if d.partitioned}.items())
        sets = [counter_set(gpu) for _, gpu in partitioned_gpus]
        sets += [group_counter_set(g) for g in sorted({g.group: g for g in shared.values()}.values(),
                                                      key=lambda g: g.group)]
        sets += [fabric_counter_set(fabric)] if fabric is not None else []
        for i in range(0, len(sets), MAX_COUNTER_SETS):
            specs.append({"sharedCounters": sets[i : i + MAX_COUNTER_SETS]})
        built = [build_device(d, system, settings, groups, shared.get(d.gpu.uuid), fabric) for d in ordered]
        specs.extend({"devices": chunk} for chunk in _pack(built))
    else:
        specs = _combined_layout(ordered, system, settings, groups, shared)
    if not specs:
        specs.append({"devices": []})  # an empty pool still says "this node has nothing"
    if settings.partition_types_served:
        specs = _partition_types(specs, settings.driver_name)
    return [
        {
            "apiVersion": "resource.k8s.io/v1",
            "kind": "ResourceSlice",
            "metadata": {"name": slice_name(settings, i)},
            "spec": {
                "driver": settings.driver_name,
                "nodeName": settings.node_name,
                "pool": {"name": settings.node_name, "generation": generation, "resourceSliceCount": len(specs)},
                **content,
            },
        }
        for i, content in enumerate(specs)
    ]
