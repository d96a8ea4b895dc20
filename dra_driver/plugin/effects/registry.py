"""The effect kinds, in the order the engine applies them (and undoes them in reverse).

Adding a kind is a module beside these with a `GpuEffect` subclass, its place in `DEVICE_EFFECTS` and, where it
drives a new piece of hardware code, that piece's line in `node_tools`: the engine, repair, recovery and the
plugin's assembly iterate over whatever is here (docs/architecture.md "Adding a device kind").

Order matters where one kind stands on another: a MIG partition exists before an MPS daemon serves it, and the
daemon is stopped before the partition is destroyed. The CDI spec comes after every device effect: it names
what they made.
"""

from __future__ import annotations

from collections.abc import Callable

from dra_driver.inventory.catalog import MigOffering
from dra_driver.kubeletplugin.effect import ClaimEffects as ClaimEffectsOf
from dra_driver.nvml.backend import NvmlBackend
from dra_driver.nvml.fabricmanager import FabricPartition
from dra_driver.nvml.mps import MpsControl
from dra_driver.observability.metrics import PluginMetrics
from dra_driver.pci.factory import open_vgpu_sysfs
from dra_driver.pci.sysfs import PciSysfs
from dra_driver.plugin.cdi import ClaimSpecWriter
from dra_driver.plugin.checkpoint import PreparedDevice
from dra_driver.plugin.effects.base import Catalog, ClaimPlan, GpuEffect, NodeTools
from dra_driver.plugin.effects.capacity_share import CapacityShare
from dra_driver.plugin.effects.cdi_spec import CdiSpec
from dra_driver.plugin.effects.fm_partition import FmPartition
from dra_driver.plugin.effects.mig_partition import MigPartition
from dra_driver.plugin.effects.mps_daemon import MpsDaemon
from dra_driver.plugin.effects.time_slice import TimeSlice
from dra_driver.plugin.effects.vfio_passthrough import VfioPassthrough
from dra_driver.plugin.effects.vgpu import Vgpu
from dra_driver.plugin.faults import FaultPoints
from dra_driver.plugin.fmpartition import FabricPartitioner
from dra_driver.plugin.mig import MigActuator
from dra_driver.plugin.mps import MPS_DIR_NAME, MpsDaemons
from dra_driver.plugin.settings import PluginSettings, cdi_edits
from dra_driver.plugin.sharing import TimeSlicer
from dra_driver.plugin.vfio import VfioBinder
from dra_driver.plugin.vgpu import VgpuMaker

# VFIO passthrough, vGPU and Fabric Manager partitions stand on no other kind (their claims hold nothing for
# containers) and go first: their refusals (IOMMU, a GPU in use, a vGPU type the GPU cannot host, a partition FM
# refuses) come before anything else is planned or made.
DEVICE_EFFECTS: tuple[type[GpuEffect], ...] = (
    VfioPassthrough, Vgpu, FmPartition, MigPartition, TimeSlice, MpsDaemon, CapacityShare,
)  # fmt: skip


# Every effect kind of this node: the device effects in order, then the claim's CDI spec (the layer's container,
# with this driver's types).
ClaimEffects = ClaimEffectsOf[ClaimPlan, PreparedDevice, None, Catalog]


def node_tools(
    settings: PluginSettings,
    *,
    nvml: NvmlBackend,
    pci: PciSysfs,
    metrics: PluginMetrics,
    faults: FaultPoints | None,
    mps_control: MpsControl | None,
    rediscover: Callable[[], None],
) -> NodeTools:
    """The hardware code the kinds drive, as the plugin's settings enable it: a kind that needs a new piece adds
    its field to `NodeTools` and its line here (the assembly, plugin/claimpipeline.py, calls this and knows no
    kind)."""
    mig = MigActuator(nvml, faults, metrics=metrics) if settings.mig_offering is MigOffering.DYNAMIC else None
    mps = (
        MpsDaemons(settings.mps_root or settings.plugin_dir / MPS_DIR_NAME, mps_control, nvml, faults)
        if mps_control
        else None
    )
    vfio = VfioBinder(
        pci, nvml, faults, daemons_on=lambda: _daemon_gpus(mps), allow_rebind=settings.passthrough.allow_rebind
    )
    return NodeTools(
        driver_name=settings.driver_name,
        # The spec's directory fsync is the prepare pipeline's (plugin/cdi.py `DurableSpecs`, claimpipeline.py).
        cdi=ClaimSpecWriter(
            settings.cdi_root, settings.driver_name, cdi_edits(settings), settings.node_name, defer_sync=True
        ),
        mig=mig,
        time_slicer=TimeSlicer(nvml, faults),
        mps=mps,
        vfio=vfio,
        vgpu=VgpuMaker(open_vgpu_sysfs(nvml, sys_root=settings.sysfs_root), faults, iommufd=pci.iommufd_present)
        if settings.vgpu.enabled
        else None,
        fm_partitions=(
            FabricPartitioner(_NodeFabricManager(nvml), vfio, faults) if settings.fabric_partitions else None
        ),
        rediscover=rediscover,
    )


class _NodeFabricManager:
    """The node's Fabric Manager, asked of NVML at each call: the tools are assembled before NVML's init, when the
    backend refuses every call (`fabric_manager` included), so the handle cannot be taken then."""

    def __init__(self, nvml: NvmlBackend) -> None:
        self._nvml = nvml

    def supported_partitions(self) -> tuple[FabricPartition, ...]:
        return self._nvml.fabric_manager().supported_partitions()

    def activate(self, partition_id: int) -> None:
        self._nvml.fabric_manager().activate(partition_id)

    def deactivate(self, partition_id: int) -> None:
        self._nvml.fabric_manager().deactivate(partition_id)

    def set_activated(self, partition_ids: tuple[int, ...]) -> None:
        self._nvml.fabric_manager().set_activated(partition_ids)


def _daemon_gpus(daemons: MpsDaemons | None) -> set[str]:
    """The GPUs an MPS daemon of this plugin serves (a GPU it serves is not passed through)."""
    if daemons is None:
        return set()
    return {gpu for daemon in daemons.on_disk() for gpu in daemons.recorded_gpus(daemon)}


def node_effects(tools: NodeTools, kinds: tuple[type[GpuEffect], ...] = DEVICE_EFFECTS) -> ClaimEffects:
    return ClaimEffects(devices=tuple(kind(tools) for kind in kinds), spec=CdiSpec(tools))
