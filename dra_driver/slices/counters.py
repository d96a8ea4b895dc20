"""Shared counters for dynamic MIG (KEP-4815 partitionable devices).

Each GPU has one counter set, `gpu-<minor>-counter-set`:
- `memory-slice-<i>` = 1 for each memory slice: two placements that share a slice cannot coexist;
- engine and memory totals (`multiprocessors`, `copy-engines`, `decoders`, `encoders`, `jpeg-engines`,
  `ofa-engines`, `memory`), the per-dimension maximum over the GPU's profiles;
- `profile-<id>-instances` for a profile that has more placements than instances (e.g. `1g.10gb+me`:
  7 placements, 1 instance), so the scheduler cannot exceed what the hardware allows.
A MIG device consumes its placement's slices, its profile's engines and one instance; the whole GPU
consumes everything, so it excludes every partition and vice versa.

A GPU offered in shares (`--sharing-mode shares`) has the same set; one without MIG geometry gets the single
counter `gpu` = 1. Its shared device `gpu-<minor>-shared` consumes exactly what the whole GPU consumes. The
scheduler charges a multi-allocatable device's counters once, on its first allocation (KEP-4815 with
KEP-5075), so the first share takes the whole set: the whole GPU and every partition are then excluded, and
an allocated whole GPU or partition keeps shares out.

A GPU offered for passthrough (`--passthrough`) has the same set; its VFIO device `gpu-<minor>-vfio` consumes all
of it, like the whole GPU, and every container device of that GPU draws from the set too (the catalog marks them
`partitioned`), so the GPU is offered once: a VM's claim and any container claim on it exclude each other at
allocation. With `--compatibility-groups on` each consumption of a passthrough GPU's devices also names a KEP-5963
compatibility group, `native` for container devices and `vfio` for the VFIO device: a scheduler with
DRADeviceCompatibilityGroups then refuses to mix them on the set even where counters alone would allow it (a
future partial VFIO device). The field is in 1.37's API behind that alpha gate; the plugin sends it only where the API
server keeps it (`SliceSettings.compatibility_groups_served`, docs/reference/dra-in-flight.md).

A GPU offered as vGPUs (`--vgpu`) has the same set, with a `memory` counter (the GPU's memory) where it has no
MIG geometry; each vGPU slot consumes its type's share of it (the set's memory over the type's instances per GPU),
so at most that many slots of a type fit, and the whole GPU, its VFIO device and its shares (which consume all of
it) exclude every vGPU. With `--compatibility-groups on` each vGPU type is a group of its own (`vgpu-<type id>`):
the scheduler then never mixes types on one GPU (it hosts one at a time); without it, the republish after a vGPU
exists (NVML's creatable list names that type alone) and the prepare's refusal keep types apart.

A Fabric Manager partition (`--fabric-partitions`, `fm-partition-<id>`) spans several GPUs and consumes none of
their own sets (a device may consume at most two sets): the node's fabric set does it (slices/fabricpartitions.py).

Counter keys are DNS labels (`memory-slice-0`), capacity keys C identifiers (`copyEngines`): the KEP's
example names are invalid on a real API server.
"""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType
from typing import Any, Final

from dra_driver.inventory.catalog import AllocatableDevice, DeviceKind, gpu_device_name
from dra_driver.inventory.model import GpuInventory
from dra_driver.k8s.quantity import Quantity, QuantityFormat
from dra_driver.nvml.types import GpuInstanceProfile

WHOLE_GPU_COUNTER = "gpu"
# KEP-5963 compatibility groups (names scoped to the driver's pool): container use vs passthrough of one GPU.
NATIVE_GROUP = "native"
VFIO_GROUP = "vfio"
VGPU_GROUP_PREFIX = "vgpu-"  # + the vGPU type id: one group per type

