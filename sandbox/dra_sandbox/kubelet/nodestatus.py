"""The kubelet's Node: registration, node status and the node Lease, as a 1.34+ kubelet writes them.

Facts (kubernetes/kubernetes):
- `pkg/kubelet/kubelet_node_status.go` (`initialNode`, `registerWithAPIServer`): the kubelet creates its Node with
  the labels `kubernetes.io/hostname`, `kubernetes.io/os`, `kubernetes.io/arch` and the deprecated
  `beta.kubernetes.io/os|arch`, plus its `--node-labels`, and the annotation
  `volumes.kubernetes.io/controller-managed-attach-detach: "true"`; an existing Node gets those labels merged.
- `pkg/kubelet/nodestatus/setters.go`: capacity (cpu, memory, ephemeral-storage, pods 110, hugepages-*) and
  allocatable = capacity - reservations - the hard eviction thresholds (defaults `memory.available<100Mi`,
  `nodefs.available<10%`); conditions MemoryPressure/DiskPressure/PIDPressure False (reasons
  KubeletHasSufficientMemory, KubeletHasNoDiskPressure, KubeletHasSufficientPID) and Ready True
  (KubeletReady, "kubelet is posting ready status"), in that order; `nodeInfo` (kubeletVersion, the deprecated
  kubeProxyVersion left empty since 1.31 (KEP-4004), osImage, kernelVersion, containerRuntimeVersion
  `<runtime>://<version>`, architecture, operatingSystem, machineID, systemUUID, bootID); addresses
  InternalIP and Hostname; `daemonEndpoints.kubeletEndpoint.Port` 10250.
- `pkg/kubelet/nodelease` and `component-helpers/apimachinery/lease`: the Lease `kube-node-lease/<node>`, owned
  by the Node, `leaseDurationSeconds` 40, renewed every 10 s (a quarter of it). Node status is posted every
  `nodeStatusReportFrequency` (5 min) when nothing changed, each post refreshing `lastHeartbeatTime`.

The sandbox runs several nodes on one machine: cpu, memory and disk are this machine's, and the IDs are derived
per node so that nodes differ as real ones do.
"""

from __future__ import annotations

import logging
import os
import platform
import shutil
import threading
import time
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, cast

from kubernetes import client as k8s
from kubernetes.client.exceptions import ApiException

from dra_driver.k8s.quantity import Quantity, QuantityFormat
from dra_sandbox.loopthread import LoopThread
from dra_sandbox.rest import MERGE_PATCH

log = logging.getLogger(__name__)

LEASE_NAMESPACE = "kube-node-lease"
LEASE_DURATION_S = 40
KUBELET_PORT = 10250
MAX_PODS = 110
EVICTION_MEMORY_BYTES = 100 * 1024 * 1024  # memory.available<100Mi
EVICTION_NODEFS_FRACTION = 0.1  # nodefs.available<10%
CONTROLLER_MANAGED_ATTACH_DETACH = "volumes.kubernetes.io/controller-managed-attach-detach"
_ARCHITECTURES = {"x86_64": "amd64", "amd64": "amd64", "aarch64": "arm64", "arm64": "arm64", "ppc64le": "ppc64le",
                  "s390x": "s390x"}


def _binary_si(value: int) -> str:
    return str(Quantity.from_int(value, QuantityFormat.BINARY_SI))


