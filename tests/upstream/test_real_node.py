"""A real node (docs/upstream.md "Real node"): upstream's kubelet with containerd 2.x, runc and CNI on this machine,
joined to upstream's control plane, with our GPU kubelet plugin on fake NVML; a pod with a ResourceClaim runs
under containerd with the CDI edits containerd injected, and `kubectl logs` / `kubectl exec` reach it.

One control plane and one node serve every test of the module (starting them takes most of its time). Where the
binaries are not built, Go is missing, or this machine cannot run a node (not root, no runc or CNI plugins), every
test SKIPs with a reason starting UPSTREAM_SKIP_PREFIX, which the suite's summary repeats in a banner.
"""

from __future__ import annotations

import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml

from dra_driver.k8s.client import ApiError, JsonObject, KubeRest
from dra_sandbox.polling import wait_for
from dra_sandbox.upstream.build import CONTAINERD_VERSION, ReleaseBinaries
from dra_sandbox.upstream.controlplane import ControlPlane, ControlPlaneConfig
from dra_sandbox.upstream.images import BUSYBOX_IMAGE, PAUSE_IMAGE, image_names
from dra_sandbox.upstream.install import Installed, install_chart
from dra_sandbox.upstream.node import RealNode, RealNodeSpec
from tests.upstream.conftest import DRIVER, release_binaries

NODE = "node-real"
NAMESPACE = "real-node"
TIMEOUT = 90.0

pytestmark = pytest.mark.xdist_group("upstream")  # one control plane at a time on the 2-core machines


@dataclass
class Cluster:
    binaries: ReleaseBinaries
    plane: ControlPlane
    installed: Installed
    node: RealNode

    @property
    def api(self) -> KubeRest:
        return self.plane.admin()

    def kubectl(self, *args: str) -> subprocess.CompletedProcess[str]:
        kubectl = shutil.which("kubectl")
        assert kubectl is not None, "kubectl is a test dependency (requirements/dev)"
        return subprocess.run([kubectl, f"--kubeconfig={self.plane.admin_kubeconfig}", *args], capture_output=True,
                              text=True, timeout=60, check=False)


@pytest.fixture(scope="module")
def cluster() -> Iterator[Cluster]:
    binaries = release_binaries(real_node=True)
    # Short paths: the kubelet's plugin sockets live below the node's dir (AF_UNIX paths < 108 bytes).
    work = Path(tempfile.mkdtemp(prefix="drn-", dir="/tmp"))
    plane = ControlPlane(ControlPlaneConfig(work / "cp", binaries))
    installed: Installed | None = None
    node: RealNode | None = None
    try:
        plane.start()
        installed = install_chart(plane)
        node = RealNode(plane, binaries, RealNodeSpec(NODE), work)
        node.start()
        yield Cluster(binaries, plane, installed, node)
    finally:
        if node is not None:
            node.stop()
        if installed is not None and installed.controller is not None:
            installed.controller.stop()
        plane.stop()
        shutil.rmtree(work, ignore_errors=True)


def test_containerd_runs_the_local_images(cluster: Cluster) -> None:
    containerd = cluster.node.containerd
    assert containerd is not None
    assert {PAUSE_IMAGE, BUSYBOX_IMAGE} <= set(image_names(containerd.ctr, containerd.dirs.socket))
    out = containerd.ctr_run("run", "--rm", BUSYBOX_IMAGE, "smoke", "sh", "-c", "echo $((6 * 7)); cat /etc/passwd",
                             timeout=120)
    assert out.stdout.splitlines()[0] == "42"
    assert "root:x:0:0" in out.stdout


def test_the_kubelet_registers_its_node(cluster: Cluster) -> None:
    node = cluster.api.get(f"/api/v1/nodes/{NODE}")
    assert node is not None
    info = node["status"]["nodeInfo"]
    assert info["kubeletVersion"] == cluster.binaries.release.kubernetes
    assert info["containerRuntimeVersion"] == f"containerd://{CONTAINERD_VERSION.removeprefix('v')}"
    assert {"type": "InternalIP", "address": cluster.node.node_ip} in node["status"]["addresses"]  # its bridge's
    assert node["metadata"]["labels"]["nvidia.com/gpu.present"] == "true"


def test_the_plugin_registers_through_the_plugin_watcher_and_publishes(cluster: Cluster) -> None:
    assert cluster.node.plugin_registered()  # the kubelet called NotifyRegistrationStatus(registered=true)
    kubelet_log = cluster.node.kubelet_log.read_text(errors="replace")
    assert DRIVER in kubelet_log  # the kubelet's plugin manager logged the driver it registered
    slices = cluster.node.resource_slices()
    devices = [d["name"] for s in slices for d in s["spec"].get("devices") or []]
    assert any(name.startswith("gpu-") for name in devices), devices


