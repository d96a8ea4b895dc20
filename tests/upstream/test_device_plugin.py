"""The device-plugin API beside DRA under upstream's kubelet (docs/device-plugin.md): our plugin, started with
`--device-plugin on`, registers `nvidia.com/gpu` with the real kubelet's device manager, the Node's allocatable shows
it, a pod asking for `nvidia.com/gpu: 1` and a pod with a ResourceClaim on the same node get different GPUs, a GPU
held by one world is not offered by the other, and the GPUs return when the pods end.

Skips like the other upstream tests where the binaries are not built or this machine cannot run a node.
"""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from dra_driver.k8s.client import ApiError, JsonObject, KubeRest
from dra_sandbox.children import terminate
from dra_sandbox.polling import wait_for
from dra_sandbox.upstream.controlplane import ControlPlane, ControlPlaneConfig
from dra_sandbox.upstream.images import BUSYBOX_IMAGE
from dra_sandbox.upstream.install import Installed, install_chart
from dra_sandbox.upstream.node import RealNode, RealNodeSpec
from tests.upstream.conftest import DRIVER, release_binaries

NODE = "node-dp"
NAMESPACE = "device-plugin"
RESOURCE = "nvidia.com/gpu"
GPUS = 8  # dgx-h100
TIMEOUT = 120.0

pytestmark = pytest.mark.xdist_group("upstream")


@dataclass
class Cluster:
    plane: ControlPlane
    node: RealNode

    @property
    def api(self) -> KubeRest:
        return self.plane.admin()


@pytest.fixture(scope="module")
def cluster() -> Iterator[Cluster]:
    binaries = release_binaries(real_node=True)
    work = Path(tempfile.mkdtemp(prefix="ddp-", dir="/tmp"))
    plane = ControlPlane(ControlPlaneConfig(work / "cp", binaries))
    installed: Installed | None = None
    node: RealNode | None = None
    try:
        plane.start()
        installed = install_chart(plane)
        # The kubelet's device manager listens on /var/lib/kubelet/device-plugins/kubelet.sock whatever its
        # --root-dir (deviceplugin/v1beta1 KubeletSocket), the plugin's default dir; RealNode points the plugin at
        # the PodResources socket under the root dir.
        node = RealNode(plane, binaries, RealNodeSpec(NODE, mig_mode="static",
                                                      plugin_env={"DRA_DRIVER_DEVICE_PLUGIN": "on"}), work)
        node.start()
        yield Cluster(plane, node)
    finally:
        if node is not None:
            node.stop()
        if installed is not None and installed.controller is not None:
            installed.controller.stop()
        plane.stop()
        shutil.rmtree(work, ignore_errors=True)


def _allocatable(api: KubeRest) -> str | None:
    node = api.get(f"/api/v1/nodes/{NODE}") or {}
    return ((node.get("status") or {}).get("allocatable") or {}).get(RESOURCE)


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


def _pod(name: str, *, gpus: int = 0, claim: str | None = None) -> JsonObject:
    container: JsonObject = {"name": "main", "image": BUSYBOX_IMAGE, "imagePullPolicy": "IfNotPresent",
                             "command": ["sh", "-c", "env; exec sleep 3600"], "resources": {}}
    spec: JsonObject = {"terminationGracePeriodSeconds": 1, "containers": [container]}
    if gpus:
        container["resources"] = {"limits": {RESOURCE: str(gpus)}}
    if claim is not None:
        spec["resourceClaims"] = [{"name": "gpus", "resourceClaimName": claim}]
        container["resources"] = {"claims": [{"name": "gpus"}]}
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name}, "spec": spec}


def _running(api: KubeRest, name: str) -> JsonObject | None:
    pod = api.get(f"/api/v1/namespaces/{NAMESPACE}/pods/{name}") or {}
    status = pod.get("status") or {}
    if status.get("phase") in ("Failed", "Succeeded"):
        raise AssertionError(f"pod {name} ended: {status}")
    return pod if status.get("phase") == "Running" else None


def _slice_gpus(cluster: Cluster) -> set[str]:
    """The GPU UUIDs of the whole-GPU devices in the node's ResourceSlices."""
    found = set()
    for s in cluster.node.resource_slices():
        for d in s["spec"].get("devices") or []:
            attrs = d.get("attributes") or {}
            if (attrs.get("type") or {}).get("string") == "gpu":
                found.add(attrs["uuid"]["string"])
    return found


def _env_gpu(cluster: Cluster, name: str) -> set[str]:
    """The GPUs a container was given: NVIDIA_VISIBLE_DEVICES in its environment (injected through CDI)."""
    def logged() -> str | None:
        try:
            text = cluster.api.request_bytes("GET", f"/api/v1/namespaces/{NAMESPACE}/pods/{name}/log").decode()
        except ApiError:
            return None
        return text if "NVIDIA_VISIBLE_DEVICES=" in text else None

    text = wait_for(logged, TIMEOUT, f"pod {name}'s env in its log", interval=0.5)
    [line] = [x for x in text.splitlines() if x.startswith("NVIDIA_VISIBLE_DEVICES=")]
    return set(line.split("=", 1)[1].split(","))


def _delete(api: KubeRest, name: str) -> None:
    api.request("DELETE", f"/api/v1/namespaces/{NAMESPACE}/pods/{name}")
    wait_for(lambda: api.get(f"/api/v1/namespaces/{NAMESPACE}/pods/{name}") is None, TIMEOUT, f"pod {name} deleted",
             interval=0.5)


