"""The e2e backend for upstream Kubernetes: `dra-sandbox e2e --kubernetes upstream` (docs/upstream.md "The e2e
scenarios on upstream").

Each group of scenarios gets the cluster `dra-sandbox up --kubernetes upstream` starts: upstream's etcd,
kube-apiserver, kube-controller-manager and kube-scheduler with the chart installed, the e2e sandbox's nodes
(`E2E_NODES`, labelled with their scenario aliases, the same plugin settings) joined to it: node-h100 as the real
node (kubelet, containerd, runc, CNI) where this machine can run one, the others as the kubelet simulator's nodes.
The scenarios' objects are sent to kube-apiserver as written, but for one thing: no registry is reachable, so every
container of a Pod runs the local workload image (`localhost/dra-sandbox/busybox:latest`, pull policy
IfNotPresent; it has `sh`, `env` and `sleep`, all a scenario's pod runs).

What a container saw is read where the node keeps it: on the real node from the container's log (`env` is the
first thing every scenario pod runs), through kube-apiserver and the kubelet; on a simulated node from the record
its kubelet writes on the pod (`sandbox.dra.dev/containers`).
"""

from __future__ import annotations

import contextlib
import copy
import shutil
import subprocess
import time
from collections.abc import Callable, Collection, Iterator
from contextlib import contextmanager
from pathlib import Path

from dra_driver.k8s.client import ApiError, JsonObject, KubeRest
from dra_driver.ports import read_ports_file
from dra_sandbox.cluster import NodeSpec, object_path, plugin_healthz
from dra_sandbox.e2e.backend import BackendError, ContainerView, FakeNvmlNodes, condition_message
from dra_sandbox.e2e.kindrecipe import runtime_config
from dra_sandbox.e2e.kubectl import latest_warning, parse_env_output
from dra_sandbox.e2e.sandbox import E2E_NODES, compute_domain_cluster_config, container_view, e2e_cluster_config
from dra_sandbox.e2e.scenario import COMPUTE_DOMAIN_CLUSTER, ObjectRef
from dra_sandbox.polling import wait_for
from dra_sandbox.signals import stop_on_signals
from dra_sandbox.upstream.images import BUSYBOX_IMAGE
from dra_sandbox.upstream.node import RealNodeSpec
from dra_sandbox.upstream.session import UpstreamCluster

# A Pod is refused until kube-controller-manager made its namespace's `default` ServiceAccount (ServiceAccount
# admission: "error looking up service account <ns>/default"); a new namespace gets it within seconds.
SERVICE_ACCOUNT_WAIT_S = 30.0
REAL_NODE_ALIAS = "h100"  # the node of the e2e sandbox that runs as the real node


def local_images(obj: JsonObject) -> JsonObject:
    """A Pod whose containers run the local workload image (no registry is reachable); other kinds unchanged."""
    if obj.get("kind") != "Pod":
        return obj
    pod = copy.deepcopy(obj)
    spec = pod.get("spec") or {}
    for key in ("initContainers", "containers"):
        for container in spec.get(key) or []:
            container["image"] = BUSYBOX_IMAGE
            container["imagePullPolicy"] = "IfNotPresent"
    return pod


def _waiting_for_service_account(exc: ApiError) -> bool:
    return exc.status == 403 and "error looking up service account" in str(exc)