def _create(api: KubeRest, path: str, obj: JsonObject) -> JsonObject:
    """POST, retried while the namespace's default ServiceAccount is not made yet (ServiceAccount admission)."""
    def created() -> JsonObject | None:
        try:
            return api.request("POST", path, body=obj)
        except ApiError as exc:
            if exc.status == 403 and "serviceaccount" in str(exc.body).lower():
                return None
            raise

    return wait_for(created, TIMEOUT, f"{path} to accept {obj['metadata']['name']}", interval=0.3)


def _cdi_env(spec_dir: Path, claim_uid: str) -> set[str]:
    """Every env entry the plugin's CDI specs give the claim's devices (spec-level and device-level)."""
    env: set[str] = set()
    for path in spec_dir.iterdir():
        if claim_uid not in path.name:
            continue
        spec = yaml.safe_load(path.read_text())
        env.update((spec.get("containerEdits") or {}).get("env") or [])
        for device in spec.get("devices") or []:
            env.update((device.get("containerEdits") or {}).get("env") or [])
    return env


def test_a_pod_with_a_claim_runs_with_the_cdi_edits_and_logs_and_exec_reach_it(cluster: Cluster) -> None:
    api = cluster.api
    api.request("POST", "/api/v1/namespaces", body={"apiVersion": "v1", "kind": "Namespace",
                                                    "metadata": {"name": NAMESPACE}})
    claim = api.request("POST", f"/apis/resource.k8s.io/v1/namespaces/{NAMESPACE}/resourceclaims", body={
        "apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim", "metadata": {"name": "gpu"},
        "spec": {"devices": {"requests": [{"name": "gpu", "exactly": {"deviceClassName": DRIVER}}]}}})
    _create(api, f"/api/v1/namespaces/{NAMESPACE}/pods", {
        "apiVersion": "v1", "kind": "Pod", "metadata": {"name": "cuda"},
        "spec": {
            "terminationGracePeriodSeconds": 1,
            "resourceClaims": [{"name": "gpu", "resourceClaimName": "gpu"}],
            "containers": [{"name": "main", "image": BUSYBOX_IMAGE, "imagePullPolicy": "IfNotPresent",
                            "command": ["sh", "-c", "echo started on $(hostname); exec sleep 3600"],
                            "resources": {"claims": [{"name": "gpu"}]}}],
        }})

    def running() -> JsonObject | None:
        pod = api.get(f"/api/v1/namespaces/{NAMESPACE}/pods/cuda") or {}
        status = pod.get("status") or {}
        if status.get("phase") in ("Failed", "Succeeded"):
            raise AssertionError(f"pod ended: {status}")
        return pod if status.get("phase") == "Running" else None

    pod = wait_for(running, TIMEOUT, "the pod with a claim to run on the real node", interval=0.5)
    assert pod["spec"]["nodeName"] == NODE
    assert pod["status"]["podIP"]  # from the node's bridge, through CNI

    allocated = api.get(f"/apis/resource.k8s.io/v1/namespaces/{NAMESPACE}/resourceclaims/gpu") or {}
    [result] = allocated["status"]["allocation"]["devices"]["results"]
    assert result["driver"] == DRIVER and result["pool"] == NODE
    expected = _cdi_env(cluster.node.cdi_dir, claim["metadata"]["uid"])
    assert any(e.startswith("NVIDIA_VISIBLE_DEVICES=") for e in expected), expected

    logs = wait_for(lambda: cluster.kubectl("logs", "-n", NAMESPACE, "cuda").stdout.strip() or None, TIMEOUT,
                    "kubectl logs to show the container's output")
    assert logs == "started on cuda"
    exec_env = cluster.kubectl("exec", "-n", NAMESPACE, "cuda", "--", "env")
    assert exec_env.returncode == 0, exec_env.stderr
    missing = expected - set(exec_env.stdout.splitlines())
    assert not missing, f"CDI edits not in the container's environment: {sorted(missing)}"

    api.request("DELETE", f"/api/v1/namespaces/{NAMESPACE}/pods/cuda")
    wait_for(lambda: api.get(f"/api/v1/namespaces/{NAMESPACE}/pods/cuda") is None, TIMEOUT, "the pod to be deleted",
             interval=0.5)
    # Unprepared by the plugin when the kubelet let the pod go: its CDI spec is gone.
    wait_for(lambda: not _cdi_env(cluster.node.cdi_dir, claim["metadata"]["uid"]), TIMEOUT,
             "the claim's CDI spec to be removed")
