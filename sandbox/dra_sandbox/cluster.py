"""A whole local cluster: API server, a scheduler stand-in, and per node a kubelet simulator plus the REAL
kubelet plugin (`dra-driver kubelet-plugin` in its own process, configured through DRA_DRIVER_* env vars,
exactly as the Helm chart runs it) on fake GPUs.

Used by the e2e scenarios, the crash tests and `make demo`.
"""

from __future__ import annotations

import base64
import contextlib
import hashlib
import logging
import os
import secrets
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from functools import partial
from pathlib import Path
from typing import Any, Protocol

import structlog

from dra_driver import defaults
from dra_driver.cdi.model import ContainerEdits
from dra_driver.computedomain.names import DRIVER_NAME as CD_DRIVER_NAME
from dra_driver.controller.computedomains.loop import ComputeDomainSettings
from dra_driver.deviceplugin.cdispecs import AllocationSpecs
from dra_driver.fsutil import sweep_temp_files
from dra_driver.inventory.catalog import AllocatableDevice
from dra_driver.k8s.client import ApiError, JsonObject, KubeRest
from dra_driver.kubeletplugin.metadata import DeviceMetadataWriter
from dra_driver.kubeletplugin.server import SocketPaths
from dra_driver.plugin.cdi import ClaimSpecWriter, FakeCdiEdits
from dra_driver.ports import read_ports_file
from dra_sandbox.apiserver import ApiServer
from dra_sandbox.apiserver.validation.options import parse_kube_version
from dra_sandbox.cdilock import SystemCdiLock
from dra_sandbox.children import kill, terminate
from dra_sandbox.computedomainplugin import COMPUTE_DOMAIN_NAMESPACE, CdPluginProcess, wants_compute_domains
from dra_sandbox.devicetainteviction import DeviceTaintEvictionController
from dra_sandbox.imex import install_standins
from dra_sandbox.kubelet.nodestatus import NodeFacts, NodeStatusConfig
from dra_sandbox.kubelet.podips import node_ip, node_pod_cidr
from dra_sandbox.kubelet.processpods import ProcessPodSettings
from dra_sandbox.kubelet.registration import RegistrationConfig
from dra_sandbox.kubelet.simulator import KubeletConfig, KubeletSimulator
from dra_sandbox.kubelet.versions import KubeletGates
from dra_sandbox.nodelifecycle import NODE_MONITOR_GRACE_PERIOD_S, NODE_MONITOR_PERIOD_S, NodeLifecycleController
from dra_sandbox.polling import socket_accepts, wait_for
from dra_sandbox.runtime import CdiCheckedRuntime, ContainerRuntime, select_runtime
from dra_sandbox.scheduler import SandboxScheduler

log = structlog.get_logger(__name__)

SYSTEM_CDI_DIR = Path("/var/run/cdi")
SYSTEM_CDI_WAIT_S = 300.0  # runtime podman forced: how long to wait for another sandbox to leave SYSTEM_CDI_DIR
# What a sandbox reports (`/version`) unless told otherwise: the newest release it models (1.34-1.37), so `dra-sandbox
# up` shows what a current cluster does. The e2e sandbox reports the kind recipe's release instead (E2E_KUBE_VERSION).
DEFAULT_KUBE_VERSION = "1.37.0"
GPU_NODE_LABELS = {"nvidia.com/gpu.present": "true", "feature.node.kubernetes.io/pci-10de.present": "true"}


@dataclass(frozen=True)
class NodeSpec:
    name: str
    nvml: str  # e.g. "fake:dgx-h100" (a state file and a seed are added per node)
    mig_mode: str = "dynamic"
    labels: Mapping[str, str] = field(default_factory=dict)
    plugin_env: Mapping[str, str] = field(default_factory=dict)  # extra env for this node's plugin (its flags)
    # Also run the compute-domain kubelet plugin on this node; None: on for gb200-nvl72 nodes
    # (dra_sandbox/computedomainplugin.py).
    compute_domains: bool | None = None
    # The node starts without its NVIDIA kernel driver (the fake NVML's `driver=absent`, as while the GPU Operator's
    # driver container still installs it): the cluster does not wait for its plugin to register or publish, only for
    # its /healthz to answer; `dra-sandbox nvidia-driver load` brings the driver (docs/sandbox.md "The NVIDIA driver").
    driver_absent: bool = False


class PluginLauncher(Protocol):
    """How a node's plugin process is started, when not as the local console script (e.g. from the container
    image under podman: dra_sandbox.image). The process gets the env too; `command` may pass it on."""

    def command(self, plugin: PluginProcess, env: Mapping[str, str]) -> list[str]:
        """The argv of `dra-driver kubelet-plugin` for this plugin, with its DRA_DRIVER_* settings in `env`."""
        ...

    def prepare(self, plugin: PluginProcess) -> None:
        """Called before each start (create the directories to mount, remove a leftover container, ...)."""
        ...

    def cleanup(self, plugin: PluginProcess) -> None:
        """Called after the process ended (stop, kill): remove what outlives it (a container)."""
        ...


