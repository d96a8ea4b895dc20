"""Several nodes on upstream Kubernetes (docs/upstream.md "Simulated nodes"): the real node (kubelet, containerd)
and a kubelet simulator's fake-GPU node joined to the same kube-apiserver, as `dra-sandbox up --kubernetes
upstream` starts them. kube-scheduler places a MIG claim's pod on the simulated A100 node by itself (no node
selector: only that node has the 1g.5gb profile) and a whole-H100 pod on the real node; each runs with its device.
The simulated node's kubelet logs in as `system:node:<name>`, so the Node authorizer refuses it another node's
objects.

Skips with the upstream banner where the binaries are not built, Go is missing, or this machine cannot run a node.
"""

from __future__ import annotations

import json
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from dra_driver.k8s.client import ApiError, JsonObject, KubeRest, connect
from dra_sandbox.cluster import NodeSpec
from dra_sandbox.e2e.kubectl import parse_env_output
from dra_sandbox.kubelet import CONTAINERS_ANNOTATION
from dra_sandbox.polling import wait_for
from dra_sandbox.upstream.images import BUSYBOX_IMAGE
from dra_sandbox.upstream.node import RealNodeSpec
from dra_sandbox.upstream.session import UpstreamCluster
from tests.upstream.conftest import MINOR, release_binaries
from tests.upstream.test_real_node import _create

REAL = "node-real"
SIM = "node-sim"
NAMESPACE = "multi-node"
DRIVER = "gpu.dra.dev"
TIMEOUT = 90.0
RESOURCE = "/apis/resource.k8s.io/v1"

pytestmark = pytest.mark.xdist_group("upstream")  # one control plane at a time on the 2-core machines


@pytest.fixture(scope="module")
def cluster() -> Iterator[UpstreamCluster]:
    release_binaries(real_node=True)  # skips with the banner where upstream cannot run here
    work = Path(tempfile.mkdtemp(prefix="dmn-", dir="/tmp"))  # short: the nodes' unix sockets
    try:
        with UpstreamCluster(work, MINOR, say=lambda _: None, real_node=RealNodeSpec(REAL, "fake:dgx-h100"),
                             simulated=[NodeSpec(SIM, "fake:dgx-a100")]) as started:
            yield started
    finally:
        shutil.rmtree(work, ignore_errors=True)


def _api(cluster: UpstreamCluster) -> KubeRest:
    assert cluster.plane is not None
    return cluster.plane.admin()


def _claim_and_pod(api: KubeRest, name: str, class_name: str, expression: str) -> JsonObject:
    claim = api.request("POST", f"{RESOURCE}/namespaces/{NAMESPACE}/resourceclaims", body={
        "apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim", "metadata": {"name": name},
        "spec": {"devices": {"requests": [{"name": "gpu", "exactly": {
            "deviceClassName": class_name, "selectors": [{"cel": {"expression": expression}}]}}]}}})
    _create(api, f"/api/v1/namespaces/{NAMESPACE}/pods", {
        "apiVersion": "v1", "kind": "Pod", "metadata": {"name": name},
        "spec": {"terminationGracePeriodSeconds": 1,
                 "resourceClaims": [{"name": "gpu", "resourceClaimName": name}],
                 "containers": [{"name": "main", "image": BUSYBOX_IMAGE, "imagePullPolicy": "IfNotPresent",
                                 "command": ["sh", "-c", "env; exec sleep 3600"],
                                 "resources": {"claims": [{"name": "gpu"}]}}]}})
    return claim


def _running(api: KubeRest, name: str) -> JsonObject:
    def running() -> JsonObject | None:
        pod = api.get(f"/api/v1/namespaces/{NAMESPACE}/pods/{name}") or {}
        phase = (pod.get("status") or {}).get("phase")
        assert phase not in ("Failed", "Succeeded"), pod.get("status")
        return pod if phase == "Running" else None

    found: JsonObject = wait_for(running, TIMEOUT, f"pod {name} to run", interval=0.5)
    return found


def _allocated(api: KubeRest, name: str) -> tuple[str, str]:
    claim = api.get(f"{RESOURCE}/namespaces/{NAMESPACE}/resourceclaims/{name}") or {}
    [result] = claim["status"]["allocation"]["devices"]["results"]
    return result["pool"], result["device"]


def _attribute(api: KubeRest, pool: str, device: str, name: str) -> str:
    slices = api.request("GET", f"{RESOURCE}/resourceslices", query={"fieldSelector": f"spec.nodeName={pool}"})
    for found in slices.get("items") or []:
        for entry in found["spec"].get("devices") or []:
            if entry["name"] == device:
                return str(entry["attributes"][name]["string"])
    raise AssertionError(f"device {device} is in no ResourceSlice of {pool}")


