"""Device health end to end on the sandbox: an Xid posted to the fake GPU of the REAL plugin process taints
that device's ResourceSlice entry, reaches the kubelet's health stream, and shows in the pod's
`allocatedResourcesStatus`; a new claim then avoids the tainted GPU."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from dra_driver.defaults import DRIVER_NAME
from dra_driver.nvml.fake.inbox import post_event
from dra_sandbox.cluster import NodeSpec, SandboxCluster
from dra_sandbox.deviceclasses import device_classes
from tests.integration.conftest import claim_object, pod_object, sandbox
from tests.polling import wait_for

NODE = "node-l4"


@pytest.fixture(scope="module")
def cluster() -> Iterator[SandboxCluster]:
    with sandbox("dra-health-", [NodeSpec(NODE, "fake:l4x2")], device_classes=device_classes(DRIVER_NAME)) as c:
        yield c


def _device_of(cluster: SandboxCluster, claim: str) -> str:
    obj = cluster.api.get(f"/apis/resource.k8s.io/v1/namespaces/default/resourceclaims/{claim}") or {}
    results = (((obj.get("status") or {}).get("allocation") or {}).get("devices") or {}).get("results") or []
    return str(results[0]["device"]) if results else ""


def _taints(cluster: SandboxCluster) -> dict[str, Any]:
    slices = cluster.items("/apis/resource.k8s.io/v1/resourceslices")
    return {d["name"]: d.get("taints") for s in slices for d in s["spec"].get("devices", [])}


def test_xid_on_a_used_gpu(cluster: SandboxCluster) -> None:
    cluster.apply(claim_object("victim"))
    cluster.apply(pod_object("victim", "victim"))
    wait_for(
        lambda: (
            (cluster.api.get("/api/v1/namespaces/default/pods/victim") or {}).get("status", {}).get("phase")
            == "Running"
        ),
        60,
        "the pod to run",
    )
    device = _device_of(cluster, "victim")
    gpu_uuid = next(
        d["attributes"]["uuid"]["string"]
        for s in cluster.items("/apis/resource.k8s.io/v1/resourceslices")
        for d in s["spec"]["devices"]
        if d["name"] == device
    )
    post_event(cluster.plugins[NODE].state_file, gpu_uuid, xid=79)

    wait_for(lambda: _taints(cluster).get(device), 20, "the Xid taint on the slice")
    assert _taints(cluster)[device] == [{"key": f"{DRIVER_NAME}/xid", "value": "79", "effect": "NoSchedule"}]

    def pod_health() -> list[dict[str, Any]]:
        pod = cluster.api.get("/api/v1/namespaces/default/pods/victim") or {}
        return [entry for status in pod.get("status", {}).get("containerStatuses", [])
                for entry in status.get("allocatedResourcesStatus", [])]

    def unhealthy() -> bool:
        return any(r.get("health") == "Unhealthy" for e in pod_health() for r in e.get("resources", []))

    wait_for(unhealthy, 30, "the pod to report the device Unhealthy")
    # The 1.37 kubelet reads health over v1.DRAResourceHealth (the plugin advertises v1 and v1alpha1).
    registered = cluster.kubelets[NODE].plugins.get(DRIVER_NAME)
    assert registered is not None and registered.health_service == "v1.DRAResourceHealth"
    # As UpdateAllocatedResourcesStatus writes it: claim:<claim>[/<request>], the device's first CDI id as
    # resourceID (what NodePrepareResources returned), the plugin's message (ResourceHealthStatusMessage, 1.36+).
    pods = cluster.kubelets[NODE].pods
    assert pods is not None
    prepared = pods.prepared_claims()
    (cdi_id,) = {d.cdi_device_ids[0] for by_driver in prepared.values() for ds in by_driver.values() for d in ds
                 if d.device == device}
    (entry,) = pod_health()
    assert entry["name"] == "claim:gpu"  # the container's claim reference has no request
    (resource,) = entry["resources"]
    assert resource["resourceID"] == cdi_id
    assert resource["health"] == "Unhealthy" and "79" in resource.get("message", "")

    # The tainted GPU is not handed out again: the next claim gets the other one.
    cluster.apply(claim_object("next"))
    cluster.apply(pod_object("next", "next"))
    wait_for(lambda: _device_of(cluster, "next"), 30, "the next claim to be allocated")
    assert _device_of(cluster, "next") != device