@dataclass(frozen=True)
class ClusterConfig:
    work_dir: Path
    nodes: Sequence[NodeSpec]
    driver_name: str = defaults.DRIVER_NAME
    runtime: str = "auto"  # auto | podman | cdi-check
    kube_version: str = DEFAULT_KUBE_VERSION
    device_classes: Sequence[JsonObject] = ()
    plugin_env: Mapping[str, str] = field(default_factory=dict)  # extra env for every plugin process
    seamless_upgrade: bool = False  # per-pod socket names, so `upgrade_plugin` can run two side by side
    # Install the GpuSharingPolicy CRD and run `dra-driver controller` (embedded, in a thread) against the cluster.
    controller: bool = False
    # With `controller`: also serve its validating admission webhook (a test CA made with openssl, and the
    # ValidatingWebhookConfiguration the chart renders with webhook.enabled, failurePolicy Fail).
    webhook: bool = False
    # None: `python -m dra_driver.cli kubelet-plugin` from this environment; else e.g. dra_sandbox.image's podman
    # launcher, which runs the plugin from the container image with the chart's security settings.
    plugin_launcher: PluginLauncher | None = None
    # kube-controller-manager's --node-monitor-grace-period: how long after a kubelet's last Lease renewal (or status
    # heartbeat) its Node turns Unknown and gets the unreachable taints. Tests that stop a kubelet use a short one.
    node_monitor_grace_period_s: float = NODE_MONITOR_GRACE_PERIOD_S
    node_monitor_period_s: float = NODE_MONITOR_PERIOD_S
    # Pod IPs: node i's pods get 127.<octet>.<i+1>.0/24 (dra_sandbox.kubelet.podips); None: an octet derived from
    # the work dir, so two sandboxes on one machine rarely share addresses.
    pod_network_octet: int | None = None
    # Pods whose containers run `dra-driver` (the IMEX daemon pods) run as host processes of the kubelet.
    process_pods: bool = True
    # With `controller`: also reconcile ComputeDomains (the chart's default): their CRDs, the compute-domain
    # DeviceClasses, and `--compute-domains` with the daemons in COMPUTE_DOMAIN_NAMESPACE (docs/compute-domains.md);
    # None: on when a node runs the compute-domain plugin (gb200-nvl72).
    compute_domains: bool | None = None
    # How long start() waits for each plugin to serve (many nodes with two plugins each start slowly on 2 cores).
    serve_timeout_s: float = 30.0
    # Every node's kubelet runs the device manager and its plugin `--device-plugin on` (docs/device-plugin.md).
    device_plugin: bool = False
    # --feature-gates beyond the release's defaults, for the API server and the scheduler stand-in alike (e.g.
    # GenericWorkload and DRAWorkloadResourceClaims for KEP-5729 PodGroups, DRADerivedAttributes).
    feature_gates: Mapping[str, bool] = field(default_factory=dict)


class PluginHost(Protocol):
    """What a node's plugin process needs from the cluster it runs in: a SandboxCluster, or the simulated nodes
    joined to an upstream control plane (dra_sandbox.upstream.simnodes)."""

    @property
    def config(self) -> ClusterConfig: ...

    @property
    def kubeconfig(self) -> Path: ...

    @property
    def cdi_root(self) -> Path: ...


def pod_network_octet(work_dir: Path) -> int:
    """The second octet of a sandbox's pod IPs (127.<octet>.<node>.<pod>), derived from its work dir, so two
    sandboxes on one machine rarely share addresses."""
    digest = hashlib.sha256(str(work_dir.resolve()).encode()).digest()
    return 16 + digest[0] % 239