def test_the_simulated_node_is_its_own_kubelet_to_the_node_authorizer(cluster: UpstreamCluster) -> None:
    assert cluster.node is not None and cluster.simulated is not None
    node = _api(cluster).get(f"/api/v1/nodes/{SIM}")
    assert node is not None and node["metadata"]["labels"]["nvidia.com/gpu.present"] == "true"
    assert any(c["type"] == "Ready" and c["status"] == "True" for c in node["status"]["conditions"])
    kubelet = connect(str(cluster.work_dir / SIM / "kubelet.kubeconfig"))
    patch = {"metadata": {"labels": {"example.com/x": "y"}}}
    with pytest.raises(ApiError) as refused:  # NodeRestriction: a kubelet changes only its own Node
        kubelet.request("PATCH", f"/api/v1/nodes/{REAL}", body=patch,
                        content_type="application/merge-patch+json")
    assert refused.value.status == 403
    assert f'node "{SIM}" is not allowed to modify node "{REAL}"' in str(refused.value)
    with pytest.raises(ApiError) as secrets:  # the Node authorizer: no Secret of a pod not bound to it
        kubelet.request("GET", "/api/v1/namespaces/kube-system/secrets")
    assert secrets.value.status == 403


def test_kube_scheduler_places_a_mig_claim_on_the_simulated_node_and_a_whole_gpu_on_the_real_one(
        cluster: UpstreamCluster) -> None:
    api = _api(cluster)
    assert cluster.node is not None and cluster.simulated is not None
    api.request("POST", "/api/v1/namespaces", body={"apiVersion": "v1", "kind": "Namespace",
                                                    "metadata": {"name": NAMESPACE}})
    mig = _claim_and_pod(api, "mig", f"mig.{DRIVER}", f"device.attributes['{DRIVER}'].profile == '1g.5gb'")
    whole = _claim_and_pod(api, "whole", DRIVER,
                           f"device.attributes['{DRIVER}'].productName.lowerAscii().matches('^.*h100.*$')")

    mig_pod = _running(api, "mig")
    assert mig_pod["spec"]["nodeName"] == SIM  # chosen by kube-scheduler: only the A100 node has 1g.5gb
    pool, device = _allocated(api, "mig")
    assert pool == SIM and "mig-1g" in device.replace(".", ""), device
    record = wait_for(lambda: ((api.get(f"/api/v1/namespaces/{NAMESPACE}/pods/mig") or {}).get("metadata") or {})
                      .get("annotations", {}).get(CONTAINERS_ANNOTATION), TIMEOUT, "the simulator's record")
    env = json.loads(record)["main"]["env"]
    # A dynamic MIG device is made at prepare, so its UUID is new; its GPU is the one the slice names.
    assert env["NVIDIA_VISIBLE_DEVICES"].startswith("MIG-"), env
    assert _attribute(api, pool, device, "parentUUID") in env.values(), env
    assert any(mig["metadata"]["uid"] in p.name for p in cluster.simulated.cdi_root.iterdir())

    whole_pod = _running(api, "whole")
    assert whole_pod["spec"]["nodeName"] == REAL
    pool, device = _allocated(api, "whole")
    assert pool == REAL and device.startswith("gpu-")

    def logged_env() -> dict[str, str] | None:
        try:
            raw = api.request_bytes("GET", f"/api/v1/namespaces/{NAMESPACE}/pods/whole/log")
        except ApiError:
            return None
        return parse_env_output(raw.decode()) or None

    seen = wait_for(logged_env, TIMEOUT, "the real node's container to print its env", interval=0.5)
    assert seen["NVIDIA_VISIBLE_DEVICES"] == _attribute(api, pool, device, "uuid")  # injected by containerd from CDI
    assert any(whole["metadata"]["uid"] in p.name for p in cluster.node.cdi_dir.iterdir())

    for name in ("mig", "whole"):
        api.request("DELETE", f"/api/v1/namespaces/{NAMESPACE}/pods/{name}")
    sim_cdi, real_cdi = cluster.simulated.cdi_root, cluster.node.cdi_dir
    wait_for(lambda: not any(mig["metadata"]["uid"] in p.name for p in sim_cdi.iterdir()),
             TIMEOUT, "the simulated node's plugin to remove the MIG claim's CDI spec", interval=0.5)
    wait_for(lambda: not any(whole["metadata"]["uid"] in p.name for p in real_cdi.iterdir()),
             TIMEOUT, "the real node's plugin to remove the whole GPU claim's CDI spec", interval=0.5)
