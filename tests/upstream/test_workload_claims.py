"""KEP-5729 workload claims (`DRAWorkloadResourceClaims`, beta and off in 1.37, with `GenericWorkload`) on upstream's
control plane and a real node (docs/upstream.md "Real node"): a PodGroup's two pods share one ResourceClaim that the
PodGroup lists in `spec.resourceClaims`; kube-scheduler reserves it for the PodGroup (not each pod), the real kubelet
1.37 has the driver's plugin prepare it once, both pods run on the node with the claim's CDI devices, and it is
unprepared when the PodGroup's pods are gone and the reservation is released.

The gates are on for kube-apiserver, kube-controller-manager, kube-scheduler and the kubelet, with
`scheduling.k8s.io/v1beta1=true` in `--runtime-config` (a beta API off by default). Skips with the upstream banner
where the binaries are not built or this machine cannot run a real node.
"""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from dra_driver.k8s.client import ApiError, JsonObject, KubeRest
from dra_sandbox.polling import wait_for
from dra_sandbox.upstream.controlplane import ControlPlane, ControlPlaneConfig
from dra_sandbox.upstream.images import BUSYBOX_IMAGE
from dra_sandbox.upstream.install import Installed, install_chart
from dra_sandbox.upstream.node import RealNode, RealNodeSpec
from tests.sandbox.test_derived_attributes import CLASS, SLICE
from tests.upstream.conftest import DRIVER, MINOR, release_binaries
from tests.upstream.test_derived_attributes import _ready_node

pytestmark = pytest.mark.xdist_group("upstream")
NODE = "node-wl"
NAMESPACE = "workload"
TIMEOUT = 120.0
GATES = {"GenericWorkload": True, "DRAWorkloadResourceClaims": True}
CLAIMS = f"/apis/resource.k8s.io/v1/namespaces/{NAMESPACE}/resourceclaims"
PODGROUPS = f"/apis/scheduling.k8s.io/v1beta1/namespaces/{NAMESPACE}/podgroups"
PODS = f"/api/v1/namespaces/{NAMESPACE}/pods"


@dataclass
class Cluster:
    plane: ControlPlane
    node: RealNode

    @property
    def api(self) -> KubeRest:
        return self.plane.admin()


@pytest.fixture(scope="module")
def cluster() -> Iterator[Cluster]:
    if MINOR != "1.37":
        pytest.skip(f"the workload claim checks are written for 1.37 (DRA_UPSTREAM_K8S={MINOR})")
    binaries = release_binaries(real_node=True)
    work = Path(tempfile.mkdtemp(prefix="drw-", dir="/tmp"))  # short: the kubelet's sockets live below it
    plane = ControlPlane(ControlPlaneConfig(work / "cp", binaries, extra_feature_gates=GATES,
                                            extra_runtime_config=("scheduling.k8s.io/v1beta1=true",)))
    installed: Installed | None = None
    node: RealNode | None = None
    try:
        plane.start()
        installed = install_chart(plane)
        node = RealNode(plane, binaries, RealNodeSpec(NODE), work)
        node.start()
        yield Cluster(plane, node)
    finally:
        if node is not None:
            node.stop()
        if installed is not None and installed.controller is not None:
            installed.controller.stop()
        plane.stop()
        shutil.rmtree(work, ignore_errors=True)


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


def _pod(name: str) -> JsonObject:
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name},
            "spec": {"terminationGracePeriodSeconds": 1,
                     "schedulingGroup": {"podGroupName": "trainers"},
                     "resourceClaims": [{"name": "gpu", "resourceClaimName": "shared"}],
                     "containers": [{"name": "main", "image": BUSYBOX_IMAGE, "imagePullPolicy": "IfNotPresent",
                                     "command": ["sh", "-c", "env; exec sleep 3600"],
                                     "resources": {"claims": [{"name": "gpu"}]}}]}}


def _prepared_lines(node: RealNode, uid: str) -> list[str]:
    return [line for line in node.plugin_log.read_text(errors="replace").splitlines()
            if "claim prepared" in line and uid in line]


