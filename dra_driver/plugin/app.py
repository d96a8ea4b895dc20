"""Assembles the kubelet plugin from its parts and runs it until SIGTERM."""

from __future__ import annotations

import signal
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from types import FrameType

import structlog

from dra_driver import defaults
from dra_driver.inventory.catalog import AllocatableDevice, MigOffering, catalog
from dra_driver.inventory.discover import discover
from dra_driver.inventory.model import NodeInventory
from dra_driver.inventory.passthrough import (
    NO_PASSTHROUGH,
    PASSTHROUGH_LABEL,
    PassthroughError,
    PassthroughScope,
    PassthroughSettings,
    addressable_memory,
)
from dra_driver.inventory.sharing import (
    EXCLUSIVE,
    NO_CONSUMABLE_SHARES,
    SharingMode,
    SharingSettings,
    SharingSettingsError,
    consumable_shares,
    unknown_gpus_message,
)
from dra_driver.k8s.client import ApiError, JsonObject, KubeRest
from dra_driver.k8s.events import EventRecorder
from dra_driver.k8s.serverfeatures import (
    FeatureMode,
    SliceFeature,
    SliceFeatures,
    discover_slice_features,
)
from dra_driver.k8s.serverfeatures import probe as probe_feature
from dra_driver.k8s.serverfeatures import report as report_probes
from dra_driver.kubeletplugin.claims import KubeClaimSource
from dra_driver.kubeletplugin.driver import ClaimRef, Driver
from dra_driver.kubeletplugin.metadata import DeviceMetadataWriter, MetadataDriver
from dra_driver.kubeletplugin.names import check_plugin_names
from dra_driver.kubeletplugin.nodeevents import NodeEvents
from dra_driver.kubeletplugin.publishlease import PublisherLease
from dra_driver.kubeletplugin.server import PluginServer
from dra_driver.kubeletplugin.statedirs import prepare_cdi_root, prepare_plugin_dir
from dra_driver.nvidiadriver.state import DriverStatusBoard, plugin_liveness, plugin_readiness
from dra_driver.nvidiadriver.wait import DriverWait, DriverWaitSettings, wait_for_driver
from dra_driver.nvml.backend import NvmlBackend
from dra_driver.nvml.mps import MpsControl
from dra_driver.nvml.types import NvmlError, SystemInfo
from dra_driver.observability.endpoint import HttpEndpoint
from dra_driver.observability.metrics import PUBLISHED_TYPES, PluginMetrics
from dra_driver.pci.factory import open_pci_sysfs
from dra_driver.pci.model import PciError, pci_address
from dra_driver.pci.sysfs import HostPciSysfs
from dra_driver.plugin.cdi import ClaimSpecWriter, EditsBuilder, FakeCdiEdits, RealCdiEdits
from dra_driver.plugin.checkpoint import CheckpointStore
from dra_driver.plugin.claimevents import EventingEngine
from dra_driver.plugin.devicemetadata import DeviceMetadataMode, MetadataAttributes, metadata_enabled
from dra_driver.plugin.devicestatus import DeviceStatusEngine, DeviceStatusWriter
from dra_driver.plugin.driverlayout import CdiHookBinary
from dra_driver.plugin.driverreload import (
    EXIT_DRIVER_UPGRADED,
    DriverReloadWatcher,
    DriverVersionFile,
    ReloadGate,
    ReloadHooks,
    mark_lost_claims,
    reverify_claims,
    unmonitored_problem,
)
from dra_driver.plugin.driverreport import DriverReporter, NodeAnnotator
from dra_driver.plugin.effects.base import NodeTools
from dra_driver.plugin.effects.registry import node_effects
from dra_driver.plugin.engine import EngineSettings, PrepareEngine
from dra_driver.plugin.fabricreport import FabricReporter
from dra_driver.plugin.faults import FaultPoints
from dra_driver.plugin.health.board import DeviceHealthBoard
from dra_driver.plugin.health.healing import HealthLedger
from dra_driver.plugin.health.keeper import HealthKeeper
from dra_driver.plugin.health.monitor import DEFAULT_IGNORED_XIDS, DeviceProblem, HealthMonitor
from dra_driver.plugin.mig import MigActuator
from dra_driver.plugin.mps import MPS_DIR_NAME, MpsDaemons
from dra_driver.plugin.ownership import RecoveryReport
from dra_driver.plugin.sharing import TimeSlicer
from dra_driver.plugin.utilisation import UtilisationSampler
from dra_driver.plugin.vfio import VfioBinder
from dra_driver.ports import listening, write_ports_file
from dra_driver.slices.builder import SliceSettings, build_slices
from dra_driver.slices.publisher import SlicePublisher