class UpstreamBackend(FakeNvmlNodes):
    """Drives a started UpstreamCluster as kubernetes-admin."""

    name = "upstream"
    poll_interval = 0.5

    def __init__(self, cluster: UpstreamCluster) -> None:
        self.cluster = cluster
        assert cluster.plane is not None, "enter the UpstreamCluster first"
        self.api: KubeRest = cluster.plane.admin()
        self._inside_seen: dict[tuple[str, str], tuple[tuple[str, ...], tuple[str, ...]]] = {}

    # --- objects ----------------------------------------------------------------------------------------------

    def apply(self, obj: JsonObject) -> None:
        body = local_images(obj)
        try:
            path = object_path(body)
        except ValueError as exc:
            raise BackendError(str(exc)) from exc
        deadline = time.monotonic() + SERVICE_ACCOUNT_WAIT_S
        while True:
            try:
                self._create_or_replace(body, path.collection, path.item)
                return
            except ApiError as exc:
                if _waiting_for_service_account(exc) and time.monotonic() < deadline:
                    time.sleep(0.5)
                    continue
                raise BackendError(f"applying {obj['kind']}/{obj['metadata']['name']}: {exc}") from exc

    def _create_or_replace(self, body: JsonObject, collection: str, item: str) -> None:
        try:
            self.api.request("POST", collection, body=body)
        except ApiError as exc:
            if exc.status != 409:
                raise
            current = self.api.request("GET", item)
            meta = {**body["metadata"], "resourceVersion": current["metadata"]["resourceVersion"]}
            self.api.request("PUT", item, body={**body, "metadata": meta})

    def delete(self, ref: ObjectRef) -> None:
        with contextlib.suppress(ApiError):
            self.api.request("DELETE", object_path(ref.manifest_stub()).item)

    def get(self, ref: ObjectRef) -> JsonObject | None:
        try:
            return self.api.get(object_path(ref.manifest_stub()).item)
        except ApiError as exc:
            raise BackendError(f"reading {ref}: {exc}") from exc

    def _items(self, path: str, what: str) -> list[JsonObject]:
        try:
            return list(self.api.request("GET", path).get("items") or [])
        except ApiError as exc:
            raise BackendError(f"listing {what}: {exc}") from exc

    def nodes(self) -> list[JsonObject]:
        return self._items("/api/v1/nodes", "nodes")

    def resource_slices(self) -> list[JsonObject]:
        return self._items("/apis/resource.k8s.io/v1/resourceslices", "ResourceSlices")

    def events(self, about: ObjectRef) -> list[JsonObject]:
        items = self._items(f"/api/v1/namespaces/{about.namespace or 'default'}/events", f"the Events of {about}")
        return [e for e in items if (e.get("involvedObject") or {}).get("kind") == about.kind
                and (e.get("involvedObject") or {}).get("name") == about.name]

    # --- pods -------------------------------------------------------------------------------------------------

    def _real_node(self) -> str | None:
        return self.cluster.node.spec.name if self.cluster.node is not None else None

    def container(self, pod: JsonObject, container: str) -> ContainerView | None:
        node = (pod.get("spec") or {}).get("nodeName")
        if node is None or node != self._real_node():
            return container_view(pod, container)  # the simulated node's kubelet recorded it on the pod
        meta = pod.get("metadata") or {}
        try:
            raw = self.api.request_bytes("GET", f"/api/v1/namespaces/{meta.get('namespace')}/pods/{meta.get('name')}"
                                         "/log", query={"container": container})
        except ApiError:
            return None  # not started yet (the kubelet answers 400 while the container is being created)
        env = parse_env_output(raw.decode(errors="replace"))
        if not env:
            return None
        inside = self._inside(pod, container) if (pod.get("status") or {}).get("phase") == "Running" else None
        return ContainerView(env=env, runtime="containerd", executed=True,
                             note=f"read from the container's log on real node {node}",
                             device_nodes=inside[0] if inside else None, mounts=inside[1] if inside else None)

    def _inside(self, pod: JsonObject, container: str) -> tuple[tuple[str, ...], tuple[str, ...]] | None:
        """The device nodes and mount targets a running container on the real node has, looked at from inside it
        (`kubectl exec`: busybox's find and /proc/mounts); None when that cannot be seen (kept once seen)."""
        meta = pod.get("metadata") or {}
        key = (str(meta.get("uid")), container)
        if key in self._inside_seen:
            return self._inside_seen[key]
        kubectl = shutil.which("kubectl")
        if kubectl is None:
            return None
        script = "find /dev -type c -o -type b; echo ---; cut -d' ' -f2 /proc/mounts"
        try:
            done = subprocess.run([kubectl, f"--kubeconfig={self.cluster.kubeconfig}", "exec", "-n",
                                   str(meta.get("namespace")), str(meta.get("name")), "-c", container, "--", "sh",
                                   "-c", script], capture_output=True, text=True, timeout=30, check=False)
        except subprocess.TimeoutExpired:
            return None
        if done.returncode != 0 or "---" not in done.stdout:
            return None
        devices, _, mounts = done.stdout.partition("---")
        seen = (tuple(sorted(devices.split())), tuple(mounts.split()))
        self._inside_seen[key] = seen
        return seen

    def scheduling_message(self, pod: JsonObject) -> str:
        """kube-scheduler's PodScheduled condition; for a pod on the real node, the kubelet's latest Warning Event
        first: a failed NodePrepareResources is an Event there (FailedPrepareDynamicResources), while its
        PodReadyToStartContainers condition says only "no pod sandbox exists"."""
        meta = pod.get("metadata") or {}
        real = self._real_node()
        if real is not None and (pod.get("spec") or {}).get("nodeName") == real:
            warning = latest_warning(self.events(ObjectRef("Pod", str(meta.get("name")), meta.get("namespace"))))
            if warning:
                return warning
        return condition_message(pod)

    # --- nodes' plugins and drivers ---------------------------------------------------------------------------

    def healthz(self, node: str) -> tuple[int, str] | None:
        ports: dict[str, int] | None = None
        if self.cluster.node is not None and node == self._real_node():
            ports = read_ports_file(self.cluster.node.ports_file)
        elif self.cluster.simulated is not None and node in self.cluster.simulated.plugins:
            ports = self.cluster.simulated.plugins[node].ports()
        port = (ports or {}).get("healthz")
        return plugin_healthz(port) if port is not None else None

    def nvml_spec(self, node: str) -> str:
        if self.cluster.node is not None and node == self._real_node():
            return self.cluster.node.nvml_spec
        spec = self.cluster.simulated.nvml_spec(node) if self.cluster.simulated is not None else None
        if spec is None:
            raise BackendError(f"node {node} runs no kubelet plugin in this cluster")
        return spec