class PluginProcess:
    """One node's `dra-driver kubelet-plugin` process."""

    def __init__(self, node: NodeSpec, cluster: PluginHost, pod_uid: str | None = None) -> None:
        self.node = node
        self.pod_uid = pod_uid  # set: per-instance socket names, as the chart's seamlessUpgrade does
        self.dir = cluster.config.work_dir / node.name
        self.registry_dir = self.dir / "plugins_registry"
        self.plugins_dir = self.dir / "plugins"
        self.plugin_dir = self.plugins_dir / cluster.config.driver_name
        # A directory of its own: the fake NVML keeps `<state>.lock` beside it, and a container mounts the directory.
        self.state_dir = self.dir / "nvml"
        self.state_file = self.state_dir / "nvml-state.json"
        # The node's fake NVML as a `--nvml` value, for `dra-driver inventory --nvml "$(cat <node>/nvml/spec)"`.
        self.spec_file = self.state_dir / "spec"
        self.boot_id_file = self.dir / "boot_id"
        # With `device_plugin`: the node's device-plugins dir and PodResources socket (its kubelet serves both).
        self.device_plugins_dir = self.dir / "device-plugins"
        self.pod_resources_socket = self.dir / "pod-resources" / "kubelet.sock"
        # Its own /metrics and /healthz ports: plugins of several nodes (and other sandboxes on this machine) share
        # the host's network, where the default ports fit one plugin only. The plugin binds port 0 and reports the
        # ports the kernel gave it in `ports_file` (`--ports-file`): a port chosen here and bound there later could
        # be taken by any other process in between. The healthz port is copied to `healthz-port` for curl.
        self.ports_file = self.state_dir / "ports.json"  # state_dir: mounted when the plugin runs in a container
        self.healthz_port_file = self.dir / "healthz-port"
        self.log_file = self.dir / "plugin.log"
        self._cluster = cluster
        self.process: subprocess.Popen[bytes] | None = None
        # time.monotonic() when the process was last started (compare RegisteredPlugin.registered_at: same clock).
        self.started_at: float | None = None
        self.serving_at: float | None = None  # when wait_serving() last saw both sockets accept
        self.sockets = SocketPaths.for_instance(self.registry_dir, self.plugin_dir, cluster.config.driver_name, pod_uid)

    @property
    def nvml_spec(self) -> str:
        absent = ",driver=absent" if self.node.driver_absent else ""
        return f"{self.node.nvml},state={self.state_file},seed={self.node.name}{absent}"

    def env(self, extra: Mapping[str, str] | None = None) -> dict[str, str]:
        cfg = self._cluster.config
        env = {k: v for k, v in os.environ.items() if not k.startswith("DRA_DRIVER_")}
        env.update(
            {
                "DRA_DRIVER_NODE_NAME": self.node.name,
                "DRA_DRIVER_DRIVER_NAME": cfg.driver_name,
                "DRA_DRIVER_KUBECONFIG": str(self._cluster.kubeconfig),
                "DRA_DRIVER_PLUGIN_DIR": str(self.plugin_dir),
                "DRA_DRIVER_REGISTRY_DIR": str(self.registry_dir),
                "DRA_DRIVER_CDI_ROOT": str(self._cluster.cdi_root),
                "DRA_DRIVER_NVML": self.nvml_spec,
                "DRA_DRIVER_MIG_MODE": self.node.mig_mode,
                "DRA_DRIVER_HEALTHZ_PORT": "0",
                "DRA_DRIVER_METRICS_PORT": "0",
                "DRA_DRIVER_PORTS_FILE": str(self.ports_file),
                "DRA_DRIVER_BOOT_ID_PATH": str(self.boot_id_file),
                "DRA_DRIVER_LOG_FORMAT": "text",
                "DRA_DRIVER_REDISCOVERY_INTERVAL": "2",
                "DRA_DRIVER_CLEANUP_INTERVAL": "5",
                "DRA_DRIVER_POD_UID": self.pod_uid or "",
                **({"DRA_DRIVER_DEVICE_PLUGIN": "on", "DRA_DRIVER_DEVICE_PLUGIN_DIR": str(self.device_plugins_dir),
                    "DRA_DRIVER_POD_RESOURCES_SOCKET": str(self.pod_resources_socket)} if cfg.device_plugin else {}),
                **cfg.plugin_env,
                **self.node.plugin_env,
                **(extra or {}),
            }
        )
        return env

    @property
    def cluster(self) -> PluginHost:
        return self._cluster

    def ports(self) -> dict[str, int] | None:
        """The HTTP ports the running plugin reported (`healthz`, `metrics`), None before it did."""
        return read_ports_file(self.ports_file)

    @property
    def healthz_port(self) -> int | None:
        return (self.ports() or {}).get("healthz")

    @property
    def metrics_port(self) -> int | None:
        return (self.ports() or {}).get("metrics")

    def _note_ports(self) -> bool:
        """True once the plugin reported its ports (then also written to `healthz-port`, for curl)."""
        port = self.healthz_port
        if port is None:
            return False
        if not self.healthz_port_file.exists():
            self.healthz_port_file.write_text(f"{port}\n")
        return True

    def start(self, extra_env: Mapping[str, str] | None = None) -> None:
        self.dir.mkdir(parents=True, exist_ok=True)
        self.state_dir.mkdir(exist_ok=True)
        self.spec_file.write_text(self.nvml_spec + "\n")
        # A predecessor's ports are not this process's: gone until the new process reports its own.
        self.ports_file.unlink(missing_ok=True)
        self.healthz_port_file.unlink(missing_ok=True)
        if not self.boot_id_file.exists():
            self.boot_id_file.write_text(f"sandbox-{self.node.name}\n")
        env = self.env(extra_env)
        launcher = self._cluster.config.plugin_launcher
        if launcher is None:
            argv = [sys.executable, "-m", "dra_driver.cli", "kubelet-plugin"]
        else:
            launcher.prepare(self)
            argv = launcher.command(self, env)
        with open(self.log_file, "ab") as out:
            self.started_at = time.monotonic()
            # Its own process group: a Ctrl-C on the terminal reaches only the sandbox, which stops the plugins in
            # order (SIGTERM, then wait), instead of every process of the group dying at once.
            self.process = subprocess.Popen(
                argv, env=env, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, process_group=0
            )

    def wait_serving(self, timeout: float = 30.0) -> None:
        def up() -> bool:
            if self.process is not None and self.process.poll() is not None:
                raise RuntimeError(f"plugin of {self.node.name} exited {self.process.returncode}; see {self.log_file}")
            # A SIGKILLed predecessor leaves its socket files behind: only a live listener counts.
            return (self._note_ports() and socket_accepts(self.sockets.registration)
                    and socket_accepts(self.sockets.dra))

        wait_for(up, timeout, f"the kubelet plugin of {self.node.name} to serve")
        self.serving_at = time.monotonic()

    def healthz(self) -> tuple[int, str] | None:
        """`GET /healthz` of the plugin: (HTTP status, body), or None while nothing answers on its port."""
        port = self.healthz_port
        return None if port is None else plugin_healthz(port)

    def wait_probed(self, timeout: float = 30.0) -> None:
        """Until the plugin answers /healthz (ready or not): how a node without its driver counts as started."""
        def answers() -> bool:
            if self.process is not None and self.process.poll() is not None:
                raise RuntimeError(f"plugin of {self.node.name} exited {self.process.returncode} while the node has "
                                   f"no NVIDIA driver (it must wait for it); see {self.log_file}")
            return self._note_ports() and self.healthz() is not None

        wait_for(answers, timeout, f"the kubelet plugin of {self.node.name} to answer /healthz")

    def stop(self, timeout: float = 20.0) -> int | None:
        try:
            return terminate(self.process, timeout)
        finally:
            self._cleanup()

    def kill(self) -> None:
        kill(self.process)
        self._cleanup()

    def _cleanup(self) -> None:
        launcher = self._cluster.config.plugin_launcher
        if launcher is not None:
            launcher.cleanup(self)

    def wait_exit(self, timeout: float) -> int:
        assert self.process is not None
        return self.process.wait(timeout)


