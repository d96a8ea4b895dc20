"""`dra-sandbox up --device-plugin` as a test (docs/device-plugin.md, docs/sandbox.md "The device manager"): the
kubelet simulator's device manager takes our plugin's registration, the Node shows `nvidia.com/gpu`, a pod asking for
`nvidia.com/gpu: 1` and a pod with a ResourceClaim on the same node get different GPUs, and the GPUs return when
the pods end. The same story as tests/upstream/test_device_plugin.py, on the sandbox."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest

from dra_driver.commands.status import status_text
from dra_driver.defaults import DRIVER_NAME
from dra_driver.deviceplugin.published import held_in_slices
from dra_sandbox.cluster import NodeSpec, SandboxCluster
from dra_sandbox.deviceclasses import device_classes
from tests.integration.conftest import sandbox
from tests.polling import wait_for

NODE = "node-dp"
RESOURCE = "nvidia.com/gpu"
GPUS = 8
PODS = "/api/v1/namespaces/default/pods"


@pytest.fixture(scope="module")
def cluster() -> Iterator[SandboxCluster]:
    with sandbox("dra-dp-", [NodeSpec(NODE, "fake:dgx-h100", mig_mode="static")],
                 device_classes=device_classes(DRIVER_NAME), device_plugin=True) as c:  # fmt: skip
        yield c


def _allocatable(cluster: SandboxCluster) -> str | None:
    node = cluster.api.get(f"/api/v1/nodes/{NODE}") or {}
    return ((node.get("status") or {}).get("allocatable") or {}).get(RESOURCE)


def _pod(name: str, *, gpus: int = 0, claim: str | None = None) -> dict[str, Any]:
    container: dict[str, Any] = {"name": "main", "image": "busybox", "command": ["sh", "-c", "env; sleep 3600"]}
    spec: dict[str, Any] = {"containers": [container], "terminationGracePeriodSeconds": 1}
    if gpus:
        container["resources"] = {"limits": {RESOURCE: str(gpus)}}
    if claim is not None:
        spec["resourceClaims"] = [{"name": "gpus", "resourceClaimName": claim}]
        container["resources"] = {"claims": [{"name": "gpus"}]}
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": "default"}, "spec": spec}


def _gpus_seen(cluster: SandboxCluster, name: str) -> set[str]:
    """The GPUs the container got, from NVIDIA_VISIBLE_DEVICES as the simulator's CDI check resolved it."""
    def seen() -> set[str] | None:
        pod = cluster.api.get(f"{PODS}/{name}") or {}
        record = ((pod.get("metadata") or {}).get("annotations") or {}).get("sandbox.dra.dev/containers")
        if (pod.get("status") or {}).get("phase") != "Running" or not record:
            return None
        env = json.loads(record)["main"].get("env") or {}
        return set(env["NVIDIA_VISIBLE_DEVICES"].split(",")) if "NVIDIA_VISIBLE_DEVICES" in env else None

    return wait_for(seen, 60, f"pod {name} to run with its GPUs", interval=0.2)


def _slice_gpus(cluster: SandboxCluster) -> set[str]:
    listed = cluster.api.get("/apis/resource.k8s.io/v1/resourceslices") or {}
    return {d["attributes"]["uuid"]["string"] for s in listed.get("items") or [] for d in s["spec"].get("devices") or []
            if d["attributes"]["type"]["string"] == "gpu"}  # fmt: skip


def _held(cluster: SandboxCluster) -> dict[str, tuple[str, ...]]:
    listed = cluster.api.get("/apis/resource.k8s.io/v1/resourceslices") or {}
    return {h.uuid: h.pods for h in held_in_slices(listed.get("items") or [], DRIVER_NAME).gpus.get(NODE, ())}


def _gone(cluster: SandboxCluster, name: str) -> None:
    cluster.api.request("DELETE", f"{PODS}/{name}")
    wait_for(lambda: cluster.api.get(f"{PODS}/{name}") is None, 60, f"pod {name} deleted", interval=0.2)


def test_a_device_plugin_pod_and_a_dra_pod_get_different_gpus_and_they_return(cluster: SandboxCluster) -> None:
    wait_for(lambda: _allocatable(cluster) == str(GPUS), 60, f"allocatable {RESOURCE} {GPUS}", interval=0.2)
    assert len(_slice_gpus(cluster)) == GPUS
    cluster.apply(_pod("classic", gpus=1))
    [classic] = _gpus_seen(cluster, "classic")
    wait_for(lambda: classic not in _slice_gpus(cluster), 30, "the classic pod's GPU to leave the slices")
    # From the API alone: the slices' annotation names the pod the kubelet's PodResources lists it for, and status
    # shows it (docs/device-plugin.md "What the API shows").
    wait_for(lambda: _held(cluster) == {classic: ("default/classic",)}, 30, "the slices naming the classic pod")
    table = status_text(cluster.api, driver=DRIVER_NAME, nodes=[NODE], output="")
    assert "device-plugin: default/classic" in table, table
    cluster.apply({"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
                   "metadata": {"name": "rest", "namespace": "default"},
                   "spec": {"devices": {"requests": [{"name": "gpus", "exactly": {
                       "deviceClassName": DRIVER_NAME, "allocationMode": "ExactCount", "count": GPUS - 1}}]}}})
    cluster.apply(_pod("dra", claim="rest"))
    dra = _gpus_seen(cluster, "dra")
    assert len(dra) == GPUS - 1 and classic not in dra
    wait_for(lambda: _allocatable(cluster) == "1", 30, f"allocatable {RESOURCE} down to 1 (DRA's are Unhealthy)")
    _gone(cluster, "dra")
    wait_for(lambda: _allocatable(cluster) == str(GPUS), 30, f"allocatable {RESOURCE} back to {GPUS}")
    cluster.apply(_pod("second", gpus=1))
    [second] = _gpus_seen(cluster, "second")
    assert second != classic
    _gone(cluster, "classic")
    _gone(cluster, "second")
    # The grace (an allocation younger than 10 s is kept) and a reconcile (5 s) later, the GPUs are back.
    wait_for(lambda: len(_slice_gpus(cluster)) == GPUS, 60, "every GPU back in the slices", interval=0.5)
    assert _held(cluster) == {}  # and the annotation went in the same write