def test_the_kubelet_registers_the_device_plugin_and_the_node_shows_the_gpus(cluster: Cluster) -> None:
    allocatable = wait_for(lambda: _allocatable(cluster.api) == str(GPUS), TIMEOUT,
                           f"the Node's allocatable {RESOURCE} to be {GPUS}", interval=0.5)
    assert allocatable
    assert "device plugin registered with the kubelet" in cluster.node.plugin_log.read_text(errors="replace")
    assert len(_slice_gpus(cluster)) == GPUS  # nothing allocated yet: DRA offers every GPU too


def test_a_device_plugin_pod_and_a_dra_pod_get_different_gpus_and_they_return(cluster: Cluster) -> None:
    api = cluster.api
    api.request("POST", "/api/v1/namespaces", body={"apiVersion": "v1", "kind": "Namespace",
                                                    "metadata": {"name": NAMESPACE}})
    wait_for(lambda: _allocatable(api) == str(GPUS), TIMEOUT, f"{RESOURCE} allocatable", interval=0.5)
    _create(api, f"/api/v1/namespaces/{NAMESPACE}/pods", _pod("classic", gpus=1))
    wait_for(lambda: _running(api, "classic"), TIMEOUT, "the nvidia.com/gpu pod to run", interval=0.5)
    [classic_gpu] = _env_gpu(cluster, "classic")
    # The device plugin's GPU leaves the ResourceSlices: the scheduler cannot give it to a claim.
    wait_for(lambda: classic_gpu not in _slice_gpus(cluster), TIMEOUT, "the allocated GPU to leave the slices",
             interval=0.5)
    assert len(_slice_gpus(cluster)) == GPUS - 1

    # A claim for every other GPU: only possible if it gets exactly the GPUs the device plugin did not give.
    api.request("POST", f"/apis/resource.k8s.io/v1/namespaces/{NAMESPACE}/resourceclaims", body={
        "apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim", "metadata": {"name": "rest"},
        "spec": {"devices": {"requests": [{"name": "gpus", "exactly": {
            "deviceClassName": DRIVER, "allocationMode": "ExactCount", "count": GPUS - 1}}]}}})
    _create(api, f"/api/v1/namespaces/{NAMESPACE}/pods", _pod("dra", claim="rest"))
    wait_for(lambda: _running(api, "dra"), TIMEOUT, "the DRA pod to run", interval=0.5)
    dra_gpus = _env_gpu(cluster, "dra")
    assert len(dra_gpus) == GPUS - 1 and classic_gpu not in dra_gpus
    # DRA's prepared GPUs are Unhealthy to the kubelet: only the classic pod's GPU is allocatable (and it is used).
    wait_for(lambda: _allocatable(api) == "1", TIMEOUT, f"allocatable {RESOURCE} to drop to 1", interval=0.5)
    _create(api, f"/api/v1/namespaces/{NAMESPACE}/pods", _pod("waits", gpus=1))

    def pending_unschedulable() -> bool:
        pod = api.get(f"/api/v1/namespaces/{NAMESPACE}/pods/waits") or {}
        conditions = (pod.get("status") or {}).get("conditions") or []
        return any(c.get("type") == "PodScheduled" and c.get("reason") == "Unschedulable" for c in conditions)

    wait_for(pending_unschedulable, TIMEOUT, "a second nvidia.com/gpu pod to be unschedulable", interval=0.5)

    # The DRA pod ends: its GPUs return to the device plugin, and the waiting pod runs on one of them.
    _delete(api, "dra")
    wait_for(lambda: _allocatable(api) == str(GPUS), TIMEOUT, f"allocatable {RESOURCE} back to {GPUS}", interval=0.5)
    wait_for(lambda: _running(api, "waits"), TIMEOUT, "the waiting pod to run", interval=0.5)
    [waits_gpu] = _env_gpu(cluster, "waits")
    assert waits_gpu != classic_gpu and waits_gpu in dra_gpus

    # The device-plugin pods end: the kubelet's PodResources stops listing their GPUs and DRA gets them back.
    _delete(api, "classic")
    _delete(api, "waits")
    wait_for(lambda: len(_slice_gpus(cluster)) == GPUS, TIMEOUT, "every GPU back in the ResourceSlices", interval=1.0)


def test_the_plugin_registers_again_when_the_kubelet_restarts(cluster: Cluster) -> None:
    """The kubelet's device manager removes the plugin's socket and makes kubelet.sock anew at start; the plugin
    serves a new socket and registers again, and the Node's allocatable is back (docs/device-plugin.md
    "Registration and kubelet restarts")."""
    line = "device plugin registered with the kubelet"
    before = cluster.node.plugin_log.read_text(errors="replace").count(line)
    terminate(cluster.node.kubelet, 30)
    cluster.node._start_kubelet()  # the same kubelet again (RealNode.start's own step), waits for the Node Ready
    wait_for(lambda: cluster.node.plugin_log.read_text(errors="replace").count(line) > before, TIMEOUT,
             "the plugin to register with the restarted kubelet", interval=0.5)
    wait_for(lambda: _allocatable(cluster.api) == str(GPUS), TIMEOUT, f"allocatable {RESOURCE} {GPUS} again",
             interval=0.5)