@dataclass(frozen=True)
class NodeResources:
    """What the node's machine has. `from_host()` reads this machine."""

    cpu: int
    memory_bytes: int
    ephemeral_storage_bytes: int
    pods: int = MAX_PODS
    hugepages: Mapping[str, int] = field(default_factory=lambda: {"hugepages-1Gi": 0, "hugepages-2Mi": 0})

    @staticmethod
    def from_host(storage_path: Path = Path("/")) -> NodeResources:
        memory = 0
        try:
            for line in Path("/proc/meminfo").read_text().splitlines():
                if line.startswith("MemTotal:"):
                    memory = int(line.split()[1]) * 1024
                    break
        except OSError:
            pass
        try:
            disk = shutil.disk_usage(storage_path).total
        except OSError:
            disk = 0
        return NodeResources(cpu=os.cpu_count() or 1, memory_bytes=memory, ephemeral_storage_bytes=disk)

    def capacity(self) -> dict[str, str]:
        out = {
            "cpu": str(self.cpu),
            "ephemeral-storage": _binary_si(self.ephemeral_storage_bytes),
            "memory": _binary_si(self.memory_bytes),
            "pods": str(self.pods),
        }
        out.update({name: str(value) for name, value in self.hugepages.items()})
        return dict(sorted(out.items()))

    def allocatable(self) -> dict[str, str]:
        out = self.capacity()
        out["memory"] = _binary_si(max(self.memory_bytes - EVICTION_MEMORY_BYTES, 0))
        reserved = int(self.ephemeral_storage_bytes * EVICTION_NODEFS_FRACTION)
        out["ephemeral-storage"] = str(max(self.ephemeral_storage_bytes - reserved, 0))
        return out


@dataclass(frozen=True)
class NodeFacts:
    """The node's identity and software, as `status.nodeInfo` and `status.addresses` report them."""

    machine_id: str
    system_uuid: str
    boot_id: str
    kernel_version: str
    os_image: str
    architecture: str
    container_runtime_version: str
    internal_ip: str = "127.0.0.1"
    operating_system: str = "linux"

    @staticmethod
    def from_host(node_name: str, runtime_name: str) -> NodeFacts:
        host_boot = _read_first_line(Path("/proc/sys/kernel/random/boot_id")) or "no-boot-id"
        machine = uuid.uuid5(uuid.NAMESPACE_DNS, f"{node_name}.machine.sandbox.dra.dev")
        return NodeFacts(
            machine_id=machine.hex,
            system_uuid=str(uuid.uuid5(machine, "system")),
            boot_id=str(uuid.uuid5(machine, host_boot)),  # new after a reboot of this machine, as a boot ID is
            kernel_version=platform.release(),
            os_image=_os_image(),
            architecture=_ARCHITECTURES.get(platform.machine(), platform.machine()),
            container_runtime_version=f"{runtime_name}://{_sandbox_version()}",
        )


def _read_first_line(path: Path) -> str:
    try:
        return path.read_text().strip().splitlines()[0]
    except (OSError, IndexError):
        return ""


def _os_image() -> str:
    try:
        for line in Path("/etc/os-release").read_text().splitlines():
            if line.startswith("PRETTY_NAME="):
                return line.split("=", 1)[1].strip().strip('"')
    except OSError:
        pass
    return "Unknown"  # what the kubelet reports when cadvisor cannot tell


def _sandbox_version() -> str:
    from importlib import metadata

    try:
        return metadata.version("dra-driver")
    except metadata.PackageNotFoundError:
        return "0.0.0"


def timestamp(seconds: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(seconds))


def micro_timestamp(seconds: float) -> str:
    micros = int((seconds % 1) * 1_000_000)
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(seconds)) + f".{micros:06d}Z"


def node_labels(node_name: str, facts: NodeFacts, extra: Mapping[str, str]) -> dict[str, str]:
    return {
        "beta.kubernetes.io/arch": facts.architecture,
        "beta.kubernetes.io/os": facts.operating_system,
        "kubernetes.io/arch": facts.architecture,
        "kubernetes.io/hostname": node_name,
        "kubernetes.io/os": facts.operating_system,
        **extra,
    }


_CONDITIONS = (
    ("MemoryPressure", "False", "KubeletHasSufficientMemory", "kubelet has sufficient memory available"),
    ("DiskPressure", "False", "KubeletHasNoDiskPressure", "kubelet has no disk pressure"),
    ("PIDPressure", "False", "KubeletHasSufficientPID", "kubelet has sufficient PID available"),
    ("Ready", "True", "KubeletReady", "kubelet is posting ready status"),
)