log = structlog.get_logger(__name__)
SHARING_MODE_LABEL = "sharing-mode"  # node label <driver>/sharing-mode overrides --sharing-mode
CONSUMABLE_SHARES_LABEL = "consumable-shares"  # node label <driver>/consumable-shares overrides --consumable-shares


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
    device_metadata: DeviceMetadataMode = DeviceMetadataMode.AUTO  # --device-metadata (KEP-5304)
    passthrough: PassthroughSettings = NO_PASSTHROUGH  # --passthrough: GPUs also offered to VMs (gpu-<minor>-vfio)
    # Where the host's sysfs and /dev are seen (the VFIO device's addressableMemory and iommuFDEnabled).
    sysfs_root: Path = Path("/sys")
    dev_root: Path = Path("/dev")
    # The container toolkit's CDI hook found at start (--cdi-hooks, plugin/driverlayout.py; docs/gpu-operator.md);
    # None: hooks off or none found. The claim CDI specs (plugin/cdi.py, cdi_edits below) call it.
    cdi_hook: CdiHookBinary | None = None
    # Waiting for the NVIDIA driver at start (nvidiadriver/wait.py): the plugin initialises NVML itself.
    # None: the caller did (tests, benchmarks), and the driver is taken as ready.
    driver_wait: DriverWaitSettings | None = None


