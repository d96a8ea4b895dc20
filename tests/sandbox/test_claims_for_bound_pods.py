"""The resource-claim controller (played by the scheduler stand-in) for a pod whose `spec.nodeName` was set by hand:
claims from its templates are made all the same and an allocated claim is reserved for it; the kubelet waits for
the allocation nothing makes (upstream `pkg/controller/resourceclaim/controller.go` syncPod)."""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from typing import Any

import pytest
from kubernetes import client as k8s

from dra_sandbox.apiserver import ApiServer
from dra_sandbox.scheduler import SandboxScheduler, claim_generate_name
from tests.polling import wait_for
from tests.sandbox.test_kubelet_fakeplugin import short_tmpdir
from tests.sandbox.test_kubelet_pods import DRIVER, Cluster

RESOURCE = "/apis/resource.k8s.io/v1"


@pytest.fixture
def node_cluster(api: k8s.ApiClient) -> Iterator[Cluster]:
    base = short_tmpdir()
    c = Cluster(api, base)
    c.kubelet.start()
    yield c
    c.kubelet.stop()
    c.plugin.stop()
    shutil.rmtree(base, ignore_errors=True)


def _template(server: ApiServer, name: str) -> None:
    server.rest().request("POST", f"{RESOURCE}/namespaces/default/resourceclaimtemplates", body={
        "apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaimTemplate",
        "metadata": {"name": name},
        "spec": {"metadata": {"labels": {"team": "a"}, "annotations": {"note": "from-template"}},
                 "spec": {"devices": {"requests": [{"name": "gpu", "exactly": {"deviceClassName": "gpu.test"}}]}}},
    })


def _pod(c: Cluster, name: str, template: str) -> None:
    c.core.create_namespaced_pod(c.ns, k8s.V1Pod.model_validate({
        "apiVersion": "v1", "kind": "Pod", "metadata": {"name": name},
        "spec": {"nodeName": c.node, "resourceClaims": [{"name": "gpu", "resourceClaimTemplateName": template}],
                 "containers": [{"name": "main", "image": "probe", "resources": {"claims": [{"name": "gpu"}]}}]},
    }))


def _claim_of(server: ApiServer, pod: str) -> dict[str, Any]:
    status = server.rest().request("GET", f"/api/v1/namespaces/default/pods/{pod}").get("status") or {}
    name = {s["name"]: s.get("resourceClaimName") for s in status.get("resourceClaimStatuses") or []}["gpu"]
    return dict(server.rest().request("GET", f"{RESOURCE}/namespaces/default/resourceclaims/{name}"))


def test_a_hand_placed_pod_gets_its_claim_and_waits_for_an_allocation(server: ApiServer,
                                                                     node_cluster: Cluster) -> None:
    c = node_cluster
    template, pod = c.name("tpl"), c.name("pod")
    _template(server, template)
    _pod(c, pod, template)
    scheduler = SandboxScheduler(server.rest())
    scheduler.reconcile()
    claim = _claim_of(server, pod)
    meta = claim["metadata"]
    uid = c.read_pod(pod).metadata.uid
    assert meta["name"].startswith(f"{pod}-gpu-")
    assert [(o["kind"], o["uid"], o["controller"]) for o in meta["ownerReferences"]] == [("Pod", uid, True)]
    assert meta["annotations"] == {"note": "from-template", "resource.kubernetes.io/pod-claim-name": "gpu"}
    assert meta["labels"] == {"team": "a"}
    assert "allocation" not in (claim.get("status") or {})

    scheduler.reconcile()  # nothing allocates it: no second claim, the pod stays where it is
    claims = server.rest().request("GET", f"{RESOURCE}/namespaces/default/resourceclaims")["items"]
    assert [x["metadata"]["name"] for x in claims if x["metadata"]["name"].startswith(f"{pod}-")] == [meta["name"]]
    wait_for(lambda: (cond := c.condition(pod, "PodReadyToStartContainers")) is not None
             and cond.reason == "WaitingForResourceClaims", what="the kubelet waiting for the claim")
    assert c.phase(pod) == "Pending" and "not allocated" in c.condition(pod, "PodReadyToStartContainers").message
    assert c.read_pod(pod).status.container_statuses[0].state.waiting.reason == "ContainerCreating"

    # Allocated by someone else (no scheduler looks at a bound pod): the controller reserves it for the pod,
    # and the kubelet runs it.
    c.plugin.start()
    allocation = {"devices": {"results": [{"request": "gpu", "driver": DRIVER, "pool": "node-1", "device": "gpu-0"}]}}
    server.rest().request("PATCH", f"{RESOURCE}/namespaces/default/resourceclaims/{meta['name']}/status",
                          body={"status": {"allocation": allocation}}, content_type="application/merge-patch+json")
    scheduler.reconcile()
    reserved = _claim_of(server, pod)["status"]["reservedFor"]
    assert reserved == [{"resource": "pods", "name": pod, "uid": uid}]
    wait_for(lambda: c.phase(pod) == "Running", what="the pod running once its claim is allocated and reserved")


def test_a_missing_template_is_a_warning_event_on_the_bound_pod(server: ApiServer, node_cluster: Cluster) -> None:
    c = node_cluster
    pod = c.name("pod")
    _pod(c, pod, "no-such-template")
    SandboxScheduler(server.rest()).reconcile()
    events = [e for e in c.core.list_namespaced_event(c.ns).items if e.involved_object.name == pod]
    assert [(e.type, e.reason, e.message) for e in events if e.reason == "FailedResourceClaimCreation"] == [(
        "Warning", "FailedResourceClaimCreation",
        'PodResourceClaim gpu: resource claim template "no-such-template": resourceclaimtemplate.resource.k8s.io '
        '"no-such-template" not found')]
    conditions = c.read_pod(pod).status.conditions or []
    assert not [x for x in conditions if x.type == "PodScheduled" and x.status == "False"]


def test_generate_name_is_cut_in_proportion_as_the_controller_does() -> None:
    assert claim_generate_name("pod", "gpu") == "pod-gpu-"
    long_pod, long_claim = "p" * 50, "c" * 20
    name = claim_generate_name(long_pod, long_claim)
    assert name == "p" * (50 * 57 // 72) + "-" + "c" * (20 * 57 // 72)
