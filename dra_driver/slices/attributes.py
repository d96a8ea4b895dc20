"""Device attributes and capacities, named as users of NVIDIA DRA drivers already know them."""

from __future__ import annotations

import re
from typing import Any

from dra_driver.inventory.catalog import AllocatableDevice, DeviceKind
from dra_driver.inventory.model import GpuInventory, GpuTopology
from dra_driver.inventory.passthrough import NO_PASSTHROUGH, PassthroughSettings, pci_ids, vfio_uuid
from dra_driver.inventory.sharing import MIB, ConsumableMode, ConsumableShares, SharingSettings, shared_memory_bytes
from dra_driver.k8s.quantity import Quantity, QuantityFormat
from dra_driver.nvml.types import GpuInstanceProfile, SystemInfo

Attributes = dict[str, dict[str, Any]]
Capacity = dict[str, dict[str, str]]
SharedCapacity = dict[str, dict[str, Any]]  # with requestPolicy

SHARE_COMPUTE_TOTAL = 100  # `compute` of a shared device: percent of the GPU's SMs

STANDARD_PCI_BUS_ID = "resource.kubernetes.io/pciBusID"
STANDARD_PCIE_ROOT = "resource.kubernetes.io/pcieRoot"
# KEP-6072 (GA 1.37, no gate): the host NUMA node of the device, omitted when the kernel does not know it (-1).
STANDARD_NUMA_NODE = "resource.kubernetes.io/numaNode"
MAX_STRING = 64


def semver(text: str) -> str:
    """Driver-style versions as semver 2.0.0: "580.105.08" -> "580.105.8", "13.0" -> "13.0.0"."""
    parts = [str(int(p)) for p in re.findall(r"\d+", text)[:3]]
    while len(parts) < 3:
        parts.append("0")
    return ".".join(parts)


def _string(value: str) -> dict[str, str]:
    return {"string": value[:MAX_STRING]}


def numa_node_attribute(topology: GpuTopology, list_form: bool) -> dict[str, Any] | None:
    """`resource.kubernetes.io/numaNode`: an int, or with list-type attributes (KEP-5491) an int list of the
    physical node first, then the same-socket nodes at the smallest distance (KEP-6072). None when unknown."""
    if topology.numa_node is None:
        return None
    if not list_form:
        return {"int": topology.numa_node}
    return {"ints": [topology.numa_node, *topology.numa_neighbours]}


def gpu_common_attributes(gpu: GpuInventory, system: SystemInfo, list_attributes: bool = False) -> Attributes:
    """Identity and topology every device of a GPU carries (whole GPU and its MIG devices). `list_attributes`:
    publish the list form of the standard numaNode (needs DRAListTypeAttributes, alpha in 1.36)."""
    info = gpu.info
    attrs: Attributes = {
        "productName": _string(info.name),
        "brand": _string(info.brand),
        "architecture": _string(info.architecture.label),
        "cudaComputeCapability": {"version": semver(".".join(map(str, info.cuda_compute_capability)))},
        "driverVersion": {"version": semver(system.driver_version)},
        "cudaDriverVersion": {"version": semver(system.cuda_version)},
        "index": {"int": info.index},
        "minor": {"int": info.minor},
        STANDARD_PCI_BUS_ID: _string(info.pci_bus_id),
    }
    topo = gpu.topology
    if topo.pcie_root:
        attrs[STANDARD_PCIE_ROOT] = _string(topo.pcie_root)
    if topo.numa_node is not None:
        attrs["numaNode"] = {"int": topo.numa_node}  # the driver's own name, kept as an int for existing selectors
    standard_numa = numa_node_attribute(topo, list_attributes)
    if standard_numa is not None:
        attrs[STANDARD_NUMA_NODE] = standard_numa
    if topo.nvlink_domain:
        attrs["nvlinkDomain"] = _string(topo.nvlink_domain)
    return attrs


def fm_partition_attributes(device: AllocatableDevice) -> Attributes:
    """A Fabric Manager partition's attributes: FM's partition id, how many GPUs, their product (one board: one
    product). No per-GPU attribute (PCI address, NUMA node): the device is several GPUs; its device metadata names
    their addresses once prepared."""
    assert device.partition_id is not None
    return {
        "type": _string(DeviceKind.FM_PARTITION.type_attribute),
        "partitionID": {"int": device.partition_id},
        "gpuCount": {"int": len(device.members)},
        "productName": _string(device.gpu.info.name),
    }