def split_nodes(nodes: list[NodeSpec], real: bool) -> tuple[RealNodeSpec | None, list[NodeSpec]]:
    """(the real node, the simulated ones): the e2e sandbox's h100 node is the real one when `real`."""
    real_name = E2E_NODES[REAL_NODE_ALIAS][0]
    first = next((n for n in nodes if n.name == real_name), None) if real else None
    if first is None:
        return None, nodes
    spec = RealNodeSpec(first.name, first.nvml, first.mig_mode, dict(first.labels), dict(first.plugin_env))
    return spec, [n for n in nodes if n is not first]


@contextmanager
def upstream_backend(work_dir: Path, minor: str, write: Callable[[str], None], consumable_shares: str | None = None,
                     aliases: Collection[str] | None = None, kind: str | None = None, passthrough: bool = False,
                     driver_absent: bool = False) -> Iterator[UpstreamBackend]:
    """The upstream cluster for one group of scenarios (the e2e sandbox's nodes and settings), stopped on exit."""
    if kind == COMPUTE_DOMAIN_CLUSTER:
        config = compute_domain_cluster_config(work_dir, "cdi-check", aliases)
    else:
        config = e2e_cluster_config(work_dir, "cdi-check", consumable_shares=consumable_shares, aliases=aliases,
                                    passthrough=passthrough, driver_absent=driver_absent)
    # A real node's plugin must publish before `up` goes on, so a node that starts without its NVIDIA driver is
    # simulated; the compute-domain nodes are simulated too (their IMEX daemons run as the simulator's host processes).
    real, simulated = split_nodes(list(config.nodes), real=not driver_absent and kind is None)
    names = ", ".join([*([f"{real.name} (real)"] if real else []), *(n.name for n in simulated)])
    write(f"upstream: Kubernetes {minor}, nodes {names}; work dir {work_dir}")
    # A stop signal (StopRequested) stops the whole cluster: no kubelet, plugin or control plane stays behind.
    # The API versions the scenarios' cluster recipe serves (e2e/kind: v1beta1 and v1beta2 of resource.k8s.io,
    # which scenario files may use, e.g. the example driver's DeviceTaintRules at v1beta2).
    versions = [f"{gv}={on}" for gv, on in runtime_config(int(minor.split(".")[1])).items()]
    with stop_on_signals(), UpstreamCluster(work_dir, minor, write, real_node=real, simulated=simulated,
                                            runtime_config=versions) as cluster:
        backend = UpstreamBackend(cluster)
        wait_for(lambda: _default_service_account(backend.api), SERVICE_ACCOUNT_WAIT_S,
                 "kube-controller-manager to make the default ServiceAccount", interval=0.5)
        yield backend


def _default_service_account(api: KubeRest) -> bool:
    return api.get("/api/v1/namespaces/default/serviceaccounts/default") is not None