def plugin_healthz(port: int) -> tuple[int, str] | None:
    """`GET /healthz` of a plugin on this host: (HTTP status, body), or None while nothing answers on `port`."""
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=2) as answer:
            return int(answer.status), answer.read().decode(errors="replace").strip()
    except urllib.error.HTTPError as exc:
        return int(exc.code), exc.read().decode(errors="replace").strip()
    except OSError:
        return None


def remove_node_specs(cdi_root: Path, driver_name: str, nodes: Iterable[str]) -> list[str]:
    """Remove the CDI specs (and half-written temp files) the plugins of `nodes` wrote in `cdi_root`, claims' and the
    device plugin's, through the plugin's own writers, which touch only files of this driver and that node. Returns
    the claim UIDs and device-plugin allocation keys removed.
    Only for a directory this sandbox owns: its own, or /var/run/cdi while it holds the SystemCdiLock."""
    removed: list[str] = []
    for node in nodes:
        writer = ClaimSpecWriter(cdi_root, driver_name, FakeCdiEdits(), node)
        for uid in sorted(writer.claim_uids_on_disk()):
            writer.remove(uid)
            removed.append(uid)
        writer.sweep_temp_files()
        # The device plugin's specs (`--device-plugin`): a pod still holding its GPUs when the sandbox stops keeps one.
        allocations = AllocationSpecs(cdi_root, driver_name, node, _no_edits)
        for key in sorted(allocations.keys_on_disk()):
            allocations.remove(key)
            removed.append(key)
        sweep_temp_files(cdi_root, allocations.is_temp_file)
    if removed:
        log.info("sandbox: removed the CDI specs of claims still prepared", cdi_root=str(cdi_root), claims=removed)
    return removed


def _no_edits(gpus: Sequence[AllocatableDevice]) -> tuple[tuple[ContainerEdits, ...], ContainerEdits]:
    raise AssertionError("removing specs writes none")


WEBHOOK_SERVICE = ("dra-driver", "dra-driver-controller-webhook")  # namespace, name (as the chart's)


# Ports handed out to be bound later come from below the kernel's ephemeral range: a port taken from that range
# with bind(("", 0)) and released is the next thing another process's bind(0) (or outgoing connection) may get
# before ours binds it again; a webhook URL then reached a stranger's plain-HTTP server (SSL WRONG_VERSION_NUMBER).
_PICKED_PORTS = (10000, 32768)  # [low, high) when the ephemeral range cannot be read


def _ephemeral_low(path: Path = Path("/proc/sys/net/ipv4/ip_local_port_range")) -> int:
    try:
        return int(path.read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return _PICKED_PORTS[1]


def reserve_tcp_port(host: str = "127.0.0.1") -> socket.socket:
    """A port on `host` held for a server in this process that binds it itself with SO_REUSEADDR (the controller's
    webhook server does: aiohttp's reuse_address). The returned socket is bound with SO_REUSEADDR and never
    listens, so it gets no connection; Linux then lets a SO_REUSEADDR socket bind the port beside it and listen
    there, while the kernel gives the port to no bind(0) and no outgoing connection and refuses a bind without
    SO_REUSEADDR. So the port stays ours from the pick to the server's bind: nothing else can take it in between.
    Close it once the server stopped."""
    held = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM)
    try:
        held.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        held.bind((host, 0))  # bind(0) never picks a port another socket is bound to
    except BaseException:
        held.close()
        raise
    return held


def free_tcp_port() -> int:
    """A TCP port on 127.0.0.1 that is free now, for a server a test starts later (the sandbox's own servers bind
    port 0 or a port it holds: reserve_tcp_port, PluginProcess.ports): chosen at random below the ephemeral
    range (the kernel never hands those out by itself), checked by binding it; an ephemeral one if none binds."""
    low, high = _PICKED_PORTS[0], min(_PICKED_PORTS[1], _ephemeral_low())
    for _ in range(64):
        port = low + secrets.randbelow(high - low) if high > low else 0
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
            return int(s.getsockname()[1])
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def tcp_accepts(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=1):
            return True
    except OSError:
        return False