def vfio_attributes(gpu: GpuInventory, passthrough: PassthroughSettings, list_attributes: bool = False) -> Attributes:
    """The VFIO device's attributes: NVIDIA's set (its `VfioDeviceInfo.GetDevice`), so their claims and KubeVirt's
    selectors match, plus the driver's own `numaNode` the GPU device has. Nothing here comes from NVML while the GPU
    is bound to vfio-pci: every value is the GPU's as discovered, or derived from its PCI address (`uuid`), so the
    device never changes across the rebind."""
    device_id, vendor_id = pci_ids(gpu.info.pci_device_id)
    attrs: Attributes = {
        "type": _string(DeviceKind.VFIO.type_attribute),
        "uuid": _string(vfio_uuid(gpu.info.pci_bus_id)),
        "deviceID": _string(device_id),
        "vendorID": _string(vendor_id),
        "productName": _string(gpu.info.name),
        "iommuFDEnabled": {"bool": passthrough.iommufd},
        STANDARD_PCI_BUS_ID: _string(gpu.info.pci_bus_id),
    }
    topo = gpu.topology
    if topo.pcie_root:
        attrs[STANDARD_PCIE_ROOT] = _string(topo.pcie_root)
    if topo.numa_node is not None:
        attrs["numaNode"] = {"int": topo.numa_node}
    standard_numa = numa_node_attribute(topo, list_attributes)
    if standard_numa is not None:
        attrs[STANDARD_NUMA_NODE] = standard_numa
    return attrs


def vfio_capacity(gpu: GpuInventory, passthrough: PassthroughSettings) -> Capacity:
    """`addressableMemory` (NVIDIA's name): what a VM maps for the GPU, from its PCI BARs; none when unknown."""
    size = passthrough.addressable_memory.get(gpu.info.pci_bus_id)
    return {} if size is None else {"addressableMemory": {"value": _binary(size)}}


def vgpu_attributes(device: AllocatableDevice, system: SystemInfo, list_attributes: bool = False) -> Attributes:
    """A vGPU slot's attributes: its type (`vgpuType`, the name NVIDIA's tools print, and `vgpuTypeId`), its
    GPU's identity and topology with the GPU as `parentUUID` / `parentPciBusID`. No `resource.kubernetes.io/pciBusID`:
    the vGPU's PCI function (an SR-IOV VF) is chosen at prepare, and its device metadata names it (KubeVirt passes
    that address to the VM; a slice attribute naming the GPU itself would hand the VM the physical GPU)."""
    assert device.vgpu is not None
    attrs: Attributes = {"type": _string(DeviceKind.VGPU.type_attribute)}
    attrs.update(gpu_common_attributes(device.gpu, system, list_attributes))
    del attrs[STANDARD_PCI_BUS_ID]
    attrs["parentUUID"] = _string(device.gpu.uuid)
    attrs["parentPciBusID"] = _string(device.gpu.info.pci_bus_id)
    attrs["vgpuType"] = _string(device.vgpu.name)
    attrs["vgpuTypeId"] = {"int": device.vgpu.id}
    attrs["vgpuClass"] = _string(device.vgpu.type_class)
    return attrs


def vgpu_capacity(device: AllocatableDevice) -> Capacity:
    """`memory`: the type's framebuffer."""
    assert device.vgpu is not None
    return {"memory": {"value": _binary(device.vgpu.framebuffer_bytes)}}


def device_attributes(
    device: AllocatableDevice,
    system: SystemInfo,
    list_attributes: bool = False,
    passthrough: PassthroughSettings = NO_PASSTHROUGH,
) -> Attributes:
    if device.kind is DeviceKind.VFIO:
        return vfio_attributes(device.gpu, passthrough, list_attributes)
    if device.kind is DeviceKind.VGPU:
        return vgpu_attributes(device, system, list_attributes)
    if device.kind is DeviceKind.FM_PARTITION:
        return fm_partition_attributes(device)
    attrs: Attributes = {"type": _string(device.kind.type_attribute)}
    attrs.update(gpu_common_attributes(device.gpu, system, list_attributes))
    if device.kind.whole_gpu:
        attrs["uuid"] = _string(device.gpu.uuid)
        attrs["migCapable"] = {"bool": device.gpu.mig_capable}
        return attrs
    assert device.profile is not None
    attrs["parentUUID"] = _string(device.gpu.uuid)
    attrs["profile"] = _string(device.profile.name)
    if device.mig is not None:
        attrs["uuid"] = _string(device.mig.uuid)
    return attrs


