"""Which GPUs are also offered for passthrough to virtual machines (VFIO), as pure settings.

`--passthrough none|all|<GPUs>` (chart value `passthrough.enabled` / `passthrough.gpus`, node label
`<driver>/passthrough`) selects the GPUs; each selected GPU that is offered whole gets the device
`gpu-<minor>-vfio` next to its container devices, and the GPU's counter set then makes the two exclude each other
at allocation (slices/counters.py, docs/passthrough.md). A GPU is named by its index, its UUID or its PCI bus id
(`0000:53:00.0`, any case, the 4-digit domain optional), so an admin can name it with what `nvidia-smi` or
`lspci` prints.

The node facts the VFIO device publishes that NVML does not know (whether the host has IOMMUFD, each GPU's
addressable memory from its PCI BARs) are read by the plugin at start and carried here, so the catalog and the
slice builder stay pure.
"""

from __future__ import annotations

import enum
import re
import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field

from dra_driver.errors import DraDriverError
from dra_driver.inventory.model import GpuInventory, NodeInventory
from dra_driver.pci.model import NO_REBIND, RebindAllowance

PASSTHROUGH_HELP = (
    "which GPUs are also offered for passthrough to virtual machines (device gpu-<minor>-vfio, DeviceClass "
    "vfio.gpu.dra.dev): none | all | a comma list of GPU indexes, UUIDs or PCI bus ids; a GPU's container devices "
    "and its vfio device exclude each other through the GPU's counter set (needs DRAPartitionableDevices)"
)
COMPATIBILITY_GROUPS_HELP = (
    "also publish KEP-5963 compatibility groups (native on container devices, vfio on the passthrough device) on "
    "the counters of passthrough GPUs: on | off; needs the DRADeviceCompatibilityGroups gate (alpha in 1.37, off by "
    "default) on the API server and scheduler, which otherwise drop the field or ignore such devices"
)

ALLOW_REBIND_HELP = (
    "host PCI functions a passthrough may move to vfio-pci with the GPU when they share its IOMMU group (a NIC "
    "behind the same PCIe switch without ACS): a comma list of PCI class codes (0x + 2, 4 or 6 hex digits: 0x02 "
    "every network controller, 0x0200 Ethernet) or kernel driver names (mlx5_core); empty (default): such a GPU is "
    "refused, naming the function. The GPU's own functions (audio, USB) and idle GPUs always move"
)

# Node label `<driver>/passthrough: true|false`: overrides `--passthrough` for one node (read at plugin start).
PASSTHROUGH_LABEL = "passthrough"

_PCI_BUS_ID = re.compile(r"(?:([0-9a-f]{4,8}):)?([0-9a-f]{2}):([0-9a-f]{2})\.([0-7])")


class PassthroughError(DraDriverError, ValueError):
    """A passthrough flag, chart value or node label that cannot work; the message names it and the fix."""


class PassthroughScope(enum.StrEnum):
    NONE = "none"
    ALL = "all"
    LISTED = "listed"  # never spelled so by users: `--passthrough 0,1`


def normal_pci_bus_id(text: str) -> str | None:
    """`53:00.0`, `0000:53:00.0`, `00000000:53:00.0` (NVML's form) -> `0000:53:00.0`; None when it is no bus id."""
    match = _PCI_BUS_ID.fullmatch(text.strip().lower())
    if match is None:
        return None
    domain, bus, device, function = match.groups()
    return f"{int(domain or '0', 16):04x}:{bus}:{device}.{function}"


@dataclass(frozen=True)
class PassthroughSettings:
    """Off by default: no GPU is offered for passthrough, nothing changes."""

    scope: PassthroughScope = PassthroughScope.NONE
    gpus: tuple[str, ...] = ()  # with LISTED: indexes, UUIDs or normalised PCI bus ids
    # `--compatibility-groups on` (KEP-5963): groups on the counter consumption of passthrough GPUs' devices.
    compatibility_groups: bool = False
    # Node facts, filled in by the plugin at start: /dev/iommu exists (IOMMUFD), and each GPU's addressable
    # memory (bytes, the sum of its memory BARs) by PCI bus id; a GPU without an entry publishes no capacity.
    iommufd: bool = False
    addressable_memory: Mapping[str, int] = field(default_factory=dict)
    # Each GPU's IOMMU group by PCI bus id (every GPU NVML lists, not only the selected ones): GPUs that share a
    # group with a passthrough GPU draw from the group's counter set (slices/iommu.py). Empty: none known.
    iommu_groups: Mapping[str, int] = field(default_factory=dict)
    # `--passthrough-allow-rebind`: host functions of a GPU's IOMMU group a passthrough may move (plugin/vfio.py).
    allow_rebind: RebindAllowance = NO_REBIND

    @property
    def enabled(self) -> bool:
        return self.scope is not PassthroughScope.NONE

    @property
    def label(self) -> str:
        """As the flag is written: `none`, `all` or the list."""
        return ",".join(self.gpus) if self.scope is PassthroughScope.LISTED else self.scope.value

    def selects(self, gpu: GpuInventory) -> bool:
        if self.scope is PassthroughScope.NONE:
            return False
        if self.scope is PassthroughScope.ALL:
            return True
        return any(_names(gpu, entry) for entry in self.gpus)

    def unknown_gpus(self, inventory: NodeInventory) -> tuple[str, ...]:
        """Listed GPUs this node does not have (a typo would otherwise silently offer nothing)."""
        if self.scope is not PassthroughScope.LISTED:
            return ()
        return tuple(e for e in self.gpus if not any(_names(g, e) for g in inventory.gpus))


