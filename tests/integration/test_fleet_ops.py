"""Operating a fleet, on a sandbox with the demo's nodes (real plugin processes, real API objects):
- a failed prepare leaves a Warning Event `PrepareFailed` on the ResourceClaim, deduplicated (count);
- `dra-driver status` shows per node each GPU's product, health, taints, MIG devices in use and who holds what;
- `dra-driver health taint --effect NoExecute` creates a DeviceTaintRule and the pod on that GPU is evicted (the
  sandbox's device taint eviction controller, as kube-controller-manager's); `health clear` deletes the rule;
- an Xid taint heals by itself after the healthy window, and the kubelet's health stream says HEALTHY again."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from collections.abc import Iterator
from typing import Any

import grpc
import pytest

from dra_driver.defaults import DRIVER_NAME
from dra_driver.k8s.taintrules import taint_rule_version
from dra_driver.nvml.fake.inbox import post_event
from dra_sandbox.cluster import NodeSpec, SandboxCluster
from dra_sandbox.deviceclasses import device_classes
from dra_sandbox.kubelet.draclient import ClaimRef, DraClient
from dra_sandbox.objects import create_allocated_claim
from tests.integration.conftest import claim_object, explained, pod_object, sandbox
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


def test_admin_noexecute_taint_evicts_the_pod_and_clear_deletes_the_rule(cluster: SandboxCluster) -> None:
    """`health taint --node N --device gpu-K --effect NoExecute`: a DeviceTaintRule (found by discovery: v1 on
    this 1.37 sandbox), the pod whose claim holds gpu-K is evicted with the condition upstream sets, a new claim
    does not get gpu-K; `health clear` deletes the rule and gpu-K can be allocated again. gpu-K is a GPU of the
    H100 node no claim of the module's earlier tests holds (which GPUs they got depends on the scheduler's order)."""
    k = _free_gpu_index(cluster, H100)
    gpu = f"gpu-{k}"
    selector = (f'device.attributes["{DRIVER_NAME}"].type == "gpu" && device.attributes["{DRIVER_NAME}"].index == {k} '
            f'&& device.attributes["{DRIVER_NAME}"].productName.startsWith("NVIDIA H100")')
    cluster.apply(claim_object("on-gpu-k", selector=selector))
    cluster.apply(pod_object("on-gpu-k", "on-gpu-k"))
    wait_for(lambda: running(cluster, "on-gpu-k"), 60, "the pod on gpu-K to run")
    claim = cluster.api.get("/apis/resource.k8s.io/v1/namespaces/default/resourceclaims/on-gpu-k") or {}
    result = claim["status"]["allocation"]["devices"]["results"][0]
    assert (result["pool"], result["device"]) == (H100, gpu)

    cli(cluster, "health", "taint", "--node", H100, "--device", gpu, "--effect", "NoExecute", "--reason", "fan")
    assert taint_rule_version(cluster.api) == "v1"  # the sandbox reports 1.37
    rules = "/apis/resource.k8s.io/v1/devicetaintrules"
    name = f"{DRIVER_NAME}.admin.{H100}.{gpu}"
    rule = cluster.api.get(f"{rules}/{name}") or {}
    assert rule["spec"]["deviceSelector"] == {"driver": DRIVER_NAME, "pool": H100, "device": gpu}
    assert rule["spec"]["taint"]["effect"] == "NoExecute"

    def evicted() -> bool:
        pod = cluster.api.get("/api/v1/namespaces/default/pods/on-gpu-k")
        return pod is None or bool(pod["metadata"].get("deletionTimestamp"))

    wait_for(evicted, 30, "the pod on gpu-K evicted")
    events = [e for e in cluster.items("/api/v1/namespaces/default/events")
              if e["involvedObject"].get("name") == "on-gpu-k" and e["reason"] == "DeviceTaintManagerEviction"]
    assert events and events[0]["message"] == "Marking for deletion"
    wait_for(lambda: ((cluster.api.get(f"{rules}/{name}") or {}).get("status") or {}).get("conditions"), 30,
             "the rule's EvictionInProgress condition")
    assert name in cli(cluster, "health", "show", "--node", H100)

    cluster.apply(claim_object("wants-gpu-k", selector=selector))
    cluster.apply(pod_object("wants-gpu-k", "wants-gpu-k"))
    pending = wait_for(lambda: _unschedulable_message(cluster, "wants-gpu-k"), 30, "the new pod refused")
    assert "cannot allocate all claims" in pending, pending  # kube-scheduler's words; the reason is explain's
    assert "tainted" in explained(cluster.kubeconfig, "wants-gpu-k")

    cli(cluster, "health", "clear", "--node", H100, "--device", gpu)
    assert cluster.api.get(f"{rules}/{name}") is None
    wait_for(lambda: running(cluster, "wants-gpu-k"), 60, "gpu-K allocated again after the clear")


def _free_gpu_index(cluster: SandboxCluster, node: str) -> int:
    """The highest index of a GPU of `node` that no allocated claim holds, whole or by a partition of it."""
    held = set()
    for claim in cluster.items("/apis/resource.k8s.io/v1/resourceclaims"):
        for result in (((claim.get("status") or {}).get("allocation") or {}).get("devices") or {}).get("results", []):
            if result["pool"] == node and (match := re.match(r"gpu-(\d+)", result["device"])):
                held.add(int(match.group(1)))
    return max(set(range(8)) - held)


def _unschedulable_message(cluster: SandboxCluster, pod: str) -> str:
    obj = cluster.api.get(f"/api/v1/namespaces/default/pods/{pod}") or {}
    for condition in (obj.get("status") or {}).get("conditions") or []:
        if condition.get("type") == "PodScheduled" and condition.get("status") == "False":
            return str(condition.get("message") or "")
    return ""


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