def test_a_podgroups_pods_share_its_claim_prepared_once(cluster: Cluster) -> None:
    api = cluster.api
    api.request("POST", "/api/v1/namespaces", body={"apiVersion": "v1", "kind": "Namespace",
                                                    "metadata": {"name": NAMESPACE}})
    claim = _create(api, CLAIMS, {
        "apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim", "metadata": {"name": "shared"},
        "spec": {"devices": {"requests": [{"name": "gpu", "exactly": {"deviceClassName": DRIVER}}]}}})
    group = _create(api, PODGROUPS, {
        "apiVersion": "scheduling.k8s.io/v1beta1", "kind": "PodGroup", "metadata": {"name": "trainers"},
        "spec": {"schedulingPolicy": {"basic": {}},
                 "resourceClaims": [{"name": "gpu", "resourceClaimName": "shared"}]}})
    assert group["spec"]["resourceClaims"] == [{"name": "gpu", "resourceClaimName": "shared"}]  # kept: gate on
    for name in ("trainer-0", "trainer-1"):
        created = _create(api, PODS, _pod(name))
        assert created["spec"]["schedulingGroup"] == {"podGroupName": "trainers"}

    def running() -> list[JsonObject] | None:
        pods = [api.get(f"{PODS}/{n}") or {} for n in ("trainer-0", "trainer-1")]
        phases = [(p.get("status") or {}).get("phase") for p in pods]
        if any(phase in ("Failed", "Succeeded") for phase in phases):
            raise AssertionError(f"a pod ended: {[p.get('status') for p in pods]}")
        return pods if phases == ["Running", "Running"] else None

    pods = wait_for(running, TIMEOUT, "both pods of the PodGroup to run on the real node", interval=0.5)
    assert {p["spec"]["nodeName"] for p in pods} == {NODE}
    allocated = api.request("GET", f"{CLAIMS}/shared")
    assert allocated["status"]["reservedFor"] == [{"apiGroup": "scheduling.k8s.io", "resource": "podgroups",
                                                   "name": "trainers", "uid": group["metadata"]["uid"]}]
    [result] = allocated["status"]["allocation"]["devices"]["results"]
    uid = claim["metadata"]["uid"]
    assert _prepared_lines(cluster.node, uid) and len(_prepared_lines(cluster.node, uid)) == 1, \
        cluster.node.plugin_log.read_text(errors="replace")[-3000:]
    specs = [p for p in cluster.node.cdi_dir.iterdir() if uid in p.name]
    assert specs, f"no CDI spec for claim {uid} in {cluster.node.cdi_dir}"
    for pod in pods:  # both containers got the one device of the claim
        name = pod["metadata"]["name"]

        def output(name: str = name) -> str | None:
            return api.request_bytes("GET", f"{PODS}/{name}/log").decode() or None

        log = wait_for(output, TIMEOUT, f"the output of {name}")
        assert "NVIDIA_VISIBLE_DEVICES=" in log, (result, log)

    # The reservation outlives single pods (it is the PodGroup's); with the PodGroup gone, kube-controller-manager
    # releases it and the plugin unprepares the claim.
    for name in ("trainer-0", "trainer-1"):
        api.request("DELETE", f"{PODS}/{name}")
    wait_for(lambda: all(api.get(f"{PODS}/{n}") is None for n in ("trainer-0", "trainer-1")), TIMEOUT,
             "the pods to be deleted", interval=0.5)
    api.request("DELETE", f"{PODGROUPS}/trainers")
    wait_for(lambda: not (api.request("GET", f"{CLAIMS}/shared").get("status") or {}).get("reservedFor"), TIMEOUT,
             "the claim's reservation to be released", interval=0.5)
    wait_for(lambda: not [p for p in cluster.node.cdi_dir.iterdir() if uid in p.name], TIMEOUT,
             "the claim's CDI spec to be removed", interval=0.5)


def test_with_the_gates_off_pods_naming_one_claim_share_it_each_reserved(
        tmp_path_factory: pytest.TempPathFactory) -> None:
    """Nothing breaks without the gates: kube-apiserver serves no PodGroups and drops a pod's `schedulingGroup`,
    and kube-scheduler reserves the shared claim for each pod (control plane only: no node runs the pods)."""
    if MINOR != "1.37":
        pytest.skip(f"the workload claim checks are written for 1.37 (DRA_UPSTREAM_K8S={MINOR})")
    config = ControlPlaneConfig(tmp_path_factory.mktemp("wl-off"), release_binaries(),
                                extra_feature_gates=dict.fromkeys(GATES, False))
    with ControlPlane(config) as plane:
        api = plane.admin()
        _ready_node(api)  # node "n1", Ready, without the not-ready taint
        api.request("POST", "/api/v1/namespaces", body={"apiVersion": "v1", "kind": "Namespace",
                                                        "metadata": {"name": NAMESPACE}})
        api.request("POST", "/apis/resource.k8s.io/v1/deviceclasses", body=CLASS)
        api.request("POST", "/apis/resource.k8s.io/v1/resourceslices", body=SLICE)
        assert api.get("/apis/scheduling.k8s.io/v1beta1") is None  # GenericWorkload off: not served
        _create(api, CLAIMS, {
            "apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim", "metadata": {"name": "shared"},
            "spec": {"devices": {"requests": [{"name": "gpu", "exactly": {"deviceClassName": "gpu.dra.dev"}}]}}})
        for name in ("trainer-0", "trainer-1"):
            created = _create(api, PODS, _pod(name))
            assert "schedulingGroup" not in created["spec"]

        def reserved() -> list[JsonObject] | None:
            found = (api.request("GET", f"{CLAIMS}/shared").get("status") or {}).get("reservedFor") or []
            return found if len(found) == 2 else None

        found = wait_for(reserved, TIMEOUT, "kube-scheduler to reserve the claim for both pods", interval=0.3)
        assert sorted((r["resource"], r["name"]) for r in found) == [("pods", "trainer-0"), ("pods", "trainer-1")]
