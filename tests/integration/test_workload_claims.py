"""KEP-5729 workload claims in the sandbox, as kube-apiserver, kube-scheduler and the kubelet 1.37 handle them
(tests/upstream/test_workload_claims.py checks the same on upstream with a real node).

With GenericWorkload and DRAWorkloadResourceClaims on, a PodGroup that lists a claim in `spec.resourceClaims` gets it
reserved for itself (not for each pod): both of its pods run on the node, the plugin prepares the claim once,
`dra-driver explain` names the PodGroup as the consumer, and the reservation (and so the prepared claim) stays until
the PodGroup is gone. With the gates off the API server serves no PodGroups and drops a pod's `schedulingGroup`,
and two pods naming one claim share it as before, each reserved by itself.
"""

from __future__ import annotations

from collections.abc import Iterator
from functools import partial
from typing import Any

import pytest

from dra_driver.defaults import DRIVER_NAME
from dra_driver.k8s.client import ApiError
from dra_sandbox.cluster import NodeSpec, SandboxCluster
from dra_sandbox.deviceclasses import device_classes
from dra_sandbox.polling import wait_for
from tests.integration.conftest import NODE, claim_object, explained, pod_object, sandbox, spec_files

GATES = {"GenericWorkload": True, "DRAWorkloadResourceClaims": True}
PODGROUPS = "/apis/scheduling.k8s.io/v1beta1/namespaces/default/podgroups"
CLAIMS = "/apis/resource.k8s.io/v1/namespaces/default/resourceclaims"
PODS = "/api/v1/namespaces/default/pods"
TRAINERS = ("trainer-0", "trainer-1")


@pytest.fixture(scope="module", params=["gates-on", "gates-off"])
def cluster(request: pytest.FixtureRequest) -> Iterator[SandboxCluster]:
    gates = GATES if request.param == "gates-on" else {}
    with sandbox("dra-wl-", [NodeSpec(NODE, "fake:l4x2")], feature_gates=gates,
                 device_classes=device_classes(DRIVER_NAME)) as c:
        yield c


def _on(cluster: SandboxCluster) -> bool:
    return bool(cluster.config.feature_gates)


def _member(name: str) -> dict[str, Any]:
    pod = pod_object(name, "shared")
    pod["spec"]["schedulingGroup"] = {"podGroupName": "trainers"}
    return pod


def _phase_is(cluster: SandboxCluster, name: str, phase: str) -> bool:
    pod = cluster.api.get(f"{PODS}/{name}") or {}
    return bool((pod.get("status") or {}).get("phase") == phase)


def _prepared(cluster: SandboxCluster, uid: str) -> int:
    log = cluster.plugins[NODE].log_file.read_text(errors="replace")
    return sum(1 for line in log.splitlines() if "claim prepared" in line and uid in line)


def test_a_podgroups_pods_share_its_claim(cluster: SandboxCluster) -> None:
    api = cluster.api
    claim = api.request("POST", CLAIMS, body=claim_object("shared"))
    uid = claim["metadata"]["uid"]
    group_body: dict[str, Any] = {"apiVersion": "scheduling.k8s.io/v1beta1", "kind": "PodGroup", "metadata": {"name": "trainers"},
                                  "spec": {"schedulingPolicy": {"basic": {}},
                                           "resourceClaims": [{"name": "gpu", "resourceClaimName": "shared"}]}}
    if not _on(cluster):
        with pytest.raises(ApiError) as refused:
            api.request("POST", PODGROUPS, body=group_body)
        assert refused.value.status == 404  # GenericWorkload off: the kind is not served
    else:
        group = api.request("POST", PODGROUPS, body=group_body)
        assert group["spec"]["resourceClaims"] == group_body["spec"]["resourceClaims"]
    for name in TRAINERS:
        created = api.request("POST", PODS, body=_member(name))
        assert ("schedulingGroup" in created["spec"]) is _on(cluster)  # dropped without GenericWorkload
    for name in TRAINERS:
        wait_for(partial(_phase_is, cluster, name, "Running"), 60, f"pod {name} to run")

    stored = api.request("GET", f"{CLAIMS}/shared")
    reserved = stored["status"]["reservedFor"]
    if _on(cluster):
        assert reserved == [{"apiGroup": "scheduling.k8s.io", "resource": "podgroups", "name": "trainers",
                             "uid": group["metadata"]["uid"]}]
        assert "reserved for podgroups/trainers" in explained(cluster.kubeconfig, "shared")
    else:
        assert sorted(r["name"] for r in reserved) == list(TRAINERS)
    assert spec_files(cluster, uid), "the claim's CDI spec"
    assert _prepared(cluster, uid) == 1  # one claim, prepared once, however many pods use it

    for name in TRAINERS:
        api.request("DELETE", f"{PODS}/{name}")
    wait_for(lambda: all(api.get(f"{PODS}/{n}") is None for n in TRAINERS), 60, "the pods to be gone")
    if _on(cluster):
        # The PodGroup still holds the claim: nothing is released until it goes.
        assert api.request("GET", f"{CLAIMS}/shared")["status"]["reservedFor"][0]["name"] == "trainers"
        api.request("DELETE", f"{PODGROUPS}/trainers")
    wait_for(lambda: not (api.request("GET", f"{CLAIMS}/shared").get("status") or {}).get("reservedFor"), 60,
             "the claim's reservation to be released")
    wait_for(lambda: not spec_files(cluster, uid), 60, "the claim to be unprepared")


def test_a_bad_podgroup_is_refused(cluster: SandboxCluster) -> None:
    if not _on(cluster):
        pytest.skip("PodGroups are served only with GenericWorkload")
    body = {"apiVersion": "scheduling.k8s.io/v1beta1", "kind": "PodGroup", "metadata": {"name": "bad"},
            "spec": {"schedulingPolicy": {"basic": {}, "gang": {"minCount": 2}},
                     "resourceClaims": [{"name": "gpu", "resourceClaimName": "a", "resourceClaimTemplateName": "t"}]}}
    with pytest.raises(ApiError) as refused:
        cluster.api.request("POST", PODGROUPS, body=body)
    assert refused.value.status == 422
    fields = {c["field"] for c in refused.value.body["details"]["causes"]}
    assert fields == {"spec.schedulingPolicy", "spec.resourceClaims[0]"}, refused.value.body


def test_explain_still_names_a_pod_consumer_by_name(cluster: SandboxCluster) -> None:
    if _on(cluster):
        pytest.skip("the pod-only case is the gates-off cluster's")
    cluster.api.request("POST", CLAIMS, body=claim_object("solo"))
    cluster.api.request("POST", PODS, body=pod_object("solo", "solo"))
    wait_for(partial(_phase_is, cluster, "solo", "Running"), 60, "pod solo to run")
    assert "reserved for solo " in explained(cluster.kubeconfig, "solo")
    assert DRIVER_NAME in explained(cluster.kubeconfig, "solo")
