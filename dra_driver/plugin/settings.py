"""The GPU kubelet plugin's process knobs (its flags: `commands/kubelet_plugin.py`) and what follows from them."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from dra_driver import defaults
from dra_driver.deviceplugin.settings import DevicePluginSettings
from dra_driver.inventory.catalog import MigOffering
from dra_driver.inventory.model import NodeInventory
from dra_driver.inventory.passthrough import NO_PASSTHROUGH, PassthroughSettings
from dra_driver.inventory.sharing import EXCLUSIVE, SharingSettings, SharingSettingsError, unknown_gpus_message
from dra_driver.inventory.vgpu import NO_VGPU, VgpuSettings
from dra_driver.k8s.serverfeatures import FeatureMode
from dra_driver.nvidiadriver.wait import DriverWaitSettings
from dra_driver.plugin.cdi import EditsBuilder, FakeCdiEdits
from dra_driver.plugin.cdidriverfiles import RealCdiEdits
from dra_driver.plugin.devicemetadata import DeviceMetadataMode
from dra_driver.plugin.health.problems import DEFAULT_IGNORED_XIDS
from dra_driver.slices.builder import SliceSettings
from dra_driver.slices.nodeallocatable import NO_OVERHEAD

if TYPE_CHECKING:
    # A field's type only: plugin/driverlayout.py is read where the host's driver layout is checked (not on the
    # fake NVML), and the settings are built before that.
    from dra_driver.plugin.driverlayout import CdiHookBinary


@dataclass(frozen=True)
class PluginSettings:
    """The kubelet plugin's process knobs (flags); `claimconfig` is the claim-facing opaque settings."""

    node_name: str
    driver_name: str
    plugin_dir: Path
    registry_dir: Path
    cdi_root: Path
    driver_root: Path
    host_driver_root: Path
    mig_offering: MigOffering
    fake_cdi: bool
    healthz_port: int | None  # None: no HTTP health endpoint
    metrics_port: int | None = None  # None: no Prometheus endpoint of its own (still on the healthz port)
    # Set: the bound ports are written here once listening (`--ports-file`; port 0 lets the kernel pick).
    ports_file: Path | None = None
    usage_interval: float = defaults.USAGE_INTERVAL_S  # 0: no usage sampling
    boot_id_path: Path = defaults.BOOT_ID_PATH
    cleanup_interval: float = defaults.CLEANUP_INTERVAL_S
    rediscovery_interval: float = defaults.REDISCOVERY_INTERVAL_S
    shutdown_grace: float = defaults.SHUTDOWN_GRACE_S
    publish: bool = True
    kube_version: tuple[int, int] | None = None  # None: ask the API server (/version)
    health_monitor: bool = True
    ignored_xids: frozenset[int] = DEFAULT_IGNORED_XIDS
    pod_uid: str | None = None  # set: per-instance socket names (rolling updates side by side)
    mps_root: Path | None = None  # None: <plugin_dir>/mps
    sharing: SharingSettings = EXCLUSIVE  # --sharing-mode shares: also offer GPUs as gpu-<minor>-shared
    health_heal_after: float = defaults.HEALTH_HEAL_AFTER_S  # 0: problems last until a restart
    health_heal_after_max: float = defaults.HEALTH_HEAL_AFTER_MAX_S
    health_check_interval: float = defaults.HEALTH_CHECK_INTERVAL_S
    events: bool = True  # Kubernetes Events on claims (failed prepare/unprepare) and on the Node (health)
    # --list-attributes: KEP-5491 list form of resource.kubernetes.io/numaNode, where the API server keeps it
    list_attributes: FeatureMode = FeatureMode.AUTO
    # --partition-types: KEP-5677 `partitionType` and the slices' partitionTypeAttribute, where the API server keeps it
    partition_types: FeatureMode = FeatureMode.AUTO
    # --node-allocatable-overhead (KEP-5517): resource name -> perPod overhead of each container device; none by default
    node_allocatable_overhead: Mapping[str, str] = field(default_factory=lambda: NO_OVERHEAD)
    device_metadata: DeviceMetadataMode = DeviceMetadataMode.AUTO  # --device-metadata (KEP-5304)
    passthrough: PassthroughSettings = NO_PASSTHROUGH  # --passthrough: GPUs also offered to VMs (gpu-<minor>-vfio)
    vgpu: VgpuSettings = NO_VGPU  # --vgpu: GPUs also offered as vGPUs to VMs (gpu-<minor>-vgpu-<type>-<slot>)
    # --fabric-partitions: Fabric Manager's partitions also offered to VMs (fm-partition-<id>; docs/passthrough.md)
    fabric_partitions: bool = False
    # Where the host's sysfs and /dev are seen (the VFIO device's addressableMemory and iommuFDEnabled).
    sysfs_root: Path = Path("/sys")
    dev_root: Path = Path("/dev")
    # The container toolkit's CDI hook found at start (--cdi-hooks, plugin/driverlayout.py; docs/gpu-operator.md);
    # None: hooks off or none found. The claim CDI specs (plugin/cdi.py, cdi_edits below) call it.
    cdi_hook: CdiHookBinary | None = None
    # Waiting for the NVIDIA driver at start (nvidiadriver/wait.py): the plugin initialises NVML itself.
    # None: the caller did (tests, benchmarks), and the driver is taken as ready.
    driver_wait: DriverWaitSettings | None = None
    # `--device-plugin`: also serve nvidia.com/gpu through the kubelet's device-plugin API (docs/device-plugin.md).
    device_plugin: DevicePluginSettings | None = None


def slice_settings(settings: PluginSettings) -> SliceSettings:
    """The slice builder's settings at start; the API server's version and the gated fields it keeps are set once the
    plugin has asked (plugin/serverfacts.py)."""
    return SliceSettings(driver_name=settings.driver_name, node_name=settings.node_name, sharing=settings.sharing,
                         passthrough=settings.passthrough, vgpu=settings.vgpu,
                         fabric_partitions=settings.fabric_partitions,
                         node_allocatable_overhead=settings.node_allocatable_overhead)


def cdi_edits(settings: PluginSettings) -> EditsBuilder:
    """What each prepared device's CDI spec injects: the fake's env only, or the node's driver files, through the
    container toolkit's hooks where the chart says the node has them (docs/gpu-operator.md, docs/nvml-real.md)."""
    if settings.fake_cdi:
        return FakeCdiEdits()
    hook = Path(settings.cdi_hook.host_path) if settings.cdi_hook is not None else None
    return RealCdiEdits(settings.driver_root, settings.host_driver_root, dev_root=settings.dev_root, hook_path=hook)


def check_shared_gpus(sharing: SharingSettings, inventory: NodeInventory) -> None:
    """`--shared-gpus` must name GPUs of this node (checked once, at start: a GPU lost later is not fatal)."""
    if sharing.gpus:
        unknown = sharing.unknown_gpus(inventory)
        if unknown:
            raise SharingSettingsError(unknown_gpus_message(unknown, inventory))
