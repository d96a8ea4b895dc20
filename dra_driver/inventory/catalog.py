"""The devices this node offers for allocation, by name: the one mapping from a published device name
to the hardware behind it. The slice builder publishes exactly these; the prepare engine looks the
allocated names up here.

Names (DNS labels, stable across restarts):
    gpu-<minor>                                         a whole GPU
    gpu-<minor>-mig-<profile>-<giProfileId>-<start>     a MIG partition (static: exists; dynamic: possible)
    gpu-<minor>-shared                                  shares of a whole GPU (consumable capacity, KEP-5075)
    gpu-<minor>-vfio                                    the whole GPU passed through to a VM (`--passthrough`)
    gpu-<minor>-vgpu-<type>-<slot>                      one vGPU of a type, created at prepare (`--vgpu`)
With `--consumable-shares` the whole GPU `gpu-<minor>` itself is offered in shares (kind GPU_CONSUMABLE).
`<profile>` is the canonical profile name made RFC 1123-safe: "1g.10gb+me" -> "1g10gb-me". The profile ID
keeps names unique even where two sanitised profile names coincide.
"""

from __future__ import annotations

import enum
import re
from dataclasses import dataclass, replace

from dra_driver.inventory.model import GpuInventory, MigDeviceInventory, NodeInventory
from dra_driver.inventory.passthrough import NO_PASSTHROUGH, PassthroughSettings
from dra_driver.inventory.sharing import EXCLUSIVE, SharingSettings
from dra_driver.inventory.vgpu import NO_VGPU, VgpuSettings, offered_types, type_label
from dra_driver.nvml.types import Architecture, GpuInstanceProfile, Placement, VgpuType


class MigOffering(enum.StrEnum):
    """How MIG is offered (`--mig-mode`)."""

    NONE = "none"  # never offer MIG; MIG-enabled GPUs are skipped (nothing safe to offer)
    STATIC = "static"  # offer the MIG devices that exist (made by an admin or mig-parted)
    DYNAMIC = "dynamic"  # offer every possible placement; the plugin creates them at prepare time


MIG_MODE_HELP = (
    "how MIG is offered: none | static (the MIG devices that exist) | dynamic (every placement, carved on "
    "demand; the driver then owns MIG on those GPUs)"
)


class DeviceKind(enum.StrEnum):
    GPU = "gpu"
    MIG_STATIC = "mig-static"
    MIG_DYNAMIC = "mig-dynamic"
    # A whole GPU offered as shares (`allowMultipleAllocations`): each allocation is one share with the memory
    # and compute it consumed, enforced through one MPS daemon per GPU.
    GPU_SHARED = "gpu-shared"
    # `--consumable-shares`: the whole GPU `gpu-<minor>` itself, in the main class (type `gpu`), offered in shares
    # with NVIDIA's capacity shapes; enforced exactly as GPU_SHARED.
    GPU_CONSUMABLE = "gpu-consumable"
    # The whole GPU passed through to a virtual machine (bound to vfio-pci at prepare; docs/passthrough.md). It
    # consumes all of the GPU's counter set, so it and the GPU's container uses exclude each other at allocation.
    VFIO = "vfio"
    # One vGPU of a type on the GPU, created on an SR-IOV virtual function at prepare (docs/vgpu.md). It consumes its
    # share of the GPU's counter set, so vGPUs and the GPU's other uses exclude each other at allocation.
    VGPU = "vgpu"
    # A Fabric Manager partition (`fm-partition-<id>`): its GPUs passed through together to one VM, the partition
    # activated on the NVSwitches at prepare (docs/passthrough.md "Fabric Manager partitions"). It consumes every
    # member GPU's whole counter set, so it excludes every other use of those GPUs and overlapping partitions.
    FM_PARTITION = "fm-partition"

    @property
    def type_attribute(self) -> str:
        """The `type` attribute users select on."""
        if self is DeviceKind.GPU_SHARED:
            return "gpu-share"
        if self in (DeviceKind.VFIO, DeviceKind.VGPU, DeviceKind.FM_PARTITION):
            return self.value
        return "gpu" if self in (DeviceKind.GPU, DeviceKind.GPU_CONSUMABLE) else "mig"

    @property
    def config_type(self) -> str:
        """Which opaque config kind applies to a device of this kind (claimconfig.resolve.configs_for): `gpu`
        (GpuConfig: whole GPUs and their shares), `vfio` (VfioDeviceConfig: a GPU passed through to a VM) or `mig`
        (MigDeviceConfig). A vGPU is a VFIO device to its VM: VfioDeviceConfig's IOMMU choices apply to it."""
        if self in (DeviceKind.VFIO, DeviceKind.VGPU, DeviceKind.FM_PARTITION):
            return "vfio"
        return "gpu" if self.whole_gpu else "mig"

    @property
    def whole_gpu(self) -> bool:
        """The device is the whole physical GPU (exclusively, or in shares)."""
        return self in (DeviceKind.GPU, DeviceKind.GPU_SHARED, DeviceKind.GPU_CONSUMABLE)

    @property
    def slot(self) -> bool:
        """Each device of the kind is one of several slots of its GPU (a vGPU): two such devices of one GPU are
        different things, not the same GPU twice; what they may share is the kind's effect's to refuse."""
        return self is DeviceKind.VGPU

    @property
    def shared(self) -> bool:
        """Each allocation of the device is one share (`allowMultipleAllocations`), served by the GPU's MPS daemon."""
        return self in (DeviceKind.GPU_SHARED, DeviceKind.GPU_CONSUMABLE)