class KubeletPlugin:
    def __init__(
        self,
        settings: PluginSettings,
        *,
        nvml: NvmlBackend,
        rest: KubeRest,
        faults: FaultPoints | None = None,
        mps_control: MpsControl | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.settings = settings
        self.nvml = nvml
        self.rest = rest
        self.stopped = threading.Event()
        # Set by SIGTERM (before stop() runs): ends the driver wait at once.
        self.stop_requested = threading.Event()
        self._serving = False  # the kubelet sockets are up (after the driver wait, discovery and recovery)
        # Whether the node's NVIDIA driver can serve (nvidiadriver/state.py): the driver wait sets it at
        # start; its listeners report it (log, Node Event, Node annotation) and /healthz reads it.
        self.driver_status = DriverStatusBoard()
        self.driver_wait = (
            DriverWait(nvml, self.driver_status, settings.driver_wait, stop=self.stop_requested,
                       accept_no_gpus=self._passed_through_now)
            if settings.driver_wait is not None
            else None
        )
        self._rediscover_now = threading.Event()
        # Wakes the cleanup loop early: on shutdown, and when the checkpoint is found lost or corrupt.
        self._cleanup_now = threading.Event()
        self._slice_settings = SliceSettings(
            driver_name=settings.driver_name, node_name=settings.node_name, sharing=settings.sharing,
            passthrough=settings.passthrough,
        )
        self._devices: Mapping[str, AllocatableDevice] = {}
        self._devices_lock = threading.Lock()
        self.metrics = PluginMetrics()
        self.mig = (
            MigActuator(nvml, faults, metrics=self.metrics) if settings.mig_offering is MigOffering.DYNAMIC else None
        )
        edits = cdi_edits(settings)
        self.health = DeviceHealthBoard(pool=settings.node_name)
        checkpoint = CheckpointStore(
            settings.plugin_dir / "checkpoint.json",
            boot_id_path=settings.boot_id_path,
            on_loss=lambda reason: self._cleanup_now.set(),
            on_write=self.metrics.checkpoint_write_seconds.observe,
            on_quarantine=lambda path, reason: self.node_events.checkpoint_quarantined(
                settings.driver_name, path, reason
            ),
        )
        claims = KubeClaimSource(rest)
        mps_daemons = (
            MpsDaemons(settings.mps_root or settings.plugin_dir / MPS_DIR_NAME, mps_control, nvml, faults)
            if mps_control
            else None
        )
        self._inventory: NodeInventory | None = None
        # The node's PCI devices: the fake node's for a fake backend, the host's sysfs otherwise.
        self.pci = open_pci_sysfs(nvml, sys_root=settings.sysfs_root, dev_root=settings.dev_root)
        self.engine = PrepareEngine(
            settings=EngineSettings(driver_name=settings.driver_name, pool_name=settings.node_name),
            claims=claims,
            catalog=self.devices,
            effects=node_effects(
                NodeTools(
                    driver_name=settings.driver_name,
                    cdi=ClaimSpecWriter(settings.cdi_root, settings.driver_name, edits, settings.node_name),
                    mig=self.mig,
                    time_slicer=TimeSlicer(nvml, faults),
                    mps=mps_daemons,
                    vfio=VfioBinder(
                        self.pci,
                        nvml,
                        faults,
                        daemons_on=lambda: _daemon_gpus(mps_daemons),
                        allow_rebind=settings.passthrough.allow_rebind,
                    ),
                    rediscover=self._rediscover_after_rebind,
                )
            ),
            checkpoint=checkpoint,
            faults=faults,
            metrics=self.metrics,
        )
        self.events = (
            EventRecorder(rest, component=f"{settings.driver_name}-kubelet-plugin", host=settings.node_name)
            if settings.events and settings.publish
            else None
        )
        self.fabric = FabricReporter(node_name=settings.node_name, events=self.events)  # NVLink clique problems
        self.node_events = NodeEvents(self.events, settings.node_name)  # the driver's state, a quarantined checkpoint
        self.driver_status.listen(DriverReporter(self.node_events))
        self.annotator = NodeAnnotator(rest, settings.node_name) if settings.publish else None
        if self.annotator is not None:
            self.driver_status.listen(self.annotator)
        # KEP-5304 device metadata of every prepared claim (on or off for good once start() knows the version).
        self.metadata = MetadataDriver(
            MetadataAttributes(
                self.engine,
                checkpoint=checkpoint.load,
                catalog=self.devices,
                system=lambda: self._system,
                list_attributes=lambda: self._slice_settings.publishes_lists,
                enabled=lambda: self.metadata.enabled,
            ),
            DeviceMetadataWriter(
                driver_name=settings.driver_name,
                plugin_dir=settings.plugin_dir,
                cdi_root=settings.cdi_root,
                faults=faults.reached if faults is not None else None,
            ),
            enabled=settings.device_metadata is DeviceMetadataMode.ON,
        )
        # What the kubelet's calls reach: the engine with its device metadata, recording an Event on each claim
        # whose operation failed.
        # While the NVIDIA driver reloads, claims wait (plugin/driverreload.py).
        gate = ReloadGate(self.metadata, self.driver_status, node_name=settings.node_name, engine=self.engine,
                          suspect=lambda: self.driver_reload.check())  # fmt: skip
        self.claim_engine: Driver = EventingEngine(gate, self.events) if self.events else gate
        # Each prepared device in the claim's status.devices, off the call path (plugin/devicestatus.py).
        self.device_status = DeviceStatusWriter(
            rest, driver_name=settings.driver_name, pool_name=settings.node_name,
            count=lambda outcome: self.metrics.claim_device_status_writes.labels(outcome).inc(),
            kube_version=lambda: self._slice_settings.kube_version,
        ) if settings.publish else None  # fmt: skip
        if self.device_status is not None:
            self.claim_engine = DeviceStatusEngine(self.claim_engine, self.device_status, checkpoint=checkpoint.load,
                                                   catalog=self.devices, node=settings.node_name)
        self.server = PluginServer(
            driver_name=settings.driver_name,
            plugin_dir=settings.plugin_dir,
            registry_dir=settings.registry_dir,
            driver=self.claim_engine,
            health=self.health,
            pod_uid=settings.pod_uid,
        )
        healthz_port, metrics_port = settings.healthz_port, settings.metrics_port
        self.healthz = (
            listening(
                "--healthz-port",
                healthz_port,
                lambda: HttpEndpoint(
                    registry=self.metrics.registry, probe=self.readiness, liveness=self.liveness, port=healthz_port,
                    name="healthz",
                ),
            )
            if healthz_port is not None
            else None
        )
        self.metrics_server = (
            listening(
                "--metrics-port",
                metrics_port,
                lambda: HttpEndpoint(registry=self.metrics.registry, port=metrics_port, name="metrics"),
            )
            if metrics_port is not None
            else None
        )
        self.usage_sampler = (
            UtilisationSampler(
                nvml,
                checkpoint=checkpoint.load,
                catalog=self.devices,
                get_claim=claims.get_claim,
                metrics=self.metrics,
                interval=settings.usage_interval,
            )
            if settings.usage_interval > 0
            else None
        )
        if self.usage_sampler is not None:
            self.engine.after_operation = self.usage_sampler.claims_changed
        # Who learns from the ResourceClaim a prepare read (instead of a GET of their own).
        readers = [r.note_claim for r in (self.usage_sampler, self.device_status) if r is not None]
        if readers:

            def claim_read(uid: str, claim: JsonObject) -> None:
                for read in readers:
                    read(uid, claim)

            self.engine.claim_read = claim_read
        self._system: SystemInfo | None = None
        self.publisher: SlicePublisher | None = None
        self.publisher_lease: PublisherLease | None = None
        self._problems: Mapping[str, tuple[DeviceProblem, ...]] = {}
        self.health_keeper = HealthKeeper(
            HealthLedger(
                settings.driver_name,
                heal_after=settings.health_heal_after,
                heal_after_max=settings.health_heal_after_max,
            ),
            nvml=nvml,
            node_name=settings.node_name,
            driver_name=settings.driver_name,
            devices=self.devices,
            on_change=self._health_changed,
            metrics=self.metrics,
            events=self.events,
            clock=clock,
            interval=settings.health_check_interval,
        )
        self.health_monitor = (
            HealthMonitor(
                nvml,
                driver_name=settings.driver_name,
                devices=self.devices,
                on_problem=self.health_keeper.on_problem,
                ignored_xids=settings.ignored_xids,
                on_wait_error=lambda error: self.driver_reload.on_event_wait_error(error),
            )
            if settings.health_monitor
            else None
        )
        # --- NVIDIA driver reloads (plugin/driverreload.py) ---
        self._driver_reloading_taint = False
        self._node: JsonObject | None = None
        self.exit_code = 0  # EXIT_DRIVER_UPGRADED: the process must restart to load the new driver's NVML library
        self._exit_now = threading.Event()
        self.driver_reload = DriverReloadWatcher(
            nvml,
            self.driver_status,
            ReloadHooks(
                gpus=self._nvml_gpus,
                published_version=lambda: self._system.driver_version if self._system is not None else None,
                taint=self._set_reloading_taint,
                exclusive=lambda: self.engine.parts.operations.exclusive(self.engine.settings.recovery_lock_timeout),
                rediscover=self.rediscover,
                reverify=lambda: reverify_claims(self.engine, node_name=settings.node_name, events=self.events,
                                                 metrics=self.metrics),
                park_monitor=lambda: self.health_monitor.park() if self.health_monitor is not None else None,
                resume_monitor=lambda: self.health_monitor.resume() if self.health_monitor is not None else None,
                exit_for_restart=self._exit_for_restart,
            ),
            node_name=settings.node_name,
            events=self.events,
            metrics=self.metrics,
            node_uid=lambda: str(((self._node or {}).get("metadata") or {}).get("uid") or ""),
            version_file=DriverVersionFile(settings.plugin_dir),
        )
        # --- end of NVIDIA driver reloads ---
        self._threads = [
            threading.Thread(target=self._cleanup_loop, name="stale-claims", daemon=True),
            threading.Thread(target=self._rediscovery_loop, name="rediscovery", daemon=True),
        ]

    def devices(self) -> Mapping[str, AllocatableDevice]:
        with self._devices_lock:
            return self._devices

    def rediscover(self, inventory: NodeInventory | None = None) -> Mapping[str, AllocatableDevice]:
        """Re-read the hardware (or take `inventory`, just read), swap in the new device catalog and republish if
        anything changed."""
        inventory = self._with_passed_through(inventory if inventory is not None else discover(self.nvml))
        self._inventory = inventory
        self._note_iommu_groups(inventory)
        self.fabric.note(inventory.clique)
        devices = catalog(inventory, self.settings.mig_offering, self.settings.sharing, self.settings.passthrough)
        with self._devices_lock:
            changed = self._system != inventory.system or dict(self._devices) != dict(devices)
            self._devices, self._system = devices, inventory.system
        if changed:
            self._publish_health(devices)
            for kind in PUBLISHED_TYPES:
                count = sum(1 for d in devices.values() if d.kind.type_attribute == kind)
                self.metrics.published_devices.labels(kind).set(count)
            if self.publisher is not None:
                self.publisher.trigger()
        return devices

    def _rediscover_after_rebind(self) -> None:
        """A GPU left or came back to the nvidia driver: re-read now, within the claim operation, so the catalog
        and the slices say so before the kubelet's next call (a GPU given back serves containers at once)."""
        try:
            self.rediscover()
        except Exception:
            log.exception("re-discovery after a passthrough rebind failed; the periodic one retries")
            self._rediscover_now.set()

    def _passed_through_now(self) -> bool:
        """Whether a checkpoint record names a GPU it moved to vfio-pci (read before recovery: unreadable is no)."""
        try:
            claims = self.engine.prepared_claims().claims.values()
        except Exception:
            return False
        return any(d.vfio is not None and d.vfio.started for r in claims for d in (*r.devices, *r.allocated))

    def _with_passed_through(self, inventory: NodeInventory) -> NodeInventory:
        """A GPU bound to vfio-pci by a claim of ours is gone from NVML's list; it keeps its place in the catalog
        (as last read) while that claim holds it, so its devices stay published and the claim's device is found.
        So does another GPU of its IOMMU group that the passthrough moved along (the group's counter set keeps its
        devices unallocatable meanwhile, and a stale claim on it is refused naming the VM's claim).
        (After a plugin restart it is missing until the claim is unprepared: docs/passthrough.md.)"""
        previous = self._inventory
        if previous is None:
            return inventory
        present = {g.uuid for g in inventory.gpus}
        missing = [g for g in previous.gpus if g.uuid not in present]
        if not missing:
            return inventory
        passed = [
            d
            for record in self.engine.prepared_claims().claims.values()
            for d in (*record.devices, *record.allocated)
            if d.vfio is not None and d.vfio.started
        ]
        held = {d.gpu_uuid for d in passed}
        moved = {f.address for d in passed if d.vfio is not None for f in d.vfio.functions}
        kept = [g for g in missing if g.uuid in held or g.info.pci_bus_id in moved]
        if not kept:
            return inventory
        return replace(inventory, gpus=tuple(sorted((*inventory.gpus, *kept), key=lambda g: g.info.index)))

    def desired_slices(self, generation: int) -> list[JsonObject]:
        with self._devices_lock:
            devices, system, problems = self._devices, self._system, self._problems
        assert system is not None, "rediscover() runs before publishing"
        taints = {name: [p.taint() for p in found] for name, found in problems.items()}
        if self._driver_reloading_taint:
            # Every device while the driver reloads (effect None: informational; left out below 1.35 by the builder).
            unmonitored = unmonitored_problem(self.settings.driver_name).taint()
            taints = {name: [*taints.get(name, []), unmonitored] for name in devices}
        return build_slices(system, devices, replace(self._slice_settings, taints=taints), generation)

    def _publish_health(self, devices: Mapping[str, AllocatableDevice]) -> None:
        with self._devices_lock:
            problems = self._problems
        unhealthy = {n: "; ".join(p.message for p in found if p.unhealthy) for n, found in problems.items()}
        self.health.update(devices, unhealthy={n: m for n, m in unhealthy.items() if m})
        bad = sum(1 for name in devices if unhealthy.get(name))
        self.metrics.devices_by_health.labels("unhealthy").set(bad)
        self.metrics.devices_by_health.labels("healthy").set(len(devices) - bad)

    def _health_changed(self, problems: Mapping[str, tuple[DeviceProblem, ...]]) -> None:
        """A device got or lost a problem: tell the kubelet (health stream) and the scheduler (slice taints)."""
        with self._devices_lock:
            self._problems = dict(problems)
            devices = self._devices
        self._publish_health(devices)
        if self.publisher is not None:
            self.publisher.trigger()

    def _claims_lost_while_down(self) -> None:
        """Before start-up recovery (which would re-create a missing MIG instance): the driver was upgraded since
        the claims were last verified, so their MIG instances went with the old one (plugin/driverreload.py)."""
        verified = DriverVersionFile(self.settings.plugin_dir).read()
        current = self._system.driver_version if self._system is not None else None
        if verified is None or current is None or verified == current:
            return
        log.warning("the NVIDIA driver changed while the plugin was down; checking the prepared claims",
                    verified_with=verified, driver_version=current)  # fmt: skip
        with self.engine.parts.operations.exclusive(self.engine.settings.recovery_lock_timeout):
            mark_lost_claims(self.engine, node_name=self.settings.node_name, events=self.events, metrics=self.metrics)

    def _set_reloading_taint(self, on: bool) -> None:
        self._driver_reloading_taint = on
        if self.publisher is not None:
            self.publisher.trigger()

    def _nvml_gpus(self) -> list[str]:
        """The GPUs NVML should answer for (a GPU a claim passed through to a VM is on vfio-pci, not NVML's)."""
        inventory = self._inventory
        if inventory is None:
            return []
        passed = {
            d.gpu_uuid
            for record in self.engine.prepared_claims().claims.values()
            for d in (*record.devices, *record.allocated)
            if d.vfio is not None and d.vfio.started
        }
        return [g.uuid for g in inventory.gpus if g.uuid not in passed]

    def _exit_for_restart(self, message: str) -> None:
        log.error("exiting so that the kubelet restarts the plugin with the new NVIDIA driver", error=message)
        self.exit_code = EXIT_DRIVER_UPGRADED
        self._exit_now.set()

    def _held_claims(self) -> list[ClaimRef]:
        """Every claim the checkpoint names (in any state): what the device metadata sweep keeps."""
        return [ClaimRef(r.namespace, r.name, uid) for uid, r in self.engine.prepared_claims().claims.items()]

    def _discover_slice_features(self, kube_version: tuple[int, int]) -> SliceFeatures:
        """The gated slice fields this plugin would send, each probed by one dry-run create (k8s/serverfeatures.py):
        only those the settings ask for, so `--list-attributes off` and no `--compatibility-groups` cost no request."""
        modes: dict[SliceFeature, FeatureMode] = {}
        if self.settings.list_attributes is not FeatureMode.OFF:
            modes[SliceFeature.LIST_ATTRIBUTES] = self.settings.list_attributes
        if self.settings.passthrough.compatibility_groups:
            modes[SliceFeature.COMPATIBILITY_GROUPS] = FeatureMode.ON
        features, probes = discover_slice_features(
            frozenset(modes),
            lambda f: probe_feature(self.rest, f, driver=self.settings.driver_name, node=self.settings.node_name,
                                    kube_version=kube_version),
        )
        report_probes(probes, modes)
        return features

    def _detect_kube_version(self) -> tuple[int, int]:
        if self.settings.kube_version is not None:
            return self.settings.kube_version
        try:
            info = self.rest.request("GET", "/version")
            minor = int("".join(ch for ch in str(info.get("minor", "35")) if ch.isdigit()) or 35)
            return int(info.get("major", 1)), minor
        except (ApiError, ValueError) as exc:
            log.warning("could not read the API server version; assuming 1.35 slice layout", error=str(exc))
            return (1, 35)

    def _apply_node_sharing_label(self) -> JsonObject | None:
        """A node label `<driver>/sharing-mode: shares|exclusive` overrides `--sharing-mode` for this node (and
        `<driver>/consumable-shares: disabled|memory|unlimited|<N>` overrides `--consumable-shares`), so an admin
        shares the GPUs of some nodes with one chart install (read at start: restart the node's plugin pod after
        changing it). A bad value is ignored with a warning rather than keeping the plugin from starting. Returns the
        Node as read (None: not readable or not there): the slice publisher takes its owner reference from it
        instead of reading it again."""
        label = f"{self.settings.driver_name}/{SHARING_MODE_LABEL}"
        try:
            node = self.rest.get(f"/api/v1/nodes/{self.settings.node_name}")
        except ApiError as exc:
            log.warning("could not read this node's labels; --sharing-mode applies", error=str(exc), label=label)
            return None
        labels = ((node or {}).get("metadata") or {}).get("labels") or {}
        labels = labels if isinstance(labels, dict) else {}
        sharing = self.settings.sharing
        value = labels.get(label)
        if value is not None:
            try:
                sharing = replace(sharing, mode=SharingMode(value))
                log.info("sharing mode from the node label", label=label, mode=value)
            except ValueError:
                allowed = ", ".join(m.value for m in SharingMode)
                log.warning("ignoring a node label with an unknown sharing mode", label=label, value=value,
                            allowed=allowed)
        shares_label = f"{self.settings.driver_name}/{CONSUMABLE_SHARES_LABEL}"
        shares_value = labels.get(shares_label)
        if shares_value is not None:
            try:
                parsed = consumable_shares(str(shares_value), flag=f"label {shares_label}")
                sharing = replace(sharing, consumable=parsed)
                log.info("consumable shares from the node label", label=shares_label, consumable_shares=shares_value)
            except SharingSettingsError as exc:
                log.warning("ignoring a node label with an unknown consumable-shares mode", label=shares_label,
                            value=shares_value, error=str(exc))
        if sharing.enabled and sharing.consumable.enabled:
            # The two exclude each other (the flags refuse both): the one a node label set wins over the flag.
            if shares_value is not None:
                sharing = replace(sharing, mode=SharingMode.EXCLUSIVE)
            else:
                sharing = replace(sharing, consumable=NO_CONSUMABLE_SHARES)
            log.info("sharing mode and consumable shares exclude each other; the node label's wins",
                     mode=sharing.mode.value, consumable_shares=sharing.consumable.label)
        if sharing != self.settings.sharing:
            self.settings = replace(self.settings, sharing=sharing)
            self._slice_settings = replace(self._slice_settings, sharing=sharing)
        self._apply_node_passthrough_label(labels)
        return node

    def _apply_node_passthrough_label(self, labels: Mapping[str, object]) -> None:
        """`<driver>/passthrough: true|false` turns passthrough on or off for this node (read at start, like the
        sharing labels). `true` keeps the GPUs `--passthrough` lists, or takes every GPU when it lists none; a label
        value cannot hold a list (no commas), so per-GPU choices stay with the flag."""
        label = f"{self.settings.driver_name}/{PASSTHROUGH_LABEL}"
        value = labels.get(label)
        if value is None:
            return
        current = self.settings.passthrough
        text = str(value).strip().lower()
        if text in ("true", "all"):
            listed = current.scope is PassthroughScope.LISTED
            wanted = current if listed else replace(current, scope=PassthroughScope.ALL)
        elif text in ("false", "none"):
            wanted = replace(current, scope=PassthroughScope.NONE, gpus=())
        else:
            log.warning("ignoring a node label with an unknown passthrough value", label=label, value=value,
                        allowed="true, false")
            return
        log.info("passthrough from the node label", label=label, passthrough=wanted.label)
        self._set_passthrough(wanted)

    def _set_passthrough(self, passthrough: PassthroughSettings) -> None:
        self.settings = replace(self.settings, passthrough=passthrough)
        self._slice_settings = replace(self._slice_settings, passthrough=passthrough)

    def _read_passthrough_facts(self, inventory: NodeInventory) -> None:
        """What the VFIO devices publish that NVML does not know, read once at start: whether the IOMMU is on (off:
        nothing is offered for passthrough, since no prepare could bind a GPU; containers keep every GPU), /dev/iommu
        (IOMMUFD), and each selected GPU's memory BARs (sysfs `resource`; a file that cannot be read leaves the
        capacity out)."""
        passthrough = self.settings.passthrough
        if not passthrough.enabled:
            return
        unknown = passthrough.unknown_gpus(inventory)
        if unknown and self._passed_through_now():
            # A GPU on vfio-pci (a VM's, or one a crash left there for recovery to take back) is not in NVML's
            # list: refusing to start would keep recovery from ever rebinding it.
            log.warning("--passthrough names GPUs NVML does not list; some GPUs are passed through now",
                        unknown=list(unknown))
        elif unknown:
            raise PassthroughError(
                f"--passthrough {passthrough.label!r}: this node has no GPU {', '.join(unknown)}; its GPUs are "
                + ", ".join(f"{g.info.index} ({g.uuid}, {g.info.pci_bus_id})" for g in inventory.gpus)
            )
        if not self.pci.iommu_enabled():
            log.warning("passthrough is enabled but the IOMMU is off (no IOMMU groups): no GPU is offered for "
                        "passthrough; turn the IOMMU on (firmware and kernel) and restart the plugin",
                        passthrough=passthrough.label)
            self._set_passthrough(replace(passthrough, scope=PassthroughScope.NONE, gpus=()))
            return
        sizes: dict[str, int] = {}
        # Only the host's sysfs has BAR sizes; a fake node's bus ids may name real devices of this machine.
        host_sysfs = self.pci.sys_root if isinstance(self.pci, HostPciSysfs) else None
        for gpu in inventory.gpus:
            if host_sysfs is None or not passthrough.selects(gpu):
                continue
            try:
                text = (host_sysfs / "bus/pci/devices" / gpu.info.pci_bus_id / "resource").read_text()
            except OSError:
                continue
            size = addressable_memory(text)
            if size is not None:
                sizes[gpu.info.pci_bus_id] = size
        self._set_passthrough(replace(passthrough, iommufd=self.pci.iommufd_present(), addressable_memory=sizes))

    def _note_iommu_groups(self, inventory: NodeInventory) -> None:
        """Each GPU's IOMMU group (sysfs, fixed at boot), for the shared groups' counter sets (slices/iommu.py): read
        for every GPU NVML lists (a GPU not offered for passthrough may share a group with one that is), once per
        GPU; a GPU first seen later (back from vfio-pci after a restart) is read at that re-discovery."""
        passthrough = self.settings.passthrough
        if not passthrough.enabled:
            return
        unknown = [g.info.pci_bus_id for g in inventory.gpus if g.info.pci_bus_id not in passthrough.iommu_groups]
        found: dict[str, int] = {}
        for bus_id in unknown:
            try:
                group = self.pci.function(pci_address(bus_id)).iommu_group
            except (PciError, ValueError):
                continue  # not in sysfs: the GPU publishes no group counter (the prepare still checks the group)
            if group is not None:
                found[bus_id] = group
        if found:
            self._set_passthrough(replace(passthrough, iommu_groups={**passthrough.iommu_groups, **found}))

    def _check_shared_gpus(self, inventory: NodeInventory) -> None:
        """`--shared-gpus` must name GPUs of this node (checked once, at start: a GPU lost later is not fatal)."""
        if self.settings.sharing.gpus:
            unknown = self.settings.sharing.unknown_gpus(inventory)
            if unknown:
                raise SharingSettingsError(unknown_gpus_message(unknown, inventory))

    def start(self) -> None:
        # Everything that can make the plugin unusable is checked before anything on the node is touched.
        # Start-up order (docs/kubelet-plugin.md "Starting up"): what runs before the sockets is what a prepare
        # needs (the inventory, recovery); the kube version, the slices and the background loops come after.
        check_plugin_names(driver_name=self.settings.driver_name, node_name=self.settings.node_name)
        node = self._apply_node_sharing_label() if self.settings.publish else None
        self._node = node
        self.health_keeper.note_node(node)
        self.fabric.note_node(node)
        self.node_events.note_node(node)
        # Served from here on: /livez says alive while the plugin waits, /healthz and /readyz say why it is not ready.
        if self.metrics_server is not None:
            self.metrics_server.start()
        if self.healthz is not None:
            self.healthz.start()
        if self.settings.ports_file is not None:
            bound = {"healthz": self.healthz, "metrics": self.metrics_server}
            write_ports_file(self.settings.ports_file, {k: e.port for k, e in bound.items() if e is not None})
        if not wait_for_driver(self.driver_wait, self.driver_status, self.nvml, node_name=self.settings.node_name):
            return  # stopped while waiting: nothing on the node was touched, no socket, no slice
        inventory = discover(self.nvml)  # read once: the --shared-gpus check and the first catalog both use it
        self._check_shared_gpus(inventory)
        self._read_passthrough_facts(inventory)
        prepare_plugin_dir(self.settings.plugin_dir)
        prepare_cdi_root(self.settings.cdi_root)
        devices = self.rediscover(inventory)
        log.info("inventory ready", node=self.settings.node_name, devices=len(devices))
        self._claims_lost_while_down()
        self._recovered(self.engine.recovery.recover())
        self.engine.record_prepared(self.engine.prepared_claims())
        # Before the sockets: a prepare must find the metadata switch set (the version is one GET).
        kube_version = self._detect_kube_version() if self.settings.publish else self.settings.kube_version
        self.metadata.enabled = metadata_enabled(self.settings.device_metadata, kube_version)
        self.metadata.writer.sweep(self._held_claims, temp_files=True)
        log.info("device metadata", mode=self.settings.device_metadata.value, enabled=self.metadata.enabled,
                 kube_version=".".join(map(str, kube_version)) if kube_version else None)  # fmt: skip
        if self.device_status is not None:
            self.device_status.start()
        self.server.start()
        self._serving = True
        if self.usage_sampler is not None:
            self.usage_sampler.start()
        if self.settings.publish:
            kube_version = kube_version or self._detect_kube_version()
            features = self._discover_slice_features(kube_version)
            self._slice_settings = SliceSettings(
                driver_name=self.settings.driver_name,
                node_name=self.settings.node_name,
                kube_version=kube_version,
                sharing=self.settings.sharing,
                list_attributes=features.list_attributes,
                passthrough=self.settings.passthrough,
                compatibility_groups_served=features.compatibility_groups,
            )
            self.publisher = SlicePublisher(
                self.rest,
                driver_name=self.settings.driver_name,
                node_name=self.settings.node_name,
                desired=self.desired_slices,
                metrics=self.metrics,
                node=node,
            )
            self.publisher_lease = PublisherLease(self.settings.plugin_dir, self.publisher.start)
            self.publisher_lease.start()
        for thread in self._threads:
            thread.start()
        self.health_keeper.start()
        if self.health_monitor is not None:
            try:
                self.health_monitor.start()
            except NvmlError as exc:
                # Like NVIDIA's driver marks devices "unmonitored": run on, but say so.
                log.warning("GPU health events are not available; devices are not monitored", error=str(exc))
        self.driver_reload.start()

    def readiness(self) -> tuple[bool, str]:
        """/healthz, /readyz: the driver is ready and both kubelet sockets answer (what the kubelet needs)."""
        return plugin_readiness(self.driver_status.status(), serving=self._serving, sockets=self.server.probe,
                                starting="starting: discovery and recovery before the kubelet sockets")

    def liveness(self) -> tuple[bool, str]:
        """/livez: alive while waiting for the driver or starting; once serving, the kubelet sockets must answer."""
        return plugin_liveness(self.driver_status.status(), serving=self._serving, sockets=self.server.probe)

    def stop(self) -> None:
        if self.stopped.is_set():
            return
        self.stop_requested.set()
        self.stopped.set()
        self._rediscover_now.set()
        if self.health_monitor is not None:
            self.health_monitor.request_stop()  # its NVML event wait (up to 1 s) runs out while the rest stops
        log.info("shutting down: no new calls, finishing in-flight ones")
        self.server.stop(grace=self.settings.shutdown_grace)
        if self.publisher_lease is not None:
            self.publisher_lease.release()  # before the publisher stops: nothing can start it afterwards
        if self.publisher is not None:
            self.publisher.stop()
        # Independent of each other, and several wait out an interval (the NVML event wait, an HTTP server's 0.5 s
        # poll): stopped side by side, a pod's termination (a rolling upgrade) is not their sum.
        stops: list[Callable[[], None]] = [self.health_keeper.stop, self.driver_reload.stop]
        if self.annotator is not None:
            stops.append(self.annotator.stop)
        for component in (self.health_monitor, self.usage_sampler, self.healthz, self.metrics_server,
                          self.device_status):
            if component is not None:
                stops.append(component.stop)
        stop_side_by_side(stops)
        if self.events is not None:
            self.events.close()  # after the monitor and the keeper, which record Events
        self._cleanup_now.set()
        self.engine.close()
        if self.driver_wait is not None:
            self.driver_wait.release()  # after everything that calls NVML has stopped
        log.info("shut down")

    def _recovered(self, report: RecoveryReport) -> None:
        log.info(
            "recovery done",
            rebuild_reason=report.rebuild_reason,
            ownership_known=report.ownership_known,
            adopted=len(report.adopted),
            finished=len(report.finished),
            repaired=len(report.repaired),
            destroyed_instances=report.destroyed_instances,
            removed_specs=len(report.removed_specs),
            removed_temp_files=len(report.removed_temp_files),
        )
        if report.destroyed_instances or report.repaired:
            self.rediscover()

    def run_until_signal(self) -> int:
        requested = self._exit_now  # a signal, or a driver upgrade that needs a new process

        def on_signal(signum: int, frame: FrameType | None) -> None:
            log.info("signal received", signal=signal.Signals(signum).name)
            self.stop_requested.set()  # ends a driver wait inside start()
            requested.set()

        def on_hangup(signum: int, frame: FrameType | None) -> None:
            log.info("SIGHUP: re-discovering the hardware")
            self._rediscover_now.set()

        previous = {s: signal.signal(s, on_signal) for s in (signal.SIGTERM, signal.SIGINT)}
        previous[signal.SIGHUP] = signal.signal(signal.SIGHUP, on_hangup)
        try:
            self.start()
            requested.wait()
        finally:
            self.stop()
            for sig, handler in previous.items():
                signal.signal(sig, handler)
        return self.exit_code

    def _rediscovery_loop(self) -> None:
        while not self.stopped.is_set():
            self._rediscover_now.wait(self.settings.rediscovery_interval)
            self._rediscover_now.clear()
            if self.stopped.is_set():
                return
            if self.driver_reload.check():
                continue  # the driver went or changed: its watcher re-discovers once it is back
            try:
                self.rediscover()
            except Exception:
                if self.driver_reload.check():
                    continue
                log.exception("re-discovery failed; keeping the previous inventory")

    def _cleanup_loop(self) -> None:
        # Startup first: claims deleted while the plugin was down are released right away.
        while not self.stopped.is_set():
            if self.driver_reload.reloading:  # releases need the driver: the next round, once it is back
                self._cleanup_now.wait(self.settings.cleanup_interval)
                self._cleanup_now.clear()
                continue
            try:
                # A checkpoint lost while serving, or ownership that could not be rebuilt at startup.
                report = self.engine.recovery.reconcile()
                if report is not None:
                    self._recovered(report)
            except Exception:
                log.exception("rebuilding claim ownership failed; retrying on the next round")
            try:
                self.engine.recovery.cleanup_stale()
                # Claims the cleanup unprepared went without the kubelet: their metadata goes here.
                self.metadata.writer.sweep(self._held_claims)
            except Exception:
                log.exception("stale-claim cleanup failed")
            self._cleanup_now.wait(self.settings.cleanup_interval)
            self._cleanup_now.clear()


def cdi_edits(settings: PluginSettings) -> EditsBuilder:
    """What each prepared device's CDI spec injects: the fake's env only, or the node's driver files, through the
    container toolkit's hooks where the chart says the node has them (docs/gpu-operator.md, docs/nvml-real.md)."""
    if settings.fake_cdi:
        return FakeCdiEdits()
    hook = Path(settings.cdi_hook.host_path) if settings.cdi_hook is not None else None
    return RealCdiEdits(settings.driver_root, settings.host_driver_root, hook_path=hook)


def _daemon_gpus(daemons: MpsDaemons | None) -> set[str]:
    """The GPUs an MPS daemon of this plugin serves (a GPU it serves is not passed through)."""
    if daemons is None:
        return set()
    return {gpu for daemon in daemons.on_disk() for gpu in daemons.recorded_gpus(daemon)}


def stop_side_by_side(stops: Sequence[Callable[[], None]]) -> None:
    """Run each stop in its own thread and wait for all; one that fails is logged and does not keep the rest from
    stopping (each bounds its own wait)."""

    def run(stop: Callable[[], None]) -> None:
        try:
            stop()
        except Exception:
            log.exception("stopping a component failed", component=getattr(stop, "__qualname__", repr(stop)))

    threads = [threading.Thread(target=run, args=(stop,), name="stop", daemon=True) for stop in stops]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
