"""KEP-5517 node allocatable overhead (`--node-allocatable-overhead`, gate DRANodeAllocatableResources, alpha and off
in 1.37) on upstream's kube-apiserver, kube-controller-manager and kube-scheduler 1.37, with the real plugin process.

The plugin runs with `--node-allocatable-overhead memory=40Gi` on a node of two GPUs and 64Gi of allocatable memory.
Gate on: its probe finds the field kept, every GPU device carries `nodeAllocatableResources.memory.overhead.perPod:
40Gi` as stored, and kube-scheduler charges it: the first pod with a GPU claim (1Gi requested) is bound, the second
(a GPU is still free) does not fit (1Gi + 40Gi twice is more than 64Gi). Gate off: the probe finds it dropped, the
slices carry nothing of it, and both pods are bound. Skips with the upstream banner where the binaries are not built.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from dra_driver.k8s.client import ApiError, JsonObject, KubeRest
from dra_driver.k8s.serverfeatures import PROBE_QUERY, SLICES_PATH, SliceFeature, probe_slice
from dra_sandbox.deviceclasses import device_classes
from dra_sandbox.polling import wait_for
from dra_sandbox.upstream.controlplane import ControlPlane, ControlPlaneConfig
from dra_sandbox.upstream.install import install_chart
from tests.upstream.conftest import DRIVER, MINOR, release_binaries, start_plugin
from tests.upstream.test_controlplane import TIMEOUT
from tests.upstream.test_derived_attributes import NODE, _ready_node

pytestmark = pytest.mark.xdist_group("upstream")
RESOURCE = "/apis/resource.k8s.io/v1"
GATE = "DRANodeAllocatableResources"
OVERHEAD = {"memory": {"overhead": {"perPod": "40Gi"}}}


@pytest.fixture(scope="module", params=["gate-on", "gate-off"])
def plane(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ControlPlane]:
    if MINOR != "1.37":
        pytest.skip(f"the node allocatable field checked here is 1.37's (DRA_UPSTREAM_K8S={MINOR})")
    config = ControlPlaneConfig(tmp_path_factory.mktemp(f"alloc-{request.param}"), release_binaries(),
                                extra_feature_gates={GATE: request.param == "gate-on"})
    with ControlPlane(config) as started:
        install_chart(started)  # the plugin's ServiceAccount, RBAC and admission policy
        yield started


def _claim(name: str) -> JsonObject:
    return {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim", "metadata": {"name": name},
            "spec": {"devices": {"requests": [{"name": "gpu", "exactly": {"deviceClassName": DRIVER}}]}}}


def _pod(name: str) -> JsonObject:
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name},
            "spec": {"containers": [{"name": "c", "image": "registry.k8s.io/pause:3.10",
                                     "resources": {"requests": {"memory": "1Gi"}, "claims": [{"name": "gpu"}]}}],
                     "resourceClaims": [{"name": "gpu", "resourceClaimName": name}]}}


def _decided(rest: KubeRest, name: str) -> JsonObject:
    def look() -> JsonObject | None:
        pod = rest.request("GET", f"/api/v1/namespaces/default/pods/{name}")
        scheduled = [c for c in (pod.get("status") or {}).get("conditions") or [] if c["type"] == "PodScheduled"]
        if (pod.get("spec") or {}).get("nodeName") or (scheduled and scheduled[0].get("reason") == "Unschedulable"):
            return pod
        return None

    return wait_for(look, TIMEOUT, f"kube-scheduler to bind pod {name} or find it unschedulable", interval=0.2)


def _await_declared(rest: KubeRest) -> None:
    """Until the admission sees the node's declared feature: NodeDeclaredFeatureValidator reads Nodes from an
    informer, so right after the PATCH it may still refuse the plugin's probe (403) and the plugin, which probes once
    at start (a gate change needs the plugin restarted, as in a cluster where the kubelet declares its features
    before the plugin pod starts), would send nothing. The same dry-run create the probe makes, as the admin."""
    def accepted() -> bool:
        try:
            rest.request("POST", SLICES_PATH, query=PROBE_QUERY,
                         body=probe_slice(SliceFeature.NODE_ALLOCATABLE, driver=DRIVER, node=NODE))
        except ApiError as exc:
            if exc.status != 403:
                raise
            return False
        return True

    wait_for(accepted, TIMEOUT, f"kube-apiserver's admission to see node {NODE} declare {GATE}", interval=0.2)


def test_the_overhead_is_published_only_where_kept_and_kube_scheduler_charges_it(
        plane: ControlPlane, tmp_path: Path) -> None:
    on = bool(plane.config.extra_feature_gates[GATE])
    rest = plane.admin()
    wait_for(lambda: rest.get("/api/v1/namespaces/default/serviceaccounts/default"), TIMEOUT,
             "the ServiceAccount default/default")
    _ready_node(rest)  # 64Gi of allocatable memory
    if on:
        # What the kubelet with the gate declares (NodeDeclaredFeatures): kube-apiserver's NodeDeclaredFeatureValidator
        # refuses (403) a slice with nodeAllocatableResources for a node that does not declare it.
        rest.request("PATCH", f"/api/v1/nodes/{NODE}/status", body={"status": {"declaredFeatures": [GATE]}},
                     content_type="application/merge-patch+json")
        _await_declared(rest)
    for cls in device_classes(DRIVER):
        if rest.get(f"{RESOURCE}/deviceclasses/{cls['metadata']['name']}") is None:
            rest.request("POST", f"{RESOURCE}/deviceclasses", body=cls)
    plugin = start_plugin(plane, NODE, tmp_path, "l4x2", {"DRA_DRIVER_NODE_ALLOCATABLE_OVERHEAD": "memory=40Gi",
                                                          "DRA_DRIVER_MIG_MODE": "none"})
    try:
        def published() -> list[JsonObject]:
            assert plugin.poll() is None, (tmp_path / "plugin.log").read_text()[-3000:]
            items = rest.request("GET", f"{RESOURCE}/resourceslices", query={"fieldSelector": f"spec.nodeName={NODE}"})
            found = [s for s in items["items"] if s["spec"]["driver"] == DRIVER]
            complete = bool(found) and len(found) == found[0]["spec"]["pool"]["resourceSliceCount"]
            return found if complete else []

        slices = wait_for(published, TIMEOUT, "the plugin's ResourceSlices", interval=0.2)
        devices = {d["name"]: d for s in slices for d in s["spec"].get("devices", [])}
        assert {n: d.get("nodeAllocatableResources") for n, d in devices.items()} == {
            n: (OVERHEAD if on else None) for n in devices}
        for name in ("first", "second"):
            rest.request("POST", f"{RESOURCE}/namespaces/default/resourceclaims", body=_claim(name))
            rest.request("POST", "/api/v1/namespaces/default/pods", body=_pod(name))
        first, second = _decided(rest, "first"), _decided(rest, "second")
        assert first["spec"].get("nodeName") == NODE, first.get("status")
        assert bool(second["spec"].get("nodeName")) is not on, second.get("status")
        if on:
            message = next(c["message"] for c in second["status"]["conditions"] if c["type"] == "PodScheduled")
            assert "memory" in message, message
    finally:
        plugin.terminate()
        plugin.wait(30)