def node_status(
    node_name: str,
    facts: NodeFacts,
    resources: NodeResources,
    kubelet_version: str,
    *,
    heartbeat: float,
    since: float,
) -> dict[str, Any]:
    """`status` of the Node as the kubelet posts it. Pure."""
    return {
        "capacity": resources.capacity(),
        "allocatable": resources.allocatable(),
        "conditions": [
            {"type": kind, "status": status, "reason": reason, "message": message,
             "lastHeartbeatTime": timestamp(heartbeat), "lastTransitionTime": timestamp(since)}
            for kind, status, reason, message in _CONDITIONS
        ],
        "addresses": [{"type": "InternalIP", "address": facts.internal_ip},
                      {"type": "Hostname", "address": node_name}],
        "daemonEndpoints": {"kubeletEndpoint": {"Port": KUBELET_PORT}},
        "nodeInfo": {
            "machineID": facts.machine_id,
            "systemUUID": facts.system_uuid,
            "bootID": facts.boot_id,
            "kernelVersion": facts.kernel_version,
            "osImage": facts.os_image,
            "containerRuntimeVersion": facts.container_runtime_version,
            "kubeletVersion": kubelet_version,
            "kubeProxyVersion": "",
            "operatingSystem": facts.operating_system,
            "architecture": facts.architecture,
        },
    }


def node_object(node_name: str, labels: Mapping[str, str], status: Mapping[str, Any]) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {"name": node_name, "labels": dict(labels),
                     "annotations": {CONTROLLER_MANAGED_ATTACH_DETACH: "true"}},
        "spec": {},
        "status": dict(status),
    }


@dataclass(frozen=True)
class NodeStatusConfig:
    labels: Mapping[str, str] = field(default_factory=dict)  # --node-labels
    resources: NodeResources | None = None  # None: this machine's
    facts: NodeFacts | None = None  # None: derived from this machine and the node name
    kubelet_version: str | None = None  # None: the gitVersion the API server reports
    lease_renew_s: float = LEASE_DURATION_S / 4
    status_report_s: float = 300.0  # nodeStatusReportFrequency
    request_timeout_s: float = 10.0