# The group each kind of device names on a GPU whose devices carry groups: one row per kind (a kind with a group per
# profile or type, as vGPU, names its prefix). Container uses of a GPU share `native`, MIG partitions included: what
# excludes what among them is counted by the set's counters (memory slices, engines, instance limits), so a group
# would only repeat a counter (docs/reference/dra-in-flight.md, KEP-5963).
GROUP_OF_KIND: Final[Mapping[DeviceKind, str]] = MappingProxyType({
    DeviceKind.GPU: NATIVE_GROUP,
    DeviceKind.GPU_CONSUMABLE: NATIVE_GROUP,
    DeviceKind.GPU_SHARED: NATIVE_GROUP,
    DeviceKind.MIG_STATIC: NATIVE_GROUP,
    DeviceKind.MIG_DYNAMIC: NATIVE_GROUP,
    DeviceKind.VFIO: VFIO_GROUP,
    DeviceKind.VGPU: VGPU_GROUP_PREFIX,
    DeviceKind.FM_PARTITION: VFIO_GROUP,  # its GPUs passed through, as a single passthrough's
})


def counter_set_name(gpu: GpuInventory) -> str:
    return f"{gpu_device_name(gpu)}-counter-set"


def _engine_counters(profile: GpuInstanceProfile) -> dict[str, int]:
    return {
        "multiprocessors": profile.multiprocessors,
        "copy-engines": profile.copy_engines,
        "decoders": profile.decoders,
        "encoders": profile.encoders,
        "jpeg-engines": profile.jpeg_engines,
        "ofa-engines": profile.ofa_engines,
        "memory": profile.memory_bytes,
    }


BYTE_COUNTERS = frozenset({"memory"})


def counter_quantity(key: str, value: int) -> str:
    """A counter's value in canonical form, as the API server returns it: bytes (`memory`) with a binary suffix
    (`4864Mi`), counts in decimal SI."""
    fmt = QuantityFormat.BINARY_SI if key in BYTE_COUNTERS else QuantityFormat.DECIMAL_SI
    return str(Quantity.from_int(value, fmt))


def _instance_counter(profile: GpuInstanceProfile) -> str | None:
    return f"profile-{profile.id}-instances" if profile.instance_count < len(profile.placements) else None


def counter_totals(gpu: GpuInventory) -> dict[str, int]:
    totals: dict[str, int] = {f"memory-slice-{i}": 1 for i in range(gpu.memory_slices)}
    for profile in gpu.mig_profiles:
        for key, value in _engine_counters(profile).items():
            totals[key] = max(totals.get(key, 0), value)
        instance_key = _instance_counter(profile)
        if instance_key:
            totals[instance_key] = profile.instance_count
    if gpu.vgpu is not None and "memory" not in totals and gpu.info.memory_total_bytes:
        totals["memory"] = gpu.info.memory_total_bytes  # what vGPU slots take their share of
    if not totals:
        totals[WHOLE_GPU_COUNTER] = 1  # no MIG geometry (a GPU only shared): a set needs at least one counter
    return totals


def counter_set(gpu: GpuInventory) -> dict[str, Any]:
    return {
        "name": counter_set_name(gpu),
        "counters": {k: {"value": counter_quantity(k, v)} for k, v in sorted(counter_totals(gpu).items())},
    }


def compatibility_group(device: AllocatableDevice) -> str:
    group = GROUP_OF_KIND[device.kind]
    return f"{group}{device.vgpu.id}" if device.vgpu is not None else group


def consumption(device: AllocatableDevice, groups: frozenset[str] = frozenset()) -> list[dict[str, Any]]:
    """The device's `consumesCounters` (empty for a device that is not `partitioned`). `groups`: the UUIDs of the
    GPUs whose consumptions carry a KEP-5963 compatibility group (`--compatibility-groups on`, passthrough GPUs)."""
    if not device.partitioned:
        return []
    if device.vgpu is not None:
        used = {"memory": counter_totals(device.gpu).get("memory", 0) // max(device.vgpu.max_instances, 1)}
    elif device.profile is None or device.placement is None:
        used = counter_totals(device.gpu)  # the whole GPU, its shared device, or its VFIO device
    else:
        used = {f"memory-slice-{i}": 1 for i in device.placement.slices}
        used.update(_engine_counters(device.profile))
        instance_key = _instance_counter(device.profile)
        if instance_key:
            used[instance_key] = 1
    out: dict[str, Any] = {
        "counterSet": counter_set_name(device.gpu),
        "counters": {k: {"value": counter_quantity(k, v)} for k, v in sorted(used.items())},
    }
    if device.gpu.uuid in groups:
        out["compatibilityGroups"] = [compatibility_group(device)]
    return [out]