@dataclass(frozen=True)
class AllocatableDevice:
    name: str
    kind: DeviceKind
    gpu: GpuInventory
    profile: GpuInstanceProfile | None = None
    placement: Placement | None = None
    mig: MigDeviceInventory | None = None  # the live device, for static MIG
    # Draws from the GPU's counter set (dynamic MIG, or a GPU offered in shares): the whole GPU, its partitions
    # and its shared device then exclude each other.
    partitioned: bool = False
    # `--consumable-shares <N>`: the `shares` capacity of a GPU_CONSUMABLE device (what one share is a part of).
    share_count: int | None = None
    # A VGPU device: its type and its instance slot (0 .. max instances - 1) among that type's devices on the GPU.
    vgpu: VgpuType | None = None
    slot: int = 0
    # An FM_PARTITION device: Fabric Manager's partition id and its member GPUs (`gpu` is the first of them).
    partition_id: int | None = None
    members: tuple[GpuInventory, ...] = ()


def gpu_device_name(gpu: GpuInventory) -> str:
    return f"gpu-{gpu.info.minor}"


def shared_device_name(gpu: GpuInventory) -> str:
    return f"{gpu_device_name(gpu)}-shared"


def vfio_device_name(gpu: GpuInventory) -> str:
    return f"{gpu_device_name(gpu)}-vfio"


def vgpu_device_name(gpu: GpuInventory, vgpu_type: VgpuType, slot: int) -> str:
    return f"{gpu_device_name(gpu)}-vgpu-{type_label(vgpu_type)}-{slot}"


def mig_device_name(gpu: GpuInventory, profile: GpuInstanceProfile, placement: Placement) -> str:
    return f"{gpu_device_name(gpu)}-mig-{profile_label(profile.name)}-{profile.id}-{placement.start}"


def profile_label(profile_name: str) -> str:
    label = profile_name.lower().replace(".", "").replace("+", "-")
    return re.sub(r"[^a-z0-9-]", "-", label).strip("-")


def architecture_toggles_mig(arch: Architecture) -> bool:
    """Hopper and newer switch MIG mode without a GPU reset; Ampere needs one (so we never toggle it)."""
    return Architecture.HOPPER <= arch < Architecture.UNKNOWN


def supports_mig_toggle(gpu: GpuInventory) -> bool:
    return architecture_toggles_mig(gpu.info.architecture)


def dynamic_mig_eligible(gpu: GpuInventory) -> bool:
    """A GPU is offered as partitionable when it can be carved without a reset: MIG already on, or a
    Hopper+ GPU that toggles MIG on first use."""
    if not gpu.mig_capable or not gpu.mig_profiles:
        return False
    return gpu.mig_enabled or supports_mig_toggle(gpu)


def catalog(
    inventory: NodeInventory,
    policy: MigOffering,
    sharing: SharingSettings = EXCLUSIVE,
    passthrough: PassthroughSettings = NO_PASSTHROUGH,
    vgpu: VgpuSettings = NO_VGPU,
) -> dict[str, AllocatableDevice]:
    """Every allocatable device of the node, keyed by name, in a deterministic order.

    With `sharing` in shares mode, every selected GPU that is offered whole also gets `gpu-<minor>-shared`;
    that GPU's whole device then consumes its counter set too, so whole, partitions and shares exclude
    each other (see slices/counters.py). With `passthrough`, every selected GPU that is offered whole also gets
    `gpu-<minor>-vfio`, and every device of that GPU draws from its counter set. With `vgpu`, every selected GPU
    with vGPU types that is offered whole also gets its vGPU slots (inventory/vgpu.py), likewise."""
    devices: dict[str, AllocatableDevice] = {}
    for gpu in inventory.gpus:
        offered = _gpu_devices(gpu, policy, no_dynamic_mig=vgpu.selects(gpu) and bool(offered_types(gpu)))
        for dev in _vgpus(_passthrough(_shared(offered, gpu, sharing), gpu, passthrough), gpu, vgpu):
            devices[dev.name] = dev
    return devices


