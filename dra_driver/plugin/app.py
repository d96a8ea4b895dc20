"""Assembles the GPU kubelet plugin from its parts and runs it until SIGTERM.

The assembly, by concern (each `_assemble_*` below, and the module it draws on):
    node state     the NVIDIA driver's status and the wait for it, the device catalog, health board, PCI sysfs
    reporters      Kubernetes Events, the Node's annotation, NVLink fabric problems
    claims         the engine and the prepare pipeline the kubelet's calls reach (claimpipeline.py: what runs on
                   NodePrepareResources), device metadata, status.devices, usage metrics
    health         the device health keeper and the NVML event monitor (health/)
    driver reload  the watcher that waits out an NVIDIA driver reload (driverreload.py, reloadgate.py)
    endpoints      the kubelet sockets (kubeletplugin/server.py), /healthz and /metrics
Start-up order: docs/kubelet-plugin.md "Starting up" (`start` below).
"""

from __future__ import annotations

import signal
import threading
import time
from collections.abc import Callable
from dataclasses import replace
from typing import TYPE_CHECKING

import structlog

from dra_driver.inventory.discover import discover
from dra_driver.inventory.passthrough import PassthroughSettings
from dra_driver.k8s.client import ApiError, JsonObject, KubeRest
from dra_driver.k8s.events import EventRecorder
from dra_driver.kubeletplugin.claims import KubeClaimSource
from dra_driver.kubeletplugin.driver import ClaimRef, Driver
from dra_driver.kubeletplugin.metadata import DeviceMetadataWriter, MetadataFiles
from dra_driver.kubeletplugin.names import check_plugin_names
from dra_driver.kubeletplugin.nodeevents import NodeEvents
from dra_driver.kubeletplugin.server import PluginServer
from dra_driver.kubeletplugin.signals import begin_stop, serve_until_signal
from dra_driver.kubeletplugin.statedirs import prepare_cdi_root, prepare_plugin_dir
from dra_driver.nvidiadriver.state import DriverStatusBoard, PluginProbes
from dra_driver.nvidiadriver.wait import DriverWait, wait_for_driver
from dra_driver.nvml.backend import NvmlBackend
from dra_driver.nvml.mps import MpsControl
from dra_driver.nvml.types import NvmlError
from dra_driver.observability.endpoint import HttpEndpoint
from dra_driver.observability.metrics import PluginMetrics
from dra_driver.pci.factory import open_pci_sysfs
from dra_driver.plugin.checkpoint import CheckpointStore
from dra_driver.plugin.claimpipeline import claim_engine, claim_pipeline
from dra_driver.plugin.devicemetadata import DeviceMetadataMode, MetadataAttributes, metadata_enabled
from dra_driver.plugin.devicestatus import DeviceStatusReport, DeviceStatusWriter, WriterSettings
from dra_driver.plugin.driverreload import (
    EXIT_DRIVER_UPGRADED,
    DriverReloadWatcher,
    DriverVersionFile,
    ReloadParts,
    mark_claims_lost_while_down,
    reverify_claims,
)
from dra_driver.plugin.driverreport import DriverReporter, NodeAnnotator
from dra_driver.plugin.engine import PrepareEngine
from dra_driver.plugin.fabricreport import FabricReporter
from dra_driver.plugin.faults import FaultPoints
from dra_driver.plugin.health.board import DeviceHealthBoard
from dra_driver.plugin.health.healing import HealthLedger
from dra_driver.plugin.health.keeper import HealthKeeper, KeeperParts
from dra_driver.plugin.loops import cleanup_loop, rediscovery_loop, stop_side_by_side
from dra_driver.plugin.nodedevices import NodeDeviceParts, NodeDevices
from dra_driver.plugin.nodelabels import (
    SHARING_MODE_LABEL,
    node_labels,
    passthrough_from_label,
    sharing_from_labels,
)
from dra_driver.plugin.ownership import RecoveryReport
from dra_driver.plugin.passthroughfacts import passed_through, passthrough_facts
from dra_driver.plugin.reloadgate import ReloadGate
from dra_driver.plugin.serverfacts import kube_version, slice_features
from dra_driver.plugin.settings import PluginSettings, cdi_edits, check_shared_gpus, slice_settings
from dra_driver.plugin.utilisation import SamplerParts, UtilisationSampler
from dra_driver.ports import listening, write_ports_file