NO_PASSTHROUGH = PassthroughSettings()


def _names(gpu: GpuInventory, entry: str) -> bool:
    return entry in (str(gpu.info.index), gpu.uuid, normal_pci_bus_id(gpu.info.pci_bus_id))


def passthrough_settings(
    text: str, *, flag: str = "--passthrough", compatibility_groups: bool = False
) -> PassthroughSettings:
    """`none|all|<GPUs>` -> PassthroughSettings; raises PassthroughError naming `flag` and the fix."""
    value = text.strip()
    if value.lower() in ("", "none", "false", "off"):
        return PassthroughSettings(compatibility_groups=compatibility_groups)
    if value.lower() in ("all", "true", "on"):
        return PassthroughSettings(PassthroughScope.ALL, compatibility_groups=compatibility_groups)
    entries: list[str] = []
    for part in value.split(","):
        part = part.strip()
        if not part:
            continue
        if part.isdigit():
            entries.append(str(int(part)))
        elif part.upper().startswith(("GPU-", "MIG-")):
            if part.upper().startswith("MIG-"):
                raise PassthroughError(
                    f"{flag} {text!r}: {part!r} is a MIG device; only whole GPUs pass through to a VM. Name the GPU "
                    "by its index, its UUID (GPU-...) or its PCI bus id"
                )
            entries.append("GPU-" + part[4:])
        elif (bus_id := normal_pci_bus_id(part)) is not None:
            entries.append(bus_id)
        else:
            raise PassthroughError(
                f"{flag} {text!r}: {part!r} names no GPU. Use none, all, or a comma list of GPU indexes (0,1), "
                "UUIDs (GPU-...) or PCI bus ids (0000:53:00.0)"
            )
    if not entries:
        return PassthroughSettings(compatibility_groups=compatibility_groups)
    return PassthroughSettings(PassthroughScope.LISTED, tuple(dict.fromkeys(entries)), compatibility_groups)


def vfio_uuid(pci_bus_id: str) -> str:
    """The VFIO device's `uuid`, as NVIDIA's driver makes it: the SHA-1 name-based UUID (RFC 4122 version 5) of the
    PCI address in the DNS namespace. It depends on the address only, so it survives the rebind (NVML cannot see a
    GPU bound to vfio-pci) and restarts."""
    return str(uuid.uuid5(uuid.NAMESPACE_DNS, normal_pci_bus_id(pci_bus_id) or pci_bus_id))


def pci_ids(pci_device_id: int) -> tuple[str, str]:
    """NVML's combined PCI id (`0x233010DE`: device in the high 16 bits, vendor in the low) -> ("0x2330", "0x10de"),
    the `deviceID` and `vendorID` attributes in NVIDIA's format ("0x%04x")."""
    return f"0x{(pci_device_id >> 16) & 0xFFFF:04x}", f"0x{pci_device_id & 0xFFFF:04x}"


# The PCI spec defines six BARs; sysfs `resource` lists them first (then the ROM and the SR-IOV BARs).
PCI_BAR_COUNT = 6
_IORESOURCE_MEM = 0x00000200
# The kernel keeps a memory BAR's low register bits in the resource flags (drivers/pci/probe.c decode_bar):
# bits 1-2 are the BAR's type, 0b10 (0x4) a 64-bit BAR.
_BAR_TYPE_MASK = 0x06
_BAR_TYPE_64 = 0x04


def addressable_memory(resource_text: str) -> int | None:
    """The `addressableMemory` capacity: the sizes of the device's 64-bit memory BARs summed and rounded up to a power
    of two, from sysfs `/sys/bus/pci/devices/<bdf>/resource` (one `start end flags` line of hex numbers per resource),
    as NVIDIA's driver computes it (go-nvlib nvpci `GetTotalAddressableMemory(roundUp=true)`, its 64-bit sum): what a
    VM's firmware must map for the GPU. None when the file holds no 64-bit memory BAR."""
    total = 0
    for line in resource_text.splitlines()[:PCI_BAR_COUNT]:
        parts = line.split()
        if len(parts) < 3:
            continue
        try:
            start, end, flags = (int(p, 16) for p in parts[:3])
        except ValueError:
            return None
        if flags & _IORESOURCE_MEM and flags & _BAR_TYPE_MASK == _BAR_TYPE_64 and end > start:
            total += end - start + 1
    if total == 0:
        return None
    return 1 << (total - 1).bit_length()
