"""Which GPUs are offered as vGPUs to virtual machines, and which vGPU devices a GPU offers, as pure settings and
rules (docs/vgpu.md).

`--vgpu none|all|<GPUs>` (chart value `vgpu.enabled` / `vgpu.gpus`) selects the GPUs, named as `--passthrough`
names them (index, UUID or PCI bus id); off by default, since it needs the NVIDIA vGPU Manager on the host. A
selected GPU that NVML reports vGPU types for, that is offered whole and is not in MIG mode, gets one device per
instance slot of each type it offers, `gpu-<minor>-vgpu-<type>-<slot>`:

- while the GPU holds vGPUs, only the types it holds (a GPU hosts one type at a time; NVML's creatable list then
  names that type alone, or none once full, and a slot allocated to a claim must stay published);
- else the types NVML says it can create now (none in MIG mode or while passed through).

Every device of such a GPU draws from its counter set (slices/counters.py): a vGPU slot takes its share of the
GPU's memory, the whole GPU, its VFIO device and its shares take all of it, so vGPUs exclude the GPU's container
and passthrough use at allocation; with KEP-5963 compatibility groups each type is a group of its own, so types
exclude each other too. Dynamic MIG is not offered on a vGPU GPU (MIG-backed vGPUs are not supported here).
"""

from __future__ import annotations

from dataclasses import dataclass

from dra_driver.inventory.model import GpuInventory
from dra_driver.inventory.passthrough import (
    PassthroughError,
    PassthroughScope,
    normal_pci_bus_id,
    passthrough_settings,
)
from dra_driver.nvml.types import VgpuType

VGPU_HELP = (
    "which GPUs are offered as NVIDIA vGPUs to virtual machines (devices gpu-<minor>-vgpu-<type>-<slot>, DeviceClass "
    "vgpu.gpu.dra.dev): none | all | a comma list of GPU indexes, UUIDs or PCI bus ids; needs the NVIDIA vGPU "
    "Manager (R550+, SR-IOV enabled) on the host; a GPU's vGPUs and its other devices exclude each other through its "
    "counter set (needs DRAPartitionableDevices)"
)


class VgpuSettingsError(PassthroughError):
    """A `--vgpu` value that names no GPUs; the message names the flag and the fix."""


@dataclass(frozen=True)
class VgpuSettings:
    """Off by default: no GPU is offered as vGPUs, nothing changes."""

    scope: PassthroughScope = PassthroughScope.NONE
    gpus: tuple[str, ...] = ()  # with LISTED: indexes, UUIDs or normalised PCI bus ids

    @property
    def enabled(self) -> bool:
        return self.scope is not PassthroughScope.NONE

    def selects(self, gpu: GpuInventory) -> bool:
        if self.scope is PassthroughScope.NONE:
            return False
        return self.scope is PassthroughScope.ALL or any(
            entry in (str(gpu.info.index), gpu.uuid, _bus_id(gpu)) for entry in self.gpus
        )


NO_VGPU = VgpuSettings()


def _bus_id(gpu: GpuInventory) -> str | None:
    return normal_pci_bus_id(gpu.info.pci_bus_id)


def vgpu_settings(text: str, *, flag: str = "--vgpu") -> VgpuSettings:
    """`none|all|<GPUs>` -> VgpuSettings; raises VgpuSettingsError naming `flag` and the fix."""
    try:
        parsed = passthrough_settings(text, flag=flag)
    except PassthroughError as exc:
        raise VgpuSettingsError(str(exc).replace("pass through to a VM", "host vGPUs")) from None
    return VgpuSettings(parsed.scope, parsed.gpus)


def offered_types(gpu: GpuInventory) -> tuple[VgpuType, ...]:
    """The types whose slots the GPU offers now (module docstring)."""
    state = gpu.vgpu
    if state is None or gpu.mig_enabled:
        return ()
    ids = state.active or state.creatable
    return tuple(t for t in state.supported if t.id in set(ids) and t.max_instances > 0)


def type_label(vgpu_type: VgpuType) -> str:
    """A DNS-label part for a type: "NVIDIA A100-4C" -> "a100-4c" (NVIDIA's prefix dropped, lower case)."""
    name = vgpu_type.name.strip()
    for prefix in ("NVIDIA ", "GRID "):
        if name.upper().startswith(prefix):
            name = name[len(prefix):]
    label = "".join(c if c.isalnum() else "-" for c in name.lower()).strip("-")
    return label or f"type{vgpu_type.id}"