def profile_capacity(profile: GpuInstanceProfile) -> Capacity:
    return {
        "memory": {"value": _binary(profile.memory_bytes)},
        "multiprocessors": {"value": decimal_quantity(profile.multiprocessors)},
        "copyEngines": {"value": decimal_quantity(profile.copy_engines)},
        "decoders": {"value": decimal_quantity(profile.decoders)},
        "encoders": {"value": decimal_quantity(profile.encoders)},
        "jpegEngines": {"value": decimal_quantity(profile.jpeg_engines)},
        "ofaEngines": {"value": decimal_quantity(profile.ofa_engines)},
    }


def shared_capacity(device: AllocatableDevice, sharing: SharingSettings) -> SharedCapacity:
    """The consumable capacities of a GPU offered in shares (KEP-5075). Each allocation consumes some of
    each one, so only what every share must state is published: `memory` and `compute`; no other capacity
    (an unrequested capacity without a policy would be consumed whole by the first share).

    - `memory`: the GPU's memory rounded down to a whole MiB; a share takes min + n*step, at least one step,
      `default` when its claim requests none. No `max`: the capacity value bounds it.
    - `compute`: 100, percent of the GPU's SMs (what MPS enforces per client); 1..100 in steps of 1.
    """
    memory = shared_memory_bytes(device.gpu)
    assert memory is not None, "the catalog shares only GPUs with known memory"
    step = _binary(sharing.memory_step)
    return {
        "memory": {
            "value": _binary(memory),
            "requestPolicy": {"default": _binary(sharing.memory_default), "validRange": {"min": step, "step": step}},
        },
        "compute": {
            "value": decimal_quantity(SHARE_COMPUTE_TOTAL),
            "requestPolicy": {
                "default": str(sharing.compute_default),
                "validRange": {"min": "1", "max": str(SHARE_COMPUTE_TOTAL), "step": "1"},
            },
        },
    }


SHARES_CAPACITY = "shares"  # `--consumable-shares <N>`: a share's part of the GPU, 1..N


def consumable_capacity(device: AllocatableDevice, shares: ConsumableShares) -> SharedCapacity:
    """The capacities of a whole GPU offered in shares in the main class (`--consumable-shares`), in NVIDIA's shapes
    (its `consumable_shares.go`), so that NVIDIA's specs allocate the same amounts here:

    - `memory` rounded down to a whole MiB (max - min must be a whole number of 1Mi steps);
      `memory`: default = all of it, validRange 1Mi..all, step 1Mi (a claim that names no memory takes the GPU);
      `unlimited` and `<N>`: default 0, validRange 0..all, step 1Mi (memory requests optional);
    - `<N>` adds `shares` = N: default 1, validRange 1..N, step 1.

    Nothing else: on a multi-allocatable device every capacity is consumed by every allocation, and one without a
    policy (`multiprocessors`) would be consumed whole by the first share."""
    memory = shared_memory_bytes(device.gpu)
    assert memory is not None, "the catalog shares only GPUs with known memory"
    value, step = _binary(memory), _binary(MIB)
    if shares.mode is ConsumableMode.MEMORY:
        policy: dict[str, Any] = {"default": value, "validRange": {"min": step, "max": value, "step": step}}
    else:
        policy = {"default": "0", "validRange": {"min": "0", "max": value, "step": step}}
    out: SharedCapacity = {"memory": {"value": value, "requestPolicy": policy}}
    if shares.mode is ConsumableMode.COUNT:
        count = str(shares.count)
        out[SHARES_CAPACITY] = {
            "value": count,
            "requestPolicy": {"default": "1", "validRange": {"min": "1", "max": count, "step": "1"}},
        }
    return out


# Published quantities are written in the canonical form kube-apiserver stores and returns (apimachinery
# `Quantity.String()`), so what kubectl shows is what was sent: bytes with a binary suffix (`24Gi`, `9856Mi`; a
# value that is no whole multiple of 1024 stays plain), counts in decimal SI (`132`, `1k`).
def _binary(value: int) -> str:
    return str(Quantity.from_int(value, QuantityFormat.BINARY_SI))


def decimal_quantity(value: int) -> str:
    return str(Quantity.from_int(value))


def device_capacity(device: AllocatableDevice) -> Capacity:
    if device.profile is not None:
        return profile_capacity(device.profile)
    capacity: Capacity = {}
    if device.gpu.info.memory_total_bytes is not None:
        capacity["memory"] = {"value": _binary(device.gpu.info.memory_total_bytes)}
    if device.gpu.multiprocessors is not None:
        capacity["multiprocessors"] = {"value": decimal_quantity(device.gpu.multiprocessors)}
    return capacity