def _passthrough(
    devices: list[AllocatableDevice], gpu: GpuInventory, passthrough: PassthroughSettings
) -> list[AllocatableDevice]:
    """Offer the GPU once more, for a VM, when `passthrough` selects it and it is offered whole.

    One offer per GPU, decided by the scheduler: the VFIO device consumes the GPU's whole counter set and every
    container device of the GPU (the whole GPU, its MIG partitions, its shares) consumes from the same set, so an
    allocation of either kind excludes the other (KEP-4815); nothing is hidden or republished after a prepare
    (docs/passthrough.md). A GPU that is not offered whole (MIG on under static MIG, Ampere with MIG on under
    dynamic MIG, MIG on with `--mig-mode none`) is not offered for passthrough either: its memory belongs to MIG
    instances the driver may not destroy."""
    if not passthrough.selects(gpu) or not any(d.kind.whole_gpu and d.kind is not DeviceKind.GPU_SHARED
                                               for d in devices):
        return devices
    out = [d if d.partitioned else replace(d, partitioned=True) for d in devices]
    out.append(AllocatableDevice(vfio_device_name(gpu), DeviceKind.VFIO, gpu, partitioned=True))
    return out


def _vgpus(devices: list[AllocatableDevice], gpu: GpuInventory, vgpu: VgpuSettings) -> list[AllocatableDevice]:
    """Offer the GPU's vGPU slots when `vgpu` selects it and it is offered whole (not in MIG mode: its memory belongs
    to MIG instances), every device of the GPU then drawing from its counter set."""
    types = offered_types(gpu) if vgpu.selects(gpu) else ()
    if not types or not any(d.kind.whole_gpu for d in devices):
        return devices
    out = [d if d.partitioned else replace(d, partitioned=True) for d in devices]
    for vgpu_type in types:
        for slot in range(vgpu_type.max_instances):
            name = vgpu_device_name(gpu, vgpu_type, slot)
            out.append(AllocatableDevice(name, DeviceKind.VGPU, gpu, partitioned=True, vgpu=vgpu_type, slot=slot))
    return out


def _shared(devices: list[AllocatableDevice], gpu: GpuInventory, sharing: SharingSettings) -> list[AllocatableDevice]:
    """Add the shared device next to a whole GPU that `sharing` selects (and whose memory holds a share); with
    `--consumable-shares`, offer the whole GPU itself in shares instead (MIG devices stay exclusive)."""
    if not sharing.selects(gpu) or not sharing.fits(gpu):
        return devices
    if sharing.consumable.enabled:
        return [
            replace(d, kind=DeviceKind.GPU_CONSUMABLE, share_count=sharing.consumable.count)
            if d.kind is DeviceKind.GPU
            else d
            for d in devices
        ]
    if not any(d.kind is DeviceKind.GPU for d in devices):
        return devices  # MIG on (static), or Ampere under dynamic MIG: the GPU is not offered whole
    out: list[AllocatableDevice] = []
    for device in devices:
        if device.kind is not DeviceKind.GPU:
            out.append(device)
            continue
        out.append(replace(device, partitioned=True))
        out.append(AllocatableDevice(shared_device_name(gpu), DeviceKind.GPU_SHARED, gpu, partitioned=True))
    return out


def _gpu_devices(gpu: GpuInventory, policy: MigOffering, *, no_dynamic_mig: bool = False) -> list[AllocatableDevice]:
    """`no_dynamic_mig`: the GPU is offered as vGPUs, which a MIG partition made at prepare would take away."""
    whole = AllocatableDevice(gpu_device_name(gpu), DeviceKind.GPU, gpu)
    if policy is MigOffering.DYNAMIC and dynamic_mig_eligible(gpu) and not no_dynamic_mig:
        devices = []
        if supports_mig_toggle(gpu):
            # Hopper+: the whole GPU competes with its partitions through the counter set. (Ampere with
            # MIG on is offered as partitions only: turning MIG off again would need a GPU reset.)
            devices.append(AllocatableDevice(whole.name, DeviceKind.GPU, gpu, partitioned=True))
        for profile in gpu.mig_profiles:
            for placement in profile.placements:
                devices.append(
                    AllocatableDevice(
                        mig_device_name(gpu, profile, placement),
                        DeviceKind.MIG_DYNAMIC,
                        gpu,
                        profile,
                        placement,
                        partitioned=True,
                    )
                )
        return devices
    if gpu.mig_enabled:
        if policy is MigOffering.NONE:
            return []
        # A GPU with MIG on is never offered whole: its memory belongs to the partitions.
        return [
            AllocatableDevice(
                mig_device_name(gpu, mig.profile, mig.placement),
                DeviceKind.MIG_STATIC,
                gpu,
                mig.profile,
                mig.placement,
                mig,
            )
            for mig in gpu.mig_devices
        ]
    return [whole]
