"""`KubeletSimulator`: the plugin watcher, registration, health and pod sync tied together."""

from __future__ import annotations

import logging
import os
import threading
from dataclasses import dataclass, field, replace
from pathlib import Path

from kubernetes import client as k8s
from kubernetes import config as k8s_config

from dra_sandbox.kubelet.clock import Clock, RealClock
from dra_sandbox.kubelet.devicemanager import DeviceManager
from dra_sandbox.kubelet.health import HealthStore
from dra_sandbox.kubelet.nodestatus import NodeStatusConfig, NodeStatusReporter
from dra_sandbox.kubelet.podips import PodIpAllocator
from dra_sandbox.kubelet.podsync import PodSync, PodSyncConfig
from dra_sandbox.kubelet.processpods import ProcessPodSettings
from dra_sandbox.kubelet.registration import PluginManager, PluginStore, RegistrationConfig
from dra_sandbox.kubelet.versions import KubeletGates
from dra_sandbox.kubelet.watcher import PluginWatcher
from dra_sandbox.runtime import ContainerRuntime, select_runtime
from dra_sandbox.runtime.hostprocess import HostProcessRuntime
from dra_sandbox.startstop import StartStop

log = logging.getLogger(__name__)
DEFAULT_REGISTRY_DIR = Path("/var/lib/kubelet/plugins_registry")
DEFAULT_PLUGINS_DIR = Path("/var/lib/kubelet/plugins")


@dataclass(frozen=True)
class KubeletConfig:
    node_name: str
    registry_dir: Path = DEFAULT_REGISTRY_DIR
    plugins_dir: Path = DEFAULT_PLUGINS_DIR
    registration: RegistrationConfig = field(default_factory=RegistrationConfig)
    pods: PodSyncConfig = field(default_factory=PodSyncConfig)
    # The Node, its status and Lease (with an API client); None: leave the Node to someone else.
    node_status: NodeStatusConfig | None = field(default_factory=NodeStatusConfig)
    use_inotify: bool = True
    # The kubelet's minor version and DRA-related gates (health service, allocatedResourcesStatus and its message).
    gates: KubeletGates = field(default_factory=KubeletGates)
    # The node's pod IP range (loopback, `podips`); None: pods get no IP.
    pod_cidr: str | None = None
    pod_ip_reserved: tuple[str, ...] = ()  # addresses of the range no pod gets (the node's own)
    # Pods whose containers run `dra-driver` run as host processes (`processpods`); None: no pod does.
    process_pods: ProcessPodSettings | None = None
    # The device manager (the device-plugin API and PodResources, devicemanager.py): the dir of its kubelet.sock and
    # the PodResources socket; None: no device manager.
    device_plugins_dir: Path | None = None
    pod_resources_socket: Path | None = None

    def __post_init__(self) -> None:
        if not self.node_name:
            raise ValueError("node_name is empty: give the name of the Node this kubelet runs as")


class KubeletSimulator(StartStop):
    """One node's kubelet. Without an `api_client` only the plugin side runs (watcher, registration, health)."""

    def __init__(
        self,
        config: KubeletConfig,
        runtime: ContainerRuntime,
        api_client: k8s.ApiClient | None = None,
        clock: Clock | None = None,
    ) -> None:
        self.config = config
        self.clock = clock or RealClock()
        self.plugins = PluginStore()
        self.health = HealthStore(self.clock)
        self.manager = PluginManager(self.plugins, self.health, self.clock,
                                     replace(config.registration, gates=config.gates))
        self.watcher = PluginWatcher(
            config.registry_dir, self.manager.socket_added, self.manager.socket_removed,
            use_inotify=config.use_inotify,
        )
        self.pods: PodSync | None = None
        self.node: NodeStatusReporter | None = None
        if api_client is not None and config.node_status is not None:
            self.node = NodeStatusReporter(config.node_name, api_client, runtime.name, config.node_status,
                                           wall=self.clock.wall, wait=self.clock.wait)
        if api_client is not None:
            # UpdateAllocatedResourcesStatus runs only with the ResourceHealthStatus gate (pkg/kubelet/kubelet_pods.go).
            settings = config.process_pods
            ips = PodIpAllocator(config.pod_cidr, config.pod_ip_reserved) if config.pod_cidr else None
            self.pods = PodSync(config.node_name, api_client, self.plugins, runtime, self.clock,
                                replace(config.pods, health_message=config.gates.health_message),
                                self.health if config.gates.health_status else None,
                                pod_ips=ips,
                                processes=HostProcessRuntime(settings.log_root, settings.backoff) if settings else None,
                                process_settings=settings)
        self.runtime = runtime
        self._started = False
        self.devices: DeviceManager | None = None
        if config.device_plugins_dir is not None:
            self.devices = DeviceManager(config.device_plugins_dir, config.pod_resources_socket, self._devices_changed)
            if self.pods is not None:
                self.pods.devices = self.devices
            if self.node is not None:
                self.node.extended = self.devices.resources

    def _devices_changed(self) -> None:
        """A device plugin's list changed: the Node's capacity and allocatable now, and pods waiting may fit."""
        if self.node is not None:
            try:
                self.node.post_status()
            except Exception as exc:  # the periodic status update retries
                log.warning("node status after a device list change: %s", exc)
        if self.pods is not None:
            self.pods.kick()

    def start(self) -> None:
        # The kubelet creates the plugins dir 0750 (plugins create their own subdirectories in it).
        os.makedirs(self.config.plugins_dir, mode=0o750, exist_ok=True)
        if self.node is not None:
            self.node.start()  # registers the Node first, as the kubelet does
        if self.pods is not None:
            self.pods.start()  # deletes this node's slices first, before any plugin can publish
        if self.devices is not None:
            self.devices.start()
        self.watcher.start()
        self._started = True
        log.info("kubelet simulator for node %s started (watcher: %s, runtime: %s)", self.config.node_name,
                 self.watcher.mode, self.runtime.name)

    def stop(self) -> None:
        if not self._started:
            return
        self.watcher.stop()
        if self.devices is not None:
            self.devices.stop()
        self.manager.stop()
        if self.pods is not None:
            self.pods.stop()
        if self.node is not None:
            self.node.stop()
        self._started = False


def run_kubelet(
    node_name: str,
    kubeconfig: str | Path | None,
    registry_dir: str | Path,
    plugins_dir: str | Path,
    runtime: ContainerRuntime | str,
    stop_event: threading.Event,
    *,
    registration: RegistrationConfig | None = None,
    pods: PodSyncConfig | None = None,
    clock: Clock | None = None,
) -> None:
    """Run a kubelet simulator until `stop_event` is set (what a CLI subcommand calls).

    `kubeconfig` None runs only the plugin side. `runtime` is a ContainerRuntime or a mode for
    `select_runtime` ("auto", "podman", "cdi-check").
    """
    chosen = select_runtime(runtime) if isinstance(runtime, str) else runtime
    api_client: k8s.ApiClient | None = None
    if kubeconfig:
        api_client = k8s_config.new_client_from_config(config_file=str(kubeconfig))  # type: ignore[no-untyped-call]
    config = KubeletConfig(
        node_name=node_name,
        registry_dir=Path(registry_dir),
        plugins_dir=Path(plugins_dir),
        registration=registration or RegistrationConfig(),
        pods=pods or PodSyncConfig(),
    )
    simulator = KubeletSimulator(config, chosen, api_client, clock)
    simulator.start()
    try:
        stop_event.wait()
    finally:
        simulator.stop()
        if api_client is not None:
            api_client.close()  # type: ignore[no-untyped-call]