def make_test_certs(directory: Path) -> None:
    """A throwaway CA and a serving certificate for 127.0.0.1 signed by it (openssl, no shell)."""
    directory.mkdir(parents=True, exist_ok=True)

    def openssl(*args: str) -> None:
        subprocess.run(["openssl", *args], cwd=directory, check=True, capture_output=True, timeout=60)

    openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", "ca.key", "-out", "ca.crt", "-days", "2",
            "-subj", "/CN=sandbox-webhook-ca")
    openssl("req", "-newkey", "rsa:2048", "-nodes", "-keyout", "tls.key", "-out", "tls.csr", "-subj", "/CN=127.0.0.1")
    (directory / "ext").write_text("subjectAltName=IP:127.0.0.1,DNS:localhost\n")
    openssl("x509", "-req", "-in", "tls.csr", "-CA", "ca.crt", "-CAkey", "ca.key", "-CAcreateserial", "-out",
            "tls.crt", "-days", "2", "-extfile", "ext")


def webhook_configuration(ca: bytes, driver: str) -> JsonObject:
    """The ValidatingWebhookConfiguration of charts/dra-driver/templates/webhook.yaml (failurePolicy Fail)."""
    from dra_driver.controller.webhook import HANDLERS

    return {
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "ValidatingWebhookConfiguration",
        "metadata": {"name": "dra-driver"},
        "webhooks": [
            {
                "name": f"{handler}.{driver}",
                "admissionReviewVersions": ["v1"],
                "sideEffects": "None",
                "failurePolicy": "Fail",
                "timeoutSeconds": 5,
                "clientConfig": {
                    "caBundle": base64.b64encode(ca).decode(),
                    "service": {"namespace": WEBHOOK_SERVICE[0], "name": WEBHOOK_SERVICE[1], "path": f"/{handler}",
                                "port": 443},
                },
                "rules": [{"apiGroups": [group], "apiVersions": [version], "resources": [plural],
                           "operations": ["CREATE", "UPDATE"], "scope": "*"}],
            }
            for handler, (group, version, plural) in HANDLERS.items()
        ],
    }


class _InThreadSignals(logging.Filter):
    """kopf warns `OS signals are ignored: running not in the main thread` whenever its operator runs in another
    thread, as the sandbox runs the controller on purpose (stopped by its stop flag, not by a signal): a debug line
    here, shown only where debug logging is on. Stateless: one instance serves every cluster."""

    def filter(self, record: logging.LogRecord) -> bool:
        if record.levelno == logging.WARNING and record.getMessage().startswith(
                "OS signals are ignored: running not in the main thread"):
            record.levelno, record.levelname = logging.DEBUG, "DEBUG"
            return logging.getLogger(record.name).isEnabledFor(logging.DEBUG)
        return True


_THREAD_SIGNALS = _InThreadSignals()


