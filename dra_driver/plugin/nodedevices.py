"""What this node offers: the device catalog as last discovered, each device's health problems, and the
ResourceSlices that publish both (the GPU plugin's node state; plugin/app.py assembles it)."""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

from dra_driver.inventory.catalog import AllocatableDevice, MigOffering
from dra_driver.inventory.discover import discover
from dra_driver.inventory.model import NodeInventory
from dra_driver.inventory.passthrough import PassthroughSettings
from dra_driver.k8s.client import JsonObject
from dra_driver.nvml.backend import NvmlBackend
from dra_driver.nvml.types import SystemInfo
from dra_driver.observability.metrics import PUBLISHED_TYPES, PluginMetrics
from dra_driver.pci.sysfs import PciSysfs
from dra_driver.plugin.checkpoint import PreparedDevice
from dra_driver.plugin.driverreload import unmonitored_problem
from dra_driver.plugin.fabricreport import FabricReporter
from dra_driver.plugin.health.board import DeviceHealthBoard
from dra_driver.plugin.health.problems import DeviceProblem
from dra_driver.plugin.passthroughfacts import with_iommu_groups, with_passed_through
from dra_driver.slices.builder import SliceSettings, build_slices
from dra_driver.slices.offer import offered

if TYPE_CHECKING:
    from dra_driver.deviceplugin.published import HeldGpu


@dataclass(frozen=True, kw_only=True)
class NodeDeviceParts:
    """What the node's devices are read with and reported to (plugin/app.py): NVML and PCI (discovery, IOMMU
    groups), the MIG offering, the health board, the metrics, the fabric reporter, the devices passed through (read
    from the checkpoint) and `republish`, called whenever the slices would change."""

    nvml: NvmlBackend
    pci: PciSysfs
    mig_offering: MigOffering
    health: DeviceHealthBoard
    metrics: PluginMetrics
    fabric: FabricReporter
    passed: Callable[[], list[PreparedDevice]]
    republish: Callable[[], None]


class NodeDevices:
    """The catalog, swapped whole on each discovery (readers take it under a lock and keep their copy), and what
    the slices say about it. `slice_settings` holds the sharing and passthrough settings in force (flags, node
    labels and the facts read at start)."""

    def __init__(self, parts: NodeDeviceParts, slice_settings: SliceSettings) -> None:
        self.parts = parts
        self.slice_settings = slice_settings
        self._lock = threading.Lock()
        self._devices: Mapping[str, AllocatableDevice] = {}
        self._problems: Mapping[str, tuple[DeviceProblem, ...]] = {}
        self.inventory: NodeInventory | None = None
        self.system: SystemInfo | None = None
        self._reloading_taint = False
        # GPU UUIDs the slices leave out: the device plugin allocated them (--device-plugin, docs/device-plugin.md).
        self.withheld: Callable[[], frozenset[str]] = frozenset
        # What the slices' annotation says of them: device, UUID, pods (deviceplugin/published.py).
        self.held: Callable[[], Sequence[HeldGpu]] = tuple

    def devices(self) -> Mapping[str, AllocatableDevice]:
        with self._lock:
            return self._devices

    def passed_through_now(self) -> bool:
        """Whether a checkpoint record names a GPU it moved to vfio-pci (read before recovery: unreadable is no)."""
        try:
            return bool(self.parts.passed())
        except Exception:
            return False

    def driver_version(self) -> str | None:
        """The NVIDIA driver version the catalog was read with (None: not read yet)."""
        system = self.system
        return system.driver_version if system is not None else None

    def set_passthrough(self, passthrough: PassthroughSettings) -> None:
        self.slice_settings = replace(self.slice_settings, passthrough=passthrough)

    def rediscover(self, inventory: NodeInventory | None = None) -> Mapping[str, AllocatableDevice]:
        """Re-read the hardware (or take `inventory`, just read), swap in the new device catalog and republish if
        anything changed."""
        read = inventory if inventory is not None else discover(self.parts.nvml)
        inventory = with_passed_through(self.inventory, read, self.parts.passed)
        self.inventory = inventory
        settings = self.slice_settings
        passthrough = with_iommu_groups(settings.passthrough, inventory, self.parts.pci)
        if passthrough != settings.passthrough:
            self.set_passthrough(passthrough)
        self.parts.fabric.note(inventory.clique)
        devices = offered(inventory, self.parts.mig_offering, settings, passthrough)
        with self._lock:
            changed = self.system != inventory.system or dict(self._devices) != dict(devices)
            self._devices, self.system = devices, inventory.system
        if changed:
            self._publish_health(devices)
            for kind in PUBLISHED_TYPES:
                count = sum(1 for d in devices.values() if d.kind.type_attribute == kind)
                self.parts.metrics.published_devices.labels(kind).set(count)
            self.parts.republish()
        return devices

    def nvml_gpus(self) -> list[str]:
        """The GPUs NVML should answer for (a GPU a claim passed through to a VM is on vfio-pci, not NVML's)."""
        inventory = self.inventory
        if inventory is None:
            return []
        passed = {d.gpu_uuid for d in self.parts.passed()}
        return [g.uuid for g in inventory.gpus if g.uuid not in passed]

    def desired_slices(self, generation: int) -> list[JsonObject]:
        with self._lock:
            devices, system, problems = self._devices, self.system, self._problems
        assert system is not None, "rediscover() runs before publishing"
        withheld = self.withheld()
        if withheld:
            devices = {name: d for name, d in devices.items() if d.gpu.uuid not in withheld}
        taints = {name: [p.taint() for p in found] for name, found in problems.items()}
        if self._reloading_taint:
            # Every device while the driver reloads (effect None: informational; left out below 1.35 by the builder).
            unmonitored = unmonitored_problem(self.slice_settings.driver_name).taint()
            taints = {name: [*taints.get(name, []), unmonitored] for name in devices}
        slices = build_slices(system, devices, replace(self.slice_settings, taints=taints), generation)
        held = self.held() if withheld else ()
        if held:
            # On every slice of the pool: the newest generation's say, whichever of its slices a reader takes.
            # Imported here: only `--device-plugin on` withholds GPUs, and the device plugin's modules are not
            # loaded by a plugin that serves DRA only (docs/perf-findings.md "Start-up").
            from dra_driver.deviceplugin.published import ANNOTATION, encode_held

            value = encode_held(held)
            for obj in slices:
                meta = obj.setdefault("metadata", {})
                meta["annotations"] = {**(meta.get("annotations") or {}), ANNOTATION: value}
        return slices

    def set_reloading_taint(self, on: bool) -> None:
        self._reloading_taint = on
        self.parts.republish()

    def health_changed(self, problems: Mapping[str, tuple[DeviceProblem, ...]]) -> None:
        """A device got or lost a problem: tell the kubelet (health stream) and the scheduler (slice taints)."""
        with self._lock:
            self._problems = dict(problems)
            devices = self._devices
        self._publish_health(devices)
        self.parts.republish()

    def _publish_health(self, devices: Mapping[str, AllocatableDevice]) -> None:
        with self._lock:
            problems = self._problems
        unhealthy = {n: "; ".join(p.message for p in found if p.unhealthy) for n, found in problems.items()}
        self.parts.health.update(devices, unhealthy={n: m for n, m in unhealthy.items() if m})
        bad = sum(1 for name in devices if unhealthy.get(name))
        self.parts.metrics.devices_by_health.labels("unhealthy").set(bad)
        self.parts.metrics.devices_by_health.labels("healthy").set(len(devices) - bad)
