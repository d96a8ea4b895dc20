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

    def pod_health() -> str:
        pod = cluster.api.get("/api/v1/namespaces/default/pods/victim") or {}
        for status in pod.get("status", {}).get("containerStatuses", []):
            for entry in status.get("allocatedResourcesStatus", []):
                for resource in entry.get("resources", []):
                    return str(resource.get("health"))
        return ""

    wait_for(lambda: pod_health() == "Unhealthy", 30, "the pod to report the device Unhealthy")

    # The tainted GPU is not handed out again: the next claim gets the other one.
    cluster.apply(claim_object("next"))
    cluster.apply(pod_object("next", "next"))
    wait_for(lambda: _device_of(cluster, "next"), 30, "the next claim to be allocated")
    assert _device_of(cluster, "next") != device