class SandboxCluster:
    def __init__(self, config: ClusterConfig) -> None:
        self.config = config
        # Held until stop(): the webhook server binds the port itself, SO_REUSEADDR beside this (reserve_tcp_port).
        self._webhook_port_held = reserve_tcp_port() if config.webhook else None
        self.webhook_port = int(self._webhook_port_held.getsockname()[1]) if self._webhook_port_held is not None else 0
        urls = {"/".join(WEBHOOK_SERVICE): f"https://127.0.0.1:{self.webhook_port}"} if config.webhook else {}
        # `kubectl logs` of the pods the kubelets run as processes: each node keeps them under <node>/pods.
        log_roots = [config.work_dir / node.name / "pods" for node in config.nodes]
        self.server = ApiServer(port=0, kube_version=config.kube_version, webhook_service_urls=urls,
                                pod_log_roots=log_roots, feature_gates=config.feature_gates)
        self.kubeconfig = config.work_dir / "kubeconfig"
        self.cdi_root = config.work_dir / "cdi"
        self.runtime: ContainerRuntime | None = None
        self.rest: KubeRest | None = None
        self.scheduler: SandboxScheduler | None = None
        self.node_lifecycle: NodeLifecycleController | None = None
        self.device_taint_eviction: DeviceTaintEvictionController | None = None
        self.plugins: dict[str, PluginProcess] = {}
        self.cd_plugins: dict[str, CdPluginProcess] = {}  # node -> its compute-domain kubelet plugin
        self.kubelets: dict[str, KubeletSimulator] = {}
        self.controller: threading.Thread | None = None
        self._controller_stop = threading.Event()
        self._system_cdi_lock: SystemCdiLock | None = None

    @property
    def kube_minor(self) -> int:
        """The reported minor version, clamped to the versions the sandbox models (1.34-1.37)."""
        return min(max(parse_kube_version(self.config.kube_version)[1], 34), 37)

    # --- lifecycle -------------------------------------------------------------------------------------

    def start(self) -> None:
        self.config.work_dir.mkdir(parents=True, exist_ok=True)
        self.runtime = self._choose_runtime()
        self.server.start()
        self.server.write_kubeconfig(self.kubeconfig)
        self.rest = self.server.rest()
        for cls in self.config.device_classes:
            self.apply(cls)
        octet = self.pod_network_octet()
        processes = self._process_pod_settings()
        for index, node in enumerate(self.config.nodes):
            plugin = PluginProcess(node, self, str(uuid.uuid4()) if self.config.seamless_upgrade else None)
            self.plugins[node.name] = plugin
            kubelet = KubeletSimulator(
                KubeletConfig(
                    node_name=node.name,
                    registry_dir=plugin.registry_dir,
                    plugins_dir=plugin.plugins_dir,
                    registration=RegistrationConfig(poll_interval_s=2.0),
                    # The kubelet registers the Node with these as its --node-labels.
                    node_status=NodeStatusConfig(labels={**GPU_NODE_LABELS, **node.labels}, facts=replace(
                        NodeFacts.from_host(node.name, self.runtime.name), internal_ip=node_ip(octet, index))),
                    gates=KubeletGates(minor=self.kube_minor),
                    pod_cidr=node_pod_cidr(octet, index),
                    pod_ip_reserved=(node_ip(octet, index),),
                    device_plugins_dir=plugin.device_plugins_dir if self.config.device_plugin else None,
                    pod_resources_socket=plugin.pod_resources_socket if self.config.device_plugin else None,
                    process_pods=None if processes is None else replace(
                        processes, log_root=plugin.dir / "pods"),
                ),
                self.runtime,
                self.server.api_client(),
            )
            kubelet.start()
            self.kubelets[node.name] = kubelet
            plugin.start()
            if wants_compute_domains(node):
                self.cd_plugins[node.name] = CdPluginProcess(plugin, kubeconfig=self.kubeconfig, cdi_root=self.cdi_root)
                self.cd_plugins[node.name].start()
        for plugin in self.plugins.values():
            if plugin.node.driver_absent:
                plugin.wait_probed(self.config.serve_timeout_s)  # it registers once the driver is there
            else:
                plugin.wait_serving(self.config.serve_timeout_s)
        for cd_plugin in self.cd_plugins.values():
            cd_plugin.wait_serving(self.config.serve_timeout_s)
        self.scheduler = SandboxScheduler(self.server.rest(), resync_seconds=1.0, kubernetes_minor=self.kube_minor,
                                          feature_gates=self.config.feature_gates)
        self.scheduler.start()
        self.node_lifecycle = NodeLifecycleController(self.server.rest(),
                                                      grace_period_s=self.config.node_monitor_grace_period_s,
                                                      monitor_period_s=self.config.node_monitor_period_s)
        self.node_lifecycle.start()
        # kube-controller-manager's device taint eviction (NoExecute taints from slices and DeviceTaintRules).
        self.device_taint_eviction = DeviceTaintEvictionController(self.server.rest())
        self.device_taint_eviction.start()
        for node in self.config.nodes:
            if not node.driver_absent:
                self.wait_pool_published(node.name)
        if self.config.controller:
            self._start_controller()

    # --- compute domains (issue 24) ---------------------------------------------------------------------

    @property
    def compute_domains(self) -> bool:
        if self.config.compute_domains is not None:
            return self.config.compute_domains
        return any(wants_compute_domains(node) for node in self.config.nodes)

    def pod_network_octet(self) -> int:
        """The second octet of this sandbox's pod IPs (127.<octet>.<node>.<pod>)."""
        if self.config.pod_network_octet is not None:
            return self.config.pod_network_octet
        return pod_network_octet(self.config.work_dir)

    def _process_pod_settings(self) -> ProcessPodSettings | None:
        """How the kubelets run the IMEX daemon pods: the stand-in `nvidia-imex`/`nvidia-imex-ctl` first on PATH
        (dra_sandbox.imex), the cluster's kubeconfig in place of a service-account token, the plugins' CDI specs."""
        if not self.config.process_pods:
            return None
        bin_dir = self.config.work_dir / "imex-bin"
        bin_dir.mkdir(mode=0o755, parents=True, exist_ok=True)
        install_standins(bin_dir)
        kubeconfig = str(self.kubeconfig)
        return ProcessPodSettings(log_root=self.config.work_dir / "pods", bin_dirs=(bin_dir,),
                                  extra_env={"KUBECONFIG": kubeconfig, "DRA_DRIVER_KUBECONFIG": kubeconfig},
                                  cdi_dirs=(self.cdi_root,))

    def _start_controller(self) -> None:
        """The GpuSharingPolicy CRD (as the chart ships it) and the controller, logging in via the kubeconfig."""
        from dra_driver.controller.operator import ControllerSettings
        from dra_driver.controller.operator import run as run_controller
        from dra_driver.policy.crd import custom_resource_definition

        self.api.request("POST", "/apis/apiextensions.k8s.io/v1/customresourcedefinitions",
                         body=custom_resource_definition())
        webhook = None
        if self.config.webhook:
            from dra_driver.controller.webhook import WebhookSettings

            certs = self.config.work_dir / "webhook-tls"
            make_test_certs(certs)
            webhook = WebhookSettings(port=self.webhook_port, addr="127.0.0.1", certfile=str(certs / "tls.crt"),
                                     keyfile=str(certs / "tls.key"))
        options = ControllerSettings(driver_name=self.config.driver_name, kubeconfig=str(self.kubeconfig),
                                    healthz_port=-1, resync_seconds=5.0, watch_timeout_seconds=60,
                                    status_interval_seconds=1.0, webhook=webhook,
                                    compute_domains=self._compute_domains())
        kopf_running = logging.getLogger("kopf._core.reactor.running")
        if _THREAD_SIGNALS not in kopf_running.filters:
            kopf_running.addFilter(_THREAD_SIGNALS)
        ready = threading.Event()
        self.controller = threading.Thread(target=run_controller, args=(options,), name="dra-driver-controller",
                                           kwargs={"stop_flag": self._controller_stop, "ready_flag": ready},
                                           daemon=True)
        self.controller.start()
        if not ready.wait(30.0):
            raise RuntimeError("the dra-driver controller did not become ready within 30s")
        if self.config.webhook:
            wait_for(lambda: tcp_accepts(self.webhook_port), 30.0, "the controller's webhook server")
            ca = (self.config.work_dir / "webhook-tls" / "ca.crt").read_bytes()
            self.api.request("POST", "/apis/admissionregistration.k8s.io/v1/validatingwebhookconfigurations",
                             body=webhook_configuration(ca, self.config.driver_name))

    def _compute_domains(self) -> ComputeDomainSettings | None:
        """With `compute_domains`: the CRDs and classes as the chart installs them, the driver namespace, and the
        controller's ComputeDomain settings (None without)."""
        if not self.compute_domains:
            return None
        from dra_driver.controller.computedomains.objects import DaemonSetSettings
        from dra_sandbox.deviceclasses import compute_domain_crds, compute_domain_device_classes

        for crd in compute_domain_crds():
            self.api.request("POST", "/apis/apiextensions.k8s.io/v1/customresourcedefinitions", body=crd)
        for cls in compute_domain_device_classes():
            if self.api.get(f"/apis/resource.k8s.io/v1/deviceclasses/{cls['metadata']['name']}") is None:
                self.apply(cls)
        if self.api.get(f"/api/v1/namespaces/{COMPUTE_DOMAIN_NAMESPACE}") is None:
            self.api.request("POST", "/api/v1/namespaces", body={
                "apiVersion": "v1", "kind": "Namespace", "metadata": {"name": COMPUTE_DOMAIN_NAMESPACE}})
        return ComputeDomainSettings(daemon=DaemonSetSettings(namespace=COMPUTE_DOMAIN_NAMESPACE,
                                                           image="dra-driver:sandbox"))

    def _choose_runtime(self) -> ContainerRuntime:
        """Podman reads CDI specs only from /etc/cdi and /var/run/cdi: use the latter when podman runs here."""
        runtime = select_runtime(
            self.config.runtime, cdi_dirs=[self.cdi_root], work_dir=self.config.work_dir / "containers"
        )
        if runtime.name == "podman" and os.geteuid() == 0:
            SYSTEM_CDI_DIR.mkdir(parents=True, exist_ok=True)
            forced = self.config.runtime == "podman"
            lock = SystemCdiLock.acquire(SYSTEM_CDI_DIR, wait_s=SYSTEM_CDI_WAIT_S if forced else 0.0)
            if isinstance(lock, str):
                if forced:
                    raise RuntimeError(f"runtime podman: {lock} (waited {SYSTEM_CDI_WAIT_S:.0f}s); stop it first")
                log.warning("sandbox: containers are checked, not run", reason=lock)
                self.cdi_root.mkdir(parents=True, exist_ok=True)
                return CdiCheckedRuntime([self.cdi_root], reason=lock)
            self._system_cdi_lock = lock
            self.cdi_root = SYSTEM_CDI_DIR
            return runtime
        if runtime.name == "podman":
            runtime = select_runtime("cdi-check", cdi_dirs=[self.cdi_root])
        self.cdi_root.mkdir(parents=True, exist_ok=True)
        return runtime

    def stop(self) -> None:
        """Stop everything start() started, each part even when stopping an earlier one failed."""
        steps: list[Callable[[], object]] = []
        if self.controller is not None:
            self._controller_stop.set()
            controller = self.controller
            steps.append(lambda: controller.join(timeout=20))
        if self.scheduler is not None:
            steps.append(self.scheduler.stop)
        if self.node_lifecycle is not None:
            steps.append(self.node_lifecycle.stop)
        if self.device_taint_eviction is not None:
            steps.append(self.device_taint_eviction.stop)
        steps += [plugin.stop for plugin in self.plugins.values()]
        steps += [cd_plugin.stop for cd_plugin in self.cd_plugins.values()]
        steps += [kubelet.stop for kubelet in self.kubelets.values()]
        steps.append(self.server.stop)
        # The specs of claims still prepared when the cluster stops: a real node keeps them for the pods it still
        # runs, but this node goes away with its pods, and specs left in /var/run/cdi would be read by every later
        # podman run on the machine. Only this cluster's nodes' files, and before the directory's lock is let go.
        steps.append(lambda: remove_node_specs(self.cdi_root, self.config.driver_name, list(self.plugins)))
        steps.append(lambda: remove_node_specs(self.cdi_root, CD_DRIVER_NAME, list(self.cd_plugins)))
        # Their KEP-5304 device metadata specs too (each node's writer removes only those mounting its own files).
        steps += [
            partial(DeviceMetadataWriter(driver_name=self.config.driver_name, plugin_dir=p.plugin_dir,
                                         cdi_root=self.cdi_root).sweep, list)  # no claim is held any more
            for p in self.plugins.values()
        ]  # fmt: skip
        if self._webhook_port_held is not None:
            steps.append(self._webhook_port_held.close)  # after the controller (its webhook server) stopped
        if self._system_cdi_lock is not None:
            steps.append(self._system_cdi_lock.release)  # last: the plugins that wrote there have stopped
        failure: Exception | None = None
        for step in steps:
            try:
                step()
            except Exception as exc:  # keep stopping the rest; report the first failure
                log.warning("sandbox: stopping a part failed", error=str(exc))
                failure = failure or exc
        if failure is not None:
            raise failure

    def child_pids(self) -> dict[str, int]:
        """node -> pid of its running kubelet-plugin process."""
        return {
            node: plugin.process.pid
            for node, plugin in self.plugins.items()
            if plugin.process is not None and plugin.process.poll() is None
        }

    def __enter__(self) -> SandboxCluster:
        try:
            self.start()
        except BaseException:
            self.stop()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # --- API helpers -----------------------------------------------------------------------------------

    @property
    def api(self) -> KubeRest:
        assert self.rest is not None, "start() the cluster first"
        return self.rest

    def apply(self, obj: JsonObject) -> JsonObject:
        """Create the object (or replace it when it exists)."""
        path = object_path(obj)
        try:
            return self.api.request("POST", path.collection, body=obj)
        except ApiError as exc:
            if exc.status != 409:
                raise
            current = self.api.request("GET", path.item)
            body = {**obj, "metadata": {**obj["metadata"], "resourceVersion": current["metadata"]["resourceVersion"]}}
            return self.api.request("PUT", path.item, body=body)

    def delete(self, obj: JsonObject) -> None:
        with contextlib.suppress(ApiError):
            self.api.request("DELETE", object_path(obj).item)

    def get(self, obj: JsonObject) -> JsonObject | None:
        return self.api.get(object_path(obj).item)

    def items(self, path: str) -> list[JsonObject]:
        return list(self.api.request("GET", path).get("items") or [])

    def upgrade_plugin(self, node: str, *, while_both_serve: Callable[[], None] | None = None) -> PluginProcess:
        """A DaemonSet rolling update with maxSurge 1 / maxUnavailable 0, as on a kubelet >= 1.33: the new
        pod's plugin starts beside the old one (its own pod UID, so its own sockets), and once it serves, the
        old one gets SIGTERM. `while_both_serve` runs in between. Returns the new instance."""
        old = self.plugins[node]
        if old.pod_uid is None:
            raise ValueError("upgrade_plugin needs ClusterConfig(seamless_upgrade=True): fixed socket names collide")
        new = PluginProcess(old.node, self, str(uuid.uuid4()))
        new.start()
        new.wait_serving()
        if while_both_serve is not None:
            while_both_serve()
        old.stop()
        self.plugins[node] = new
        return new

    def wait_pool_published(self, node: str, timeout: float = 30.0) -> list[JsonObject]:
        def published() -> list[JsonObject] | None:
            slices = [
                s
                for s in self.items("/apis/resource.k8s.io/v1/resourceslices")
                if s["spec"].get("nodeName") == node and s["spec"]["driver"] == self.config.driver_name
            ]
            if slices and len(slices) == slices[0]["spec"]["pool"]["resourceSliceCount"]:
                return slices
            return None

        result: list[JsonObject] = wait_for(published, timeout, f"the ResourceSlices of {node}")
        return result


