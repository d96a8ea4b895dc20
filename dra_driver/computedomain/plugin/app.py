"""Assembles the compute-domain kubelet plugin and runs it until SIGTERM.

Beside the GPU plugin on every node (the same image; the chart's DaemonSet runs both containers): its own driver
name (`compute-domain.gpu.dra.dev`), registration and DRA sockets, plugin dir (checkpoint namespace), CDI spec
names, ResourceSlice pool and HTTP ports (--healthz-port: /healthz and /metrics; --metrics-port: /metrics).
Start-up order: ports bound, names checked, the probe and metrics endpoints (/livez alive, /readyz not ready yet),
the wait for the NVIDIA driver (nvidiadriver/wait.py, as the GPU plugin's: on a GPU Operator node the driver often
comes after this pod, and exiting would only crash-loop the container), dirs checked, the node's clique read from
NVML, recovery, sockets, then the slice publisher (behind the publisher lease) and the cleanup loop.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, replace
from pathlib import Path

import structlog

from dra_driver.computedomain.names import DRIVER_NAME, GPU_CLIQUE_LABEL
from dra_driver.computedomain.plugin.cdi import SpecFiles
from dra_driver.computedomain.plugin.checkpoint import CHECKPOINT_NAME, DOMAIN_RECORDS, Checkpoint
from dra_driver.computedomain.plugin.claimplan import DomainEngineSettings
from dra_driver.computedomain.plugin.domains import DomainReader, NodeLabels
from dra_driver.computedomain.plugin.effects.base import DomainTools
from dra_driver.computedomain.plugin.engine import ComputeDomainEngine
from dra_driver.computedomain.plugin.faults import CdFaultPoints
from dra_driver.computedomain.plugin.hostdevices import HostDevices, write_fake_proc
from dra_driver.computedomain.plugin.metrics import CdPluginMetrics
from dra_driver.computedomain.plugin.slices import CdSliceSettings, build_slices
from dra_driver.errors import DraDriverError
from dra_driver.inventory.discover import discover
from dra_driver.inventory.model import NodeInventory
from dra_driver.k8s.client import ApiError, JsonObject, KubeRest
from dra_driver.k8s.events import EventRecorder
from dra_driver.kubeletplugin.checkpoint import CheckpointStore
from dra_driver.kubeletplugin.claimrecord import ClaimCodec
from dra_driver.kubeletplugin.claims import KubeClaimSource
from dra_driver.kubeletplugin.names import check_plugin_names
from dra_driver.kubeletplugin.nodeevents import NodeEvents
from dra_driver.kubeletplugin.pipeline import PreparePipeline
from dra_driver.kubeletplugin.publishlease import PublisherLease
from dra_driver.kubeletplugin.server import PluginServer
from dra_driver.kubeletplugin.signals import begin_stop, serve_until_signal
from dra_driver.kubeletplugin.statedirs import OPERATION_LOCK_NAME, OperationLock, prepare_cdi_root, prepare_plugin_dir
from dra_driver.nvidiadriver.state import (
    DriverState,
    DriverStatus,
    DriverStatusBoard,
    PluginProbes,
)
from dra_driver.nvidiadriver.wait import DriverWait, DriverWaitSettings, wait_for_driver
from dra_driver.nvml.backend import NvmlBackend
from dra_driver.observability.endpoint import HttpEndpoint
from dra_driver.ports import listening
from dra_driver.slices.publisher import SlicePublisher

log = structlog.get_logger(__name__)


def node_clique(inventory: NodeInventory) -> tuple[str, str]:
    """This node's NVLink clique `<clusterUUID>.<cliqueID>` ("" without one) and, where the GPUs' fabric is not
    usable, why (dra_driver/inventory/fabric.py decides both)."""
    return inventory.clique.id or "", inventory.clique.problem or ""


@dataclass(frozen=True)
class CdPluginSettings:
    node_name: str
    plugin_dir: Path
    registry_dir: Path
    cdi_root: Path
    state_dir: Path  # where the daemons' config dirs are (domains/<uid>/); also the host path the CDI mount names
    proc_root: Path  # the host's /proc as this process sees it (a fake tree on the fake NVML)
    driver_namespace: str  # where the ComputeDomainCliques are
    driver_name: str = DRIVER_NAME
    fake: bool = False
    boot_id_path: Path = Path("/proc/sys/kernel/random/boot_id")
    cleanup_interval: float = 600.0
    readiness_wait: float = 10.0
    shutdown_grace: float = 30.0
    pod_uid: str | None = None
    gpu_clique_label: bool = False
    binding_conditions: bool = True
    kube_version: tuple[int, int] | None = None  # None: ask the API server
    healthz_port: int | None = None  # None: no HTTP probe endpoint (0: any free port)
    metrics_port: int | None = None  # None: no Prometheus endpoint of its own (still on the healthz port)
    # Waiting for the NVIDIA driver at start: the plugin initialises NVML itself. None: the caller did (tests), and
    # the driver is taken as ready.
    driver_wait: DriverWaitSettings | None = None


class ComputeDomainPlugin:
    def __init__(self, settings: CdPluginSettings, *, nvml: NvmlBackend, rest: KubeRest,
                 faults: CdFaultPoints | None = None) -> None:
        self.settings = settings
        self.nvml = nvml
        self.rest = rest
        self.stopped = threading.Event()
        self.stop_requested = threading.Event()  # SIGTERM: ends the driver wait at once
        self._wake = threading.Event()
        self.clique_id = ""
        # The GPU plugin beside it reports the driver's state on the Node (Events, annotation); this one logs it and
        # says it on /readyz.
        self.driver_status = DriverStatusBoard()
        self.driver_status.listen(_log_driver_state)
        # /healthz, /readyz, /livez: serving once the kubelet sockets are up (after the driver wait and recovery).
        self.probes = PluginProbes(self.driver_status, starting="starting: recovery before the kubelet sockets")
        self.driver_wait = (
            DriverWait(nvml, self.driver_status, settings.driver_wait, stop=self.stop_requested)
            if settings.driver_wait is not None
            else None
        )
        self.labels = NodeLabels(rest, settings.node_name)
        self.tools = DomainTools(
            node_name=settings.node_name, state_dir=settings.state_dir, host=HostDevices(settings.proc_root),
            labels=self.labels, domains=DomainReader(rest, driver_namespace=settings.driver_namespace),
            faults=faults or CdFaultPoints(),
        )
        self.metrics = CdPluginMetrics()
        # Events on the Node: a checkpoint it could not use was moved aside (CheckpointQuarantined).
        self.events = EventRecorder(rest, component=f"{settings.driver_name}-kubelet-plugin", host=settings.node_name)
        self.node_events = NodeEvents(self.events, settings.node_name)
        self.store = CheckpointStore[Checkpoint](
            settings.plugin_dir / CHECKPOINT_NAME, ClaimCodec(DOMAIN_RECORDS), boot_id_path=settings.boot_id_path,
            on_quarantine=lambda path, reason: self.node_events.checkpoint_quarantined(settings.driver_name, path,
                                                                                       reason),
        )
        self.engine = ComputeDomainEngine(
            DomainEngineSettings(driver_name=settings.driver_name, node_name=settings.node_name,
                           readiness_wait_s=settings.readiness_wait),
            claims=KubeClaimSource(rest), store=self.store,
            specs=SpecFiles(settings.cdi_root, settings.driver_name, settings.node_name),
            tools=self.tools, clique_id=lambda: self.clique_id,
            lock=OperationLock(settings.plugin_dir / OPERATION_LOCK_NAME), metrics=self.metrics,
        )
        self.metrics.prepared_claims.set_function(self._prepared_claims)
        # What runs on NodePrepareResources and NodeUnprepareResources (kubeletplugin/pipeline.py): the engine alone,
        # with no guard or observer (the wait for the domain's readiness is the engine's; no device metadata, claim
        # Events or status.devices are written for ComputeDomain claims).
        self.claim_pipeline = PreparePipeline(self.engine)
        self.server = PluginServer(driver_name=settings.driver_name, plugin_dir=settings.plugin_dir,
                                   registry_dir=settings.registry_dir, driver=self.claim_pipeline,
                                   pod_uid=settings.pod_uid)  # fmt: skip
        # Bound here, so a taken port fails before anything on the node changes (as the GPU plugin's).
        healthz_port, metrics_port = settings.healthz_port, settings.metrics_port
        self.healthz = listening("--healthz-port", healthz_port, lambda: HttpEndpoint(
            registry=self.metrics.registry, probe=self.probes.readiness, liveness=self.probes.liveness,
            port=healthz_port,
            name="cd-healthz",
        )) if healthz_port is not None else None
        try:
            self.metrics_server = listening("--metrics-port", metrics_port, lambda: HttpEndpoint(
                registry=self.metrics.registry, port=metrics_port, name="cd-metrics",
            )) if metrics_port is not None else None
        except DraDriverError:
            if self.healthz is not None:
                self.healthz.stop()
            raise
        self._slices = CdSliceSettings(driver_name=settings.driver_name, node_name=settings.node_name,
                                       binding_conditions=settings.binding_conditions)
        self.publisher: SlicePublisher | None = None
        self.lease: PublisherLease | None = None
        self._cleanup = threading.Thread(target=self._cleanup_loop, name="cd-cleanup", daemon=True)

    def _prepared_claims(self) -> float:
        try:
            return len(self.engine.prepared())
        except DraDriverError:  # an unreadable checkpoint: the scrape still answers, prepare reports the problem
            return float("nan")

    def desired_slices(self, generation: int) -> list[JsonObject]:
        return build_slices(self._slices, generation)

    def _kube_version(self) -> tuple[int, int]:
        if self.settings.kube_version is not None:
            return self.settings.kube_version
        try:
            info = self.rest.request("GET", "/version")
            minor = int("".join(ch for ch in str(info.get("minor", "35")) if ch.isdigit()) or 35)
            return int(info.get("major", 1)), minor
        except (ApiError, ValueError) as exc:
            log.warning("could not read the API server version; publishing without binding conditions",
                        error=str(exc))
            return (1, 35)

    def start(self) -> None:
        s = self.settings
        check_plugin_names(driver_name=s.driver_name, node_name=s.node_name)
        # Served from here on: /livez says alive while the plugin waits, /readyz says why it is not ready.
        if self.metrics_server is not None:
            self.metrics_server.start()
        if self.healthz is not None:
            self.healthz.start()
        if not wait_for_driver(self.driver_wait, self.driver_status, self.nvml, node_name=s.node_name):
            return  # stopped while waiting: nothing on the node was touched, no socket, no slice
        prepare_plugin_dir(s.plugin_dir)
        prepare_cdi_root(s.cdi_root)
        s.state_dir.mkdir(parents=True, exist_ok=True)
        if s.fake:
            write_fake_proc(s.proc_root)
        self.clique_id, problem = node_clique(discover(self.nvml))
        if problem:
            log.warning("this node's NVLink fabric is not usable; IMEX channels get no device", problem=problem)
        log.info("compute-domain plugin starting", node=s.node_name, clique=self.clique_id or None)
        try:
            self.node_events.note_node(self.labels.node())  # the Node's UID for the Events (before recovery reads)
        except ApiError as exc:
            log.warning("could not read this node; its Events carry no UID", error=str(exc))
        report = self.engine.recovery.recover()
        log.info("recovery done", rolled_back=len(report.rolled_back), finished=len(report.finished),
                 expired=len(report.expired), repaired=len(report.repaired), swept=report.swept,
                 ownership_known=report.ownership_known)
        self.server.start()
        self.probes.serving(self.server.probe)
        self._slices = replace(self._slices, clique_id=self.clique_id, kube_version=self._kube_version())
        self.publisher = SlicePublisher(self.rest, driver_name=s.driver_name, node_name=s.node_name,
                                        desired=self.desired_slices)
        self.lease = PublisherLease(s.plugin_dir, self.publisher.start)
        self.lease.start()
        self._set_clique_label()
        self._cleanup.start()

    def _set_clique_label(self) -> None:
        """`nvidia.com/gpu.clique` as GPU Feature Discovery sets it, behind --gpu-clique-label (off by default:
        GFD may own it)."""
        if not self.settings.gpu_clique_label or not self.clique_id:
            return
        try:
            self.labels.update(GPU_CLIQUE_LABEL, lambda current: self.clique_id)
        except ApiError as exc:
            log.warning("could not set the clique label", label=GPU_CLIQUE_LABEL, error=str(exc))

    def _clear_clique_label(self) -> None:
        if not self.settings.gpu_clique_label or not self.clique_id:
            return
        try:
            self.labels.update(GPU_CLIQUE_LABEL, lambda current: None if current == self.clique_id else current)
        except ApiError as exc:
            log.warning("could not remove the clique label", label=GPU_CLIQUE_LABEL, error=str(exc))

    def _cleanup_loop(self) -> None:
        while not self.stopped.is_set():
            self._wake.wait(self.settings.cleanup_interval)
            self._wake.clear()
            if self.stopped.is_set():
                return
            try:
                self.engine.recovery.cleanup()
                self._set_clique_label()
            except Exception:
                log.exception("compute-domain cleanup failed; retrying on the next round")

    def stop(self) -> None:
        if not begin_stop(self.stopped, self.stop_requested):
            return
        self._wake.set()
        self.server.stop(grace=self.settings.shutdown_grace)
        for endpoint in (self.healthz, self.metrics_server):
            if endpoint is not None:
                endpoint.stop()
        if self.lease is not None:
            self.lease.release()
        if self.publisher is not None:
            self.publisher.stop()
        self._clear_clique_label()
        self.engine.close()
        self.events.close()
        if self.driver_wait is not None:
            self.driver_wait.release()
        log.info("shut down")

    def run_until_signal(self) -> int:
        serve_until_signal(self.start, self.stop, stop_requested=self.stop_requested, done=threading.Event())
        return 0


def _log_driver_state(previous: DriverStatus, current: DriverStatus) -> None:
    if current.state is DriverState.READY:
        log.info("NVIDIA driver ready", driver_version=current.driver_version)
    else:
        log.warning("NVIDIA driver not ready; waiting", state=current.state.value, reason=current.reason)