__all__ = ["KubeletPlugin", "PluginSettings", "cdi_edits", "stop_side_by_side"]

if TYPE_CHECKING:
    from dra_driver.kubeletplugin.publishlease import PublisherLease
    from dra_driver.plugin.devicepluginparts import DevicePluginParts
    from dra_driver.plugin.health.monitor import HealthMonitor
    from dra_driver.slices.publisher import SlicePublisher

log = structlog.get_logger(__name__)


class KubeletPlugin:
    engine: PrepareEngine
    driver_reload: DriverReloadWatcher

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
        self._rediscover_now = threading.Event()
        # Wakes the cleanup loop early: on shutdown, and when the checkpoint is found lost or corrupt.
        self._cleanup_now = threading.Event()
        self.exit_code = 0  # EXIT_DRIVER_UPGRADED: the process must restart to load the new driver's NVML library
        self._exit_now = threading.Event()
        self.metrics = PluginMetrics()
        self._assemble_node_state()
        self._assemble_reporters()
        self._assemble_claims(faults, mps_control)
        self._assemble_health(clock)
        self._assemble_driver_reload()
        self._assemble_endpoints()
        self._threads = [
            threading.Thread(target=lambda: cleanup_loop(
                stopped=self.stopped, wake=self._cleanup_now, interval=settings.cleanup_interval,
                reload=self.driver_reload, recovery=self.engine.recovery, recovered=self._recovered,
                swept=lambda: self.metadata.writer.sweep(self._held_claims),
            ), name="stale-claims", daemon=True),
            threading.Thread(target=lambda: rediscovery_loop(
                stopped=self.stopped, wake=self._rediscover_now, interval=settings.rediscovery_interval,
                reload=self.driver_reload, rediscover=self.rediscover,
            ), name="rediscovery", daemon=True),
        ]  # fmt: skip

    # --- assembly, by concern -----------------------------------------------------------------------------

    def _assemble_node_state(self) -> None:
        settings = self.settings
        # Whether the node's NVIDIA driver can serve (nvidiadriver/state.py): the driver wait sets it at
        # start; its listeners report it (log, Node Event, Node annotation) and /healthz reads it.
        self.driver_status = DriverStatusBoard()
        # /healthz, /readyz, /livez: serving once the kubelet sockets are up (after the driver wait, discovery and
        # recovery).
        self.probes = PluginProbes(
            self.driver_status, starting="starting: discovery and recovery before the kubelet sockets"
        )
        self.driver_wait = (
            DriverWait(self.nvml, self.driver_status, settings.driver_wait, stop=self.stop_requested,
                       accept_no_gpus=lambda: self.node_devices.passed_through_now())
            if settings.driver_wait is not None
            else None
        )  # fmt: skip
        self.health = DeviceHealthBoard(pool=settings.node_name)
        # The node's PCI devices: the fake node's for a fake backend, the host's sysfs otherwise.
        self.pci = open_pci_sysfs(self.nvml, sys_root=settings.sysfs_root, dev_root=settings.dev_root)
        self.publisher: SlicePublisher | None = None
        self.publisher_lease: PublisherLease | None = None

    def _assemble_reporters(self) -> None:
        settings = self.settings
        self.events = (
            EventRecorder(self.rest, component=f"{settings.driver_name}-kubelet-plugin", host=settings.node_name)
            if settings.events and settings.publish
            else None
        )
        self.fabric = FabricReporter(node_name=settings.node_name, events=self.events)  # NVLink clique problems
        self.node_devices = NodeDevices(
            NodeDeviceParts(
                nvml=self.nvml, pci=self.pci, mig_offering=settings.mig_offering, health=self.health,
                metrics=self.metrics, fabric=self.fabric, passed=lambda: passed_through(self.engine.prepared_claims()),
                republish=self._republish,
            ),
            slice_settings(settings),
        )  # fmt: skip
        self.devices, self.rediscover, self.desired_slices = (
            self.node_devices.devices, self.node_devices.rediscover, self.node_devices.desired_slices)  # fmt: skip
        # The driver's state and its reloads, a quarantined checkpoint.
        self.node_events = NodeEvents(self.events, settings.node_name)
        self.driver_status.listen(DriverReporter(self.node_events))
        self.annotator = NodeAnnotator(self.rest, settings.node_name) if settings.publish else None
        if self.annotator is not None:
            self.driver_status.listen(self.annotator)

    def _assemble_claims(self, faults: FaultPoints | None, mps_control: MpsControl | None) -> None:
        settings = self.settings
        checkpoint = CheckpointStore(
            settings.plugin_dir / "checkpoint.json",
            boot_id_path=settings.boot_id_path,
            on_loss=lambda reason: self._cleanup_now.set(),
            on_write=self.metrics.checkpoint_write_seconds.observe,
            on_quarantine=lambda path, reason: self.node_events.checkpoint_quarantined(
                settings.driver_name, path, reason
            ),
        )
        parts = claim_engine(
            settings, nvml=self.nvml, checkpoint=checkpoint, claims=KubeClaimSource(self.rest), pci=self.pci,
            devices=self.devices, rediscover=self._rediscover_after_rebind, metrics=self.metrics, faults=faults,
            mps_control=mps_control,
        )  # fmt: skip
        self.engine, self.mig = parts.engine, parts.mig
        # KEP-5304 device metadata of every prepared claim (on or off for good once start() knows the version).
        self.metadata = MetadataFiles(
            DeviceMetadataWriter(driver_name=settings.driver_name, plugin_dir=settings.plugin_dir,
                                 cdi_root=settings.cdi_root, faults=faults.reached if faults is not None else None),
            enabled=settings.device_metadata is DeviceMetadataMode.ON,
        )  # fmt: skip
        # Each prepared device in the claim's status.devices, off the call path (plugin/devicestatus.py).
        self.device_status = DeviceStatusWriter(
            self.rest, WriterSettings(driver_name=settings.driver_name, pool_name=settings.node_name),
            count=lambda outcome: self.metrics.claim_device_status_writes.labels(outcome).inc(),
            kube_version=lambda: self.node_devices.slice_settings.kube_version,
        ) if settings.publish else None  # fmt: skip
        self.usage_sampler = (
            UtilisationSampler(SamplerParts(nvml=self.nvml, checkpoint=checkpoint.load, catalog=self.devices,
                                            get_claim=parts.claims.get_claim, metrics=self.metrics),
                               interval=settings.usage_interval)
            if settings.usage_interval > 0
            else None
        )  # fmt: skip
        self._hook_claim_readers()
        self.device_plugin: DevicePluginParts | None = None
        if settings.device_plugin is not None:
            # Imported here, once, where `--device-plugin on` asks for it (off by default): its server, agent and
            # the device-plugin and pod-resources gRPC stubs are not loaded by a plugin that serves DRA only
            # (docs/benchmarks.md "Kubelet-plugin start-up").
            from dra_driver.plugin.devicepluginparts import device_plugin_parts

            self.device_plugin = device_plugin_parts(
                settings, settings.device_plugin, engine=self.engine, claims=parts.claims, catalog=self.devices,
                health=self.health.snapshot, slices=self.node_devices, republish=self._republish,
                faults=faults.reached if faults is not None else None,
            )  # fmt: skip
        # What the kubelet's calls reach (claimpipeline.py lists the steps).
        self.claim_engine: Driver = claim_pipeline(
            self.engine,
            reload_gate=ReloadGate(self.driver_status, node_name=settings.node_name, engine=self.engine,
                                   suspect=lambda: self.driver_reload.check()),
            descriptions=MetadataAttributes(catalog=self.devices, system=lambda: self.node_devices.system,
                                            list_attributes=lambda: self.node_devices.slice_settings.publishes_lists,
                                            enabled=lambda: self.metadata.enabled),
            metadata=self.metadata,
            events=self.events,
            device_status=DeviceStatusReport(self.device_status, catalog=self.devices, node=settings.node_name)
            if self.device_status is not None else None,
            device_plugin=self.device_plugin.guard if self.device_plugin is not None else None,
        )  # fmt: skip

    def _hook_claim_readers(self) -> None:
        """Who hears of each claim operation inside the engine: the usage sampler (woken), and who learns from the
        ResourceClaim a prepare read instead of a GET of their own."""
        if self.usage_sampler is not None:
            self.engine.after_operation = self.usage_sampler.claims_changed
        readers = [r.note_claim for r in (self.usage_sampler, self.device_status) if r is not None]
        if readers:

            def claim_read(uid: str, claim: JsonObject) -> None:
                for read in readers:
                    read(uid, claim)

            self.engine.claim_read = claim_read

    def _assemble_health(self, clock: Callable[[], float]) -> None:
        settings = self.settings
        self.health_keeper = HealthKeeper(
            HealthLedger(settings.driver_name, heal_after=settings.health_heal_after,
                         heal_after_max=settings.health_heal_after_max),
            KeeperParts(nvml=self.nvml, devices=self.devices, events=self.node_events, metrics=self.metrics,
                        on_change=self.node_devices.health_changed),
            driver_name=settings.driver_name, clock=clock, interval=settings.health_check_interval,
        )  # fmt: skip
        # The NVML event monitor (--health-monitor): built, and its module loaded, after the sockets, where it starts.
        self.health_monitor: HealthMonitor | None = None

    def _start_health_monitor(self) -> None:
        from dra_driver.plugin.health.monitor import HealthMonitor

        self.health_monitor = HealthMonitor(
            self.nvml, driver_name=self.settings.driver_name, devices=self.devices,
            on_problem=self.health_keeper.on_problem, ignored_xids=self.settings.ignored_xids,
            on_wait_error=lambda error: self.driver_reload.on_event_wait_error(error))  # fmt: skip
        try:
            self.health_monitor.start()
        except NvmlError as exc:
            # Like NVIDIA's driver marks devices "unmonitored": run on, but say so.
            log.warning("GPU health events are not available; devices are not monitored", error=str(exc))

    def _assemble_driver_reload(self) -> None:
        settings = self.settings
        self.driver_reload = DriverReloadWatcher(
            ReloadParts(
                nvml=self.nvml,
                board=self.driver_status,
                events=self.node_events,
                metrics=self.metrics,
                version_file=DriverVersionFile(settings.plugin_dir),
                gpus=self.node_devices.nvml_gpus,
                published_version=self.node_devices.driver_version,
                taint=self.node_devices.set_reloading_taint,
                exclusive=lambda: self.engine.parts.operations.exclusive(self.engine.settings.recovery_lock_timeout),
                rediscover=self.rediscover,
                reverify=lambda: reverify_claims(self.engine, node_name=settings.node_name, events=self.events,
                                                 metrics=self.metrics),
                park_monitor=lambda: self.health_monitor.park() if self.health_monitor is not None else None,
                resume_monitor=lambda: self.health_monitor.resume() if self.health_monitor is not None else None,
                exit_for_restart=self._exit_for_restart,
            ),
        )  # fmt: skip

    def _assemble_endpoints(self) -> None:
        settings = self.settings
        self.server = PluginServer(
            driver_name=settings.driver_name, plugin_dir=settings.plugin_dir, registry_dir=settings.registry_dir,
            driver=self.claim_engine, health=self.health, pod_uid=settings.pod_uid,
        )  # fmt: skip
        healthz_port, metrics_port = settings.healthz_port, settings.metrics_port
        self.healthz = listening("--healthz-port", healthz_port, lambda: HttpEndpoint(
            registry=self.metrics.registry, probe=self.probes.readiness, liveness=self.probes.liveness,
            port=healthz_port,
            name="healthz",
        )) if healthz_port is not None else None  # fmt: skip
        self.metrics_server = listening("--metrics-port", metrics_port, lambda: HttpEndpoint(
            registry=self.metrics.registry, port=metrics_port, name="metrics",
        )) if metrics_port is not None else None  # fmt: skip

    # --- the node's devices --------------------------------------------------------------------------------

    def _rediscover_after_rebind(self) -> None:
        """A GPU left or came back to the nvidia driver: re-read now, within the claim operation, so the catalog
        and the slices say so before the kubelet's next call (a GPU given back serves containers at once)."""
        try:
            self.rediscover()
        except Exception:
            log.exception("re-discovery after a passthrough rebind failed; the periodic one retries")
            self._rediscover_now.set()

    def _republish(self) -> None:
        if self.publisher is not None:
            self.publisher.trigger()

    def _set_passthrough(self, passthrough: PassthroughSettings) -> None:
        if passthrough != self.settings.passthrough:
            self.settings = replace(self.settings, passthrough=passthrough)
            self.node_devices.set_passthrough(passthrough)

    def _exit_for_restart(self, message: str) -> None:
        log.error("exiting so that the kubelet restarts the plugin with the new NVIDIA driver", error=message)
        self.exit_code = EXIT_DRIVER_UPGRADED
        self._exit_now.set()

    # --- starting and stopping ------------------------------------------------------------------------------

    def _held_claims(self) -> list[ClaimRef]:
        """Every claim the checkpoint names (in any state): what the device metadata sweep keeps."""
        return [ClaimRef(r.namespace, r.name, uid) for uid, r in self.engine.prepared_claims().claims.items()]

    def _apply_node_labels(self) -> JsonObject | None:
        """The node's labels override the sharing and passthrough flags for this node (plugin/nodelabels.py). Returns
        the Node as read (None: not readable or not there): the slice publisher takes its owner reference from it
        instead of reading it again."""
        try:
            node = self.rest.get(f"/api/v1/nodes/{self.settings.node_name}")
        except ApiError as exc:
            log.warning("could not read this node's labels; --sharing-mode applies", error=str(exc),
                        label=f"{self.settings.driver_name}/{SHARING_MODE_LABEL}")  # fmt: skip
            return None
        labels, name = node_labels(node), self.settings.driver_name
        sharing = sharing_from_labels(name, self.settings.sharing, labels)
        if sharing != self.settings.sharing:
            self.settings = replace(self.settings, sharing=sharing)
            self.node_devices.slice_settings = replace(self.node_devices.slice_settings, sharing=sharing)
        self._set_passthrough(passthrough_from_label(name, self.settings.passthrough, labels))
        return node

    def _hangup(self) -> None:
        log.info("SIGHUP: re-discovering the hardware")
        self._rediscover_now.set()

    def start(self) -> None:
        # Everything that can make the plugin unusable is checked before anything on the node is touched.
        # Start-up order (docs/kubelet-plugin.md "Starting up"): what runs before the sockets is what a prepare
        # needs (the inventory, recovery); the kube version, the slices and the background loops come after.
        check_plugin_names(driver_name=self.settings.driver_name, node_name=self.settings.node_name)
        node = self._apply_node_labels() if self.settings.publish else None
        self.health_keeper.note_node(node)
        self.fabric.note_node(node)
        self.node_events.note_node(node)
        # Served from here on: /livez says alive while the plugin waits, /healthz and /readyz say why it is not ready.
        for endpoint in (self.metrics_server, self.healthz):
            if endpoint is not None:
                endpoint.start()
        if self.settings.ports_file is not None:
            bound = {"healthz": self.healthz, "metrics": self.metrics_server}
            write_ports_file(self.settings.ports_file, {k: e.port for k, e in bound.items() if e is not None})
        if not wait_for_driver(self.driver_wait, self.driver_status, self.nvml, node_name=self.settings.node_name):
            return  # stopped while waiting: nothing on the node was touched, no socket, no slice
        version = self._start_serving_claims()
        if self.device_plugin is not None:
            self.device_plugin.server.start()  # after recovery: ListAndWatch reads the claim checkpoint
        if self.usage_sampler is not None:
            self.usage_sampler.start()
        if self.settings.publish:
            self._start_publishing(version or kube_version(self.rest, self.settings.kube_version), node)
        for thread in self._threads:
            thread.start()
        self.health_keeper.start()
        if self.settings.health_monitor and not self.stop_requested.is_set():
            self._start_health_monitor()
        self.driver_reload.start()

    def _start_serving_claims(self) -> tuple[int, int] | None:
        """Discovery, recovery and the device metadata switch, then the kubelet sockets. Returns the kube version
        (None: not known)."""
        inventory = discover(self.nvml)  # read once: the --shared-gpus check and the first catalog both use it
        check_shared_gpus(self.settings.sharing, inventory)
        self._set_passthrough(passthrough_facts(self.settings.passthrough, inventory, self.pci,
                                                passed_now=self.node_devices.passed_through_now))  # fmt: skip
        prepare_plugin_dir(self.settings.plugin_dir)
        prepare_cdi_root(self.settings.cdi_root)
        devices = self.rediscover(inventory)
        log.info("inventory ready", node=self.settings.node_name, devices=len(devices))
        mark_claims_lost_while_down(self.engine, DriverVersionFile(self.settings.plugin_dir),
                                    self.node_devices.driver_version(), node_name=self.settings.node_name,
                                    events=self.events, metrics=self.metrics)  # fmt: skip
        self._recovered(self.engine.recovery.recover())
        self.engine.record_prepared(self.engine.prepared_claims())
        # Before the sockets: a prepare must find the metadata switch set (the version is one GET).
        version = kube_version(self.rest, self.settings.kube_version) if self.settings.publish else (
            self.settings.kube_version)  # fmt: skip
        self.metadata.enabled = metadata_enabled(self.settings.device_metadata, version)
        self.metadata.writer.sweep(self._held_claims, temp_files=True)
        log.info("device metadata", mode=self.settings.device_metadata.value, enabled=self.metadata.enabled,
                 kube_version=".".join(map(str, version)) if version else None)  # fmt: skip
        if self.device_status is not None:
            self.device_status.start()
        self.server.start()
        self.probes.serving(self.server.probe)
        return version

    def _start_publishing(self, version: tuple[int, int], node: JsonObject | None) -> None:
        # Imported here, once, after the kubelet sockets are up: nothing before registration needs the publisher.
        from dra_driver.kubeletplugin.publishlease import PublisherLease
        from dra_driver.slices.publisher import SlicePublisher

        features = slice_features(self.rest, self.settings, version)
        self.node_devices.slice_settings = replace(self.node_devices.slice_settings, kube_version=version,
                                           list_attributes=features.list_attributes,
                                           compatibility_groups_served=features.compatibility_groups,
                                           node_allocatable_served=features.node_allocatable,
                                           partition_types_served=features.partition_types)  # fmt: skip
        self.publisher = SlicePublisher(self.rest, driver_name=self.settings.driver_name,
                                        node_name=self.settings.node_name, desired=self.desired_slices,
                                        metrics=self.metrics, node=node)  # fmt: skip
        self.publisher_lease = PublisherLease(self.settings.plugin_dir, self.publisher.start)
        self.publisher_lease.start()

    def stop(self) -> None:
        if not begin_stop(self.stopped, self.stop_requested):
            return
        self._rediscover_now.set()
        if self.health_monitor is not None:
            self.health_monitor.request_stop()  # its NVML event wait (up to 1 s) runs out while the rest stops
        log.info("shutting down: no new calls, finishing in-flight ones")
        self.server.stop(grace=self.settings.shutdown_grace)
        if self.device_plugin is not None:
            self.device_plugin.server.stop()
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
                          self.device_status):  # fmt: skip
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
        log.info("recovery done", rebuild_reason=report.rebuild_reason, ownership_known=report.ownership_known,
                 adopted=len(report.adopted), finished=len(report.finished), repaired=len(report.repaired),
                 destroyed_instances=report.destroyed_instances, removed_specs=len(report.removed_specs),
                 removed_temp_files=len(report.removed_temp_files))  # fmt: skip
        if report.destroyed_instances or report.repaired:
            self.rediscover()

    def run_until_signal(self) -> int:
        # Done on a signal, or on a driver upgrade that needs a new process (`_exit_now`).
        serve_until_signal(self.start, self.stop, stop_requested=self.stop_requested, done=self._exit_now,
                           also={signal.SIGHUP: self._hangup})  # fmt: skip
        return self.exit_code