@dataclass(frozen=True)
class ObjectPath:
    collection: str
    item: str


_CORE_PLURALS = {"Pod": "pods", "Namespace": "namespaces", "Node": "nodes", "ConfigMap": "configmaps"}
_RESOURCE_PLURALS = {
    "ResourceClaim": "resourceclaims",
    "ResourceClaimTemplate": "resourceclaimtemplates",
    "DeviceClass": "deviceclasses",
    "ResourceSlice": "resourceslices",
    "GpuSharingPolicy": "gpusharingpolicies",
    "DeviceTaintRule": "devicetaintrules",
    "ComputeDomain": "computedomains",
    "CustomResourceDefinition": "customresourcedefinitions",
}
_CLUSTER_SCOPED = {"Namespace", "Node", "DeviceClass", "ResourceSlice", "GpuSharingPolicy", "DeviceTaintRule",
                   "CustomResourceDefinition"}


def object_path(obj: Mapping[str, Any]) -> ObjectPath:
    kind = obj["kind"]
    api_version = obj["apiVersion"]
    plural = _CORE_PLURALS.get(kind) or _RESOURCE_PLURALS.get(kind)
    if plural is None:
        raise ValueError(f"the sandbox helpers do not know kind {kind}")
    base = f"/api/{api_version}" if "/" not in api_version else f"/apis/{api_version}"
    if kind not in _CLUSTER_SCOPED:
        base += f"/namespaces/{obj['metadata'].get('namespace', 'default')}"
    collection = f"{base}/{plural}"
    return ObjectPath(collection, f"{collection}/{obj['metadata']['name']}")
