"""KEP-6080 derived attributes on upstream's kube-apiserver and kube-scheduler 1.37 (DRADerivedAttributes, alpha and
off by default), the control plane started with the gate on and with it off, against the driver's allocator
(`dra-driver explain`) and the sandbox's scheduler stand-in on the very objects kube-scheduler saw.

Gate on: a claim whose request derives `example.com/socket` from the GPUs' PCIe root and asks for two GPUs that
match on it is kept as sent and allocated by kube-scheduler to the two GPUs of one socket (the first two GPUs in
slice order sit on different sockets); explain and the stand-in pick the same two. Gate off: the API server drops the
derived attribute, so the constraint compares an attribute no GPU has: kube-scheduler leaves the pod pending, and
explain and the stand-in say the claim fits nowhere. Skips with the upstream banner where the binaries are not built.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from datetime import UTC, datetime
from typing import Any

import pytest

from dra_driver.cel import DraCelEnvironment
from dra_driver.commands.explain import claim_gates, explain_claim
from dra_driver.k8s.client import ApiError, JsonObject, KubeRest
from dra_sandbox.kubelet.nodestatus import ready_node
from dra_sandbox.polling import wait_for
from dra_sandbox.scheduler import plan_pod
from dra_sandbox.upstream.controlplane import ControlPlane, ControlPlaneConfig
from tests.sandbox.test_derived_attributes import CLASS, SLICE, SOCKET_ATTRIBUTE, _claim
from tests.upstream.conftest import MINOR, release_binaries
from tests.upstream.test_controlplane import TIMEOUT

pytestmark = pytest.mark.xdist_group("upstream")
RESOURCE = "/apis/resource.k8s.io/v1"
GATE = "DRADerivedAttributes"
NODE = "n1"  # the name SLICE publishes for
NOT_READY = frozenset({"node.kubernetes.io/not-ready", "node.kubernetes.io/unreachable"})


@pytest.fixture(scope="module", params=["gate-on", "gate-off"])
def plane(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ControlPlane]:
    if MINOR != "1.37":
        pytest.skip(f"derived attributes are in 1.37 (DRA_UPSTREAM_K8S={MINOR})")
    config = ControlPlaneConfig(tmp_path_factory.mktemp(f"derived-{request.param}"), release_binaries(),
                                extra_feature_gates={GATE: request.param == "gate-on"})
    with ControlPlane(config) as started:
        yield started


def _ready_node(rest: KubeRest) -> JsonObject:
    """A Node as a Ready kubelet leaves it, its Lease fresh and without the not-ready taint (no kubelet runs)."""
    node = ready_node(NODE)
    status = node.pop("status")
    rest.request("POST", "/api/v1/nodes", body=node)
    rest.request("PATCH", f"/api/v1/nodes/{NODE}/status", body={"status": status},
                 content_type="application/merge-patch+json")
    now = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
    rest.request("POST", "/apis/coordination.k8s.io/v1/namespaces/kube-node-lease/leases", body={
        "apiVersion": "coordination.k8s.io/v1", "kind": "Lease", "metadata": {"name": NODE},
        "spec": {"holderIdentity": NODE, "leaseDurationSeconds": 40, "renewTime": now}})

    def untainted() -> JsonObject | None:
        obj = rest.request("GET", f"/api/v1/nodes/{NODE}")
        taints = (obj.get("spec") or {}).get("taints") or []
        if not any(t.get("key") in NOT_READY for t in taints):
            return obj
        with contextlib.suppress(ApiError):  # a conflict with the node lifecycle controller: look again
            rest.request("PATCH", f"/api/v1/nodes/{NODE}", body=[
                {"op": "test", "path": "/metadata/resourceVersion", "value": obj["metadata"]["resourceVersion"]},
                {"op": "replace", "path": "/spec/taints", "value": [t for t in taints if t.get("key") not in NOT_READY]}],
                content_type="application/json-patch+json")
        return None

    return wait_for(untainted, TIMEOUT, f"node {NODE} without the not-ready taint", interval=0.2)


def _pod() -> JsonObject:
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p", "namespace": "default"},
            "spec": {"containers": [{"name": "c", "image": "registry.k8s.io/pause:3.10",
                                     "resources": {"claims": [{"name": "gpus"}]}}],
                     "resourceClaims": [{"name": "gpus", "resourceClaimName": "c"}]}}


def _devices(claim: JsonObject) -> list[str] | None:
    allocation = (claim.get("status") or {}).get("allocation")
    return None if allocation is None else [r["device"] for r in allocation["devices"]["results"]]


def test_kube_scheduler_explain_and_the_stand_in_agree_on_a_derived_match(plane: ControlPlane) -> None:
    on = bool(plane.config.extra_feature_gates[GATE])
    rest = plane.admin()
    wait_for(lambda: rest.get("/api/v1/namespaces/default/serviceaccounts/default"), TIMEOUT,
             "the ServiceAccount default/default")  # the ServiceAccount admission plugin needs it for pods
    node = _ready_node(rest)
    rest.request("POST", f"{RESOURCE}/deviceclasses", body=CLASS)
    rest.request("POST", f"{RESOURCE}/resourceslices", body=SLICE)
    sent = _claim("c", SOCKET_ATTRIBUTE)
    stored = rest.request("POST", f"{RESOURCE}/namespaces/default/resourceclaims", body=sent,
                          query={"fieldValidation": "Strict"})
    kept = stored["spec"]["devices"]["requests"][0]["exactly"].get("derivedAttributes")
    assert kept == (SOCKET_ATTRIBUTE if on else None)
    rest.request("POST", "/api/v1/namespaces/default/pods", body=_pod())

    def decided() -> tuple[JsonObject, JsonObject] | None:
        pod = rest.request("GET", "/api/v1/namespaces/default/pods/p")
        claim = rest.request("GET", f"{RESOURCE}/namespaces/default/resourceclaims/c")
        conditions = {c["type"]: c for c in (pod.get("status") or {}).get("conditions") or []}
        scheduled = conditions.get("PodScheduled")
        if (pod.get("spec") or {}).get("nodeName") or (scheduled and scheduled.get("reason") == "Unschedulable"):
            return pod, claim
        return None

    pod, claim = wait_for(decided, TIMEOUT, "kube-scheduler to bind pod p or find it unschedulable", interval=0.2)
    upstream = _devices(claim)
    assert upstream == (["gpu-0", "gpu-2"] if on else None), (pod.get("status"), claim.get("status"))
    assert (pod["spec"].get("nodeName") == NODE) is on

    # The driver's allocator, on the claim as the API server stored it, with no allocation yet.
    fresh = {**claim, "status": {}}
    classes = rest.request("GET", f"{RESOURCE}/deviceclasses")["items"]
    slices = rest.request("GET", f"{RESOURCE}/resourceslices")["items"]
    fits, text = explain_claim(fresh, nodes=[node], classes=classes, slices=slices, claims=[], namespace_labels={},
                               feature_gates=claim_gates(fresh, None))
    assert fits == ([NODE] if on else []), text
    plan: Any = plan_pod(pod, [fresh], nodes=[node], classes=classes, slices=slices, allocated_claims=[],
                         namespace_labels={}, cel=DraCelEnvironment(kubernetes_minor=37), kube_version=(1, 37),
                         feature_gates={GATE: on})
    assert (_devices({"status": {"allocation": plan.allocations["c"]}}) if plan.node else None) == upstream