class NodeStatusReporter:
    """Registers the Node, then keeps its Lease and status current until stopped."""

    def __init__(
        self,
        node_name: str,
        api_client: k8s.ApiClient,
        runtime_name: str,
        config: NodeStatusConfig,
        wall: Callable[[], float] = time.time,
        wait: Callable[[threading.Event, float], bool] | None = None,
    ) -> None:
        self.node_name = node_name
        self._core = k8s.CoreV1Api(api_client)
        self._coordination = k8s.CoordinationV1Api(api_client)
        self._version_api = k8s.VersionApi(api_client)
        self._config = config
        self._runtime_name = runtime_name
        self._wall = wall
        self._wait = wait or (lambda stop, seconds: stop.wait(seconds))
        self._worker = LoopThread(self._loop, f"node-status-{node_name}")
        self._since = wall()
        self._uid = ""
        self._facts = config.facts or NodeFacts.from_host(node_name, runtime_name)
        self._resources = config.resources or NodeResources.from_host()
        self._version = config.kubelet_version or ""
        # Device-plugin resources (devicemanager.py): name -> (capacity, allocatable), added to the status.
        self.extended: Callable[[], Mapping[str, tuple[int, int]]] = dict

    def start(self) -> None:
        """Register synchronously (pods are only scheduled to a node with a status), then renew in a thread."""
        self.register()
        self.renew_lease()
        self._worker.start()

    def stop(self) -> None:
        self._worker.stop()

    def _timeout(self) -> float:
        return self._config.request_timeout_s

    def _kubelet_version(self) -> str:
        if not self._version:
            info = self._version_api.get_code(_request_timeout=self._timeout())
            self._version = str(info.git_version)
        return self._version

    def status(self) -> dict[str, Any]:
        status = node_status(self.node_name, self._facts, self._resources, self._kubelet_version(),
                             heartbeat=self._wall(), since=self._since)
        for name, (capacity, allocatable) in self.extended().items():
            status["capacity"][name], status["allocatable"][name] = str(capacity), str(allocatable)
        return status

    def register(self) -> None:
        labels = node_labels(self.node_name, self._facts, self._config.labels)
        status = self.status()
        try:
            created = self._core.create_node(cast(Any, node_object(self.node_name, labels, status)),
                                             _request_timeout=self._timeout())
            self._uid = str(created.metadata.uid if created.metadata else "")
            log.info("node %s registered", self.node_name)
            return
        except ApiException as exc:
            if exc.status != 409:
                raise
        # Registered before (another kubelet run, or created by hand): merge our labels, then post the status.
        patched = self._core.patch_node(
            self.node_name,
            {"metadata": {"labels": labels, "annotations": {CONTROLLER_MANAGED_ATTACH_DETACH: "true"}}},
            _content_type=MERGE_PATCH, _request_timeout=self._timeout())
        self._uid = str(patched.metadata.uid if patched.metadata else "")
        self.post_status(status)

    def post_status(self, status: Mapping[str, Any] | None = None) -> None:
        self._core.patch_node_status(self.node_name, {"status": dict(status or self.status())},
                                     _content_type=MERGE_PATCH, _request_timeout=self._timeout())

    def lease(self) -> dict[str, Any]:
        return {
            "apiVersion": "coordination.k8s.io/v1",
            "kind": "Lease",
            "metadata": {
                "name": self.node_name,
                "namespace": LEASE_NAMESPACE,
                "ownerReferences": [{"apiVersion": "v1", "kind": "Node", "name": self.node_name, "uid": self._uid}],
            },
            "spec": {"holderIdentity": self.node_name, "leaseDurationSeconds": LEASE_DURATION_S,
                     "renewTime": micro_timestamp(self._wall())},
        }

    def renew_lease(self) -> None:
        body = self.lease()
        try:
            self._coordination.patch_namespaced_lease(self.node_name, LEASE_NAMESPACE, {"spec": body["spec"]},
                                                      _content_type=MERGE_PATCH, _request_timeout=self._timeout())
        except ApiException as exc:
            if exc.status != 404:
                raise
            self._coordination.create_namespaced_lease(LEASE_NAMESPACE, cast(Any, body),
                                                       _request_timeout=self._timeout())

    def _loop(self) -> None:
        last_report = self._wall()
        while not self._wait(self._worker.stopping, self._config.lease_renew_s):
            try:
                self.renew_lease()
                if self._wall() - last_report >= self._config.status_report_s:
                    self.post_status()
                    last_report = self._wall()
            except Exception as exc:  # the API server may be gone for a while; the kubelet keeps trying
                log.warning("node %s: cannot renew lease or status: %s", self.node_name, exc)


# A machine of the size the tests and benchmarks assume when they create Nodes without running a kubelet.
EXAMPLE_RESOURCES = NodeResources(cpu=16, memory_bytes=64 * 1024**3, ephemeral_storage_bytes=200 * 1024**3)


def ready_node(
    node_name: str,
    labels: Mapping[str, str] | None = None,
    resources: NodeResources = EXAMPLE_RESOURCES,
    kubelet_version: str = "v1.37.0",
    now: float | None = None,
) -> dict[str, Any]:
    """A Node as a running kubelet has registered it (for tests and benchmarks that run no kubelet)."""
    facts = NodeFacts.from_host(node_name, "cdi-check")
    stamp = time.time() if now is None else now
    status = node_status(node_name, facts, resources, kubelet_version, heartbeat=stamp, since=stamp)
    return node_object(node_name, node_labels(node_name, facts, labels or {}), status)
