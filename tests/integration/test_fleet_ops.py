"""Operating a fleet, on a sandbox with the demo's nodes (real plugin processes, real API objects):
- a failed prepare leaves a Warning Event `PrepareFailed` on the ResourceClaim, deduplicated (count);
- `dra-driver status` shows per node each GPU's product, health, taints, MIG devices in use and who holds what;
- `dra-driver health taint|clear` taints and clears a device through the Node annotation the plugin polls;
- an Xid taint heals by itself after the healthy window, and the kubelet's health stream says HEALTHY again."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from typing import Any

import grpc
import pytest

from dra_driver.defaults import DRIVER_NAME
from dra_driver.nvml.fake.inbox import post_event
from dra_sandbox.cluster import NodeSpec, SandboxCluster
from dra_sandbox.deviceclasses import device_classes
from dra_sandbox.kubelet.draclient import ClaimRef, DraClient
from dra_sandbox.objects import create_allocated_claim
from tests.integration.conftest import claim_object, pod_object, sandbox
from tests.polling import wait_for

H100, A100 = "node-h100", "node-a100"
SLICES = "/apis/resource.k8s.io/v1/resourceslices"
MIG_1G = f'device.attributes["{DRIVER_NAME}"].profile == "1g.10gb"'


@pytest.fixture(scope="module")
def cluster() -> Iterator[SandboxCluster]:
    nodes = [NodeSpec(H100, "fake:dgx-h100"), NodeSpec(A100, "fake:dgx-a100")]
    env = {"DRA_DRIVER_HEALTH_CHECK_INTERVAL": "0.2", "DRA_DRIVER_HEALTH_HEAL_AFTER": "2"}
    with sandbox("dra-fleet-", nodes, device_classes=device_classes(DRIVER_NAME), plugin_env=env) as c:
        yield c


def cli(cluster: SandboxCluster, *args: str) -> str:
    done = subprocess.run(
        [sys.executable, "-m", "dra_driver.cli", *args, "--kubeconfig", str(cluster.kubeconfig)],
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    return done.stdout


def running(cluster: SandboxCluster, pod: str) -> bool:
    obj = cluster.api.get(f"/api/v1/namespaces/default/pods/{pod}") or {}
    return bool((obj.get("status") or {}).get("phase") == "Running")


def taints(cluster: SandboxCluster, node: str) -> dict[str, Any]:
    return {
        d["name"]: d.get("taints")
        for s in cluster.items(SLICES)
        if s["spec"].get("nodeName") == node
        for d in s["spec"].get("devices", [])
    }


def test_a_failed_prepare_is_an_event_on_the_claim(cluster: SandboxCluster) -> None:
    bad_config = [{"source": "FromClaim", "opaque": {"driver": DRIVER_NAME, "parameters": {
        "apiVersion": "gpu.dra.dev/v1beta1", "kind": "GpuConfig", "sharing": {"strategy": "Spatial"}}}}]  # fmt: skip
    cluster.wait_pool_published(H100)
    claim = create_allocated_claim(
        cluster.api, namespace="default", name="bad", driver=DRIVER_NAME, pool=H100, devices=["gpu-6"],
        config=bad_config,
    )  # fmt: skip
    ref = ClaimRef("default", "bad", claim["metadata"]["uid"])
    channel = grpc.insecure_channel(f"unix://{cluster.plugins[H100].sockets.dra}")
    client = DraClient(channel, "v1.DRAPlugin", timeout_s=20)
    errors = [client.prepare([ref])[ref.uid].error for _ in range(3)]  # the kubelet retries
    channel.close()
    assert errors[0] and "Spatial" in errors[0] and errors.count(errors[0]) == 3

    def events() -> list[dict[str, Any]]:
        items = cluster.items("/api/v1/namespaces/default/events")
        return [e for e in items if e["involvedObject"].get("uid") == ref.uid]

    found = wait_for(lambda: events() or None, 20, "the PrepareFailed event")
    assert len(found) == 1  # one series, not one Event per retry
    event = found[0]
    assert event["reason"] == "PrepareFailed" and event["type"] == "Warning"
    assert event["message"] == errors[0]
    assert event["involvedObject"] == {
        "apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim", "namespace": "default", "name": "bad",
        "uid": ref.uid,
    }  # fmt: skip
    assert event["source"]["host"] == H100 and event["count"] >= 1


def test_status_shows_gpus_mig_layout_and_holders(cluster: SandboxCluster) -> None:
    cluster.apply(claim_object("train"))
    cluster.apply(pod_object("train", "train"))
    cluster.apply(claim_object("tiny", f"mig.{DRIVER_NAME}", selector=MIG_1G))
    cluster.apply(pod_object("tiny", "tiny"))
    wait_for(lambda: running(cluster, "train") and running(cluster, "tiny"), 60, "both pods to run")

    data = json.loads(cli(cluster, "status", "-o", "json"))
    assert [n["name"] for n in data] == [A100, H100]
    gpus = {(n["name"], g["name"]): g for n in data for g in n["gpus"]}
    assert len(gpus) == 16 and all(g["health"] == "Healthy" for g in gpus.values())
    holders = {(node, gpu): g["holders"] for (node, gpu), g in gpus.items() if g["holders"]}
    migs = {(node, m["name"]): m for (node, _), g in gpus.items() for m in g["mig"]}
    train = next(h for hs in holders.values() for h in hs if h["claim"] == "default/train")
    assert train["pods"] == ["default/train (Running)"]
    tiny = next(m for m in migs.values() if m["holders"][0]["claim"] == "default/tiny")
    assert tiny["profile"] == "1g.10gb" and tiny["holders"][0]["pods"] == ["default/tiny (Running)"]
    gpu_of_tiny = next(g for g in gpus.values() if tiny in g["mig"])
    assert gpu_of_tiny["sharing"] == "mig" and gpu_of_tiny["product"] and gpu_of_tiny["mig_allocated"] == 1

    table = cli(cluster, "status", "--node", H100)
    assert table.splitlines()[0].split() == ["NODE", "DEVICE", "PRODUCT", "HEALTH", "SHARING", "TAINTS", "HELD", "BY"]
    assert A100 not in table and "NVIDIA H100" in table
    wide = cli(cluster, "status", "-o", "wide")
    assert "UUID" in wide.splitlines()[0] and "default/train <- default/train (Running)" in wide


def test_admin_taint_and_clear_through_the_cli(cluster: SandboxCluster) -> None:
    cli(cluster, "health", "taint", "--node", H100, "--device", "gpu-7")
    admin = [{"key": f"{DRIVER_NAME}/admin", "value": "unhealthy", "effect": "NoSchedule"}]
    wait_for(lambda: taints(cluster, H100).get("gpu-7") == admin, 20, "the admin's taint")
    status = json.loads(cli(cluster, "status", "-o", "json", "--node", H100))
    gpu7 = next(g for g in status[0]["gpus"] if g["name"] == "gpu-7")
    assert gpu7["health"] == "Unhealthy" and gpu7["taints"] == [f"{DRIVER_NAME}/admin=unhealthy:NoSchedule"]
    node = cluster.api.get(f"/api/v1/nodes/{H100}") or {}
    assert node["metadata"]["annotations"][f"{DRIVER_NAME}/device-health"] == "gpu-7=unhealthy"

    cli(cluster, "health", "clear", "--node", H100, "--device", "gpu-7")
    wait_for(lambda: taints(cluster, H100).get("gpu-7") is None, 20, "the taint cleared")
    events = [e for e in cluster.items("/api/v1/namespaces/default/events") if e["involvedObject"]["kind"] == "Node"]
    assert {(e["involvedObject"]["name"], e["reason"]) for e in events} >= {(H100, "DeviceTainted"),
                                                                           (H100, "DeviceUntainted")}  # fmt: skip


def pod_health(cluster: SandboxCluster, pod: str) -> str:
    obj = cluster.api.get(f"/api/v1/namespaces/default/pods/{pod}") or {}
    for status in (obj.get("status") or {}).get("containerStatuses", []):
        for entry in status.get("allocatedResourcesStatus", []):
            for resource in entry.get("resources", []):
                return str(resource.get("health"))
    return ""


def test_an_xid_taint_heals_after_the_window(cluster: SandboxCluster) -> None:
    """The pod's device: tainted and Unhealthy on the kubelet's health stream, then both cleared by the window."""
    cluster.apply(claim_object("healme", f"mig.{DRIVER_NAME}", selector=MIG_1G))
    cluster.apply(pod_object("healme", "healme"))
    wait_for(lambda: running(cluster, "healme"), 60, "the pod to run")
    claim = cluster.api.get("/apis/resource.k8s.io/v1/namespaces/default/resourceclaims/healme") or {}
    result = claim["status"]["allocation"]["devices"]["results"][0]
    node, name = result["pool"], result["device"]
    device = next(d for s in cluster.items(SLICES) if s["spec"].get("nodeName") == node
                  for d in s["spec"].get("devices", []) if d["name"] == name)  # fmt: skip
    post_event(cluster.plugins[node].state_file, device["attributes"]["parentUUID"]["string"], xid=48)
    wait_for(lambda: taints(cluster, node).get(name), 20, "the Xid taint")
    assert taints(cluster, node)[name] == [{"key": f"{DRIVER_NAME}/xid", "value": "48", "effect": "NoSchedule"}]
    wait_for(lambda: pod_health(cluster, "healme") == "Unhealthy", 30, "the pod's device Unhealthy")
    wait_for(lambda: taints(cluster, node).get(name) is None, 30, "the taint healed")
    wait_for(lambda: pod_health(cluster, "healme") == "Healthy", 30, "the pod's device Healthy again")
