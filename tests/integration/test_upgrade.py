"""A rolling update of the kubelet plugin without a gap (chart value seamlessUpgrade: maxSurge 1,
maxUnavailable 0, per-pod sockets), on the sandbox: the kubelet simulator registers both instances and calls
the newest; claims prepared by the old instance are unprepared by the new one; prepares during the switch
succeed; the node's ResourceSlices are never rewritten or wiped; each instance removes only its own sockets."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import grpc
import pytest

from dra_driver.defaults import DRIVER_NAME
from dra_driver.plugin.checkpoint import ClaimState
from dra_sandbox.cluster import NodeSpec, SandboxCluster
from dra_sandbox.deviceclasses import device_classes
from dra_sandbox.kubelet.draclient import DraClient
from tests.integration.conftest import allocated_claim, checkpoint, claim_object, pod_object, sandbox
from tests.polling import wait_for

NODE = "node-a"


@pytest.fixture(scope="module")
def cluster() -> Iterator[SandboxCluster]:
    with sandbox(
        "dra-up-", [NodeSpec(NODE, "fake:dgx-h100")], device_classes=device_classes(DRIVER_NAME), seamless_upgrade=True
    ) as c:
        yield c


def _run_pod(cluster: SandboxCluster, name: str) -> dict[str, Any]:
    """A claim on one whole GPU and a pod using it; returns the claim once the pod runs."""
    cluster.apply(claim_object(name))
    cluster.apply(pod_object(name, name))

    def running() -> bool:
        pod = cluster.api.get(f"/api/v1/namespaces/default/pods/{name}")
        return pod is not None and pod.get("status", {}).get("phase") == "Running"

    wait_for(running, 60, f"pod {name} to run")
    claim = cluster.api.get(f"/apis/resource.k8s.io/v1/namespaces/default/resourceclaims/{name}")
    assert claim is not None
    return claim


def _prepared(cluster: SandboxCluster, uid: str) -> bool:
    cp = checkpoint(cluster)
    return cp is not None and uid in cp.claims and cp.claims[uid].state is ClaimState.PREPARE_COMPLETED


def _slices(cluster: SandboxCluster) -> list[tuple[str, int]]:
    items = cluster.items("/apis/resource.k8s.io/v1/resourceslices")
    return sorted((s["metadata"]["name"], s["spec"]["pool"]["generation"]) for s in items)


def test_rolling_update_keeps_the_node_able_to_prepare_throughout(cluster: SandboxCluster) -> None:
    old = cluster.plugins[NODE]
    assert old.pod_uid is not None and old.sockets.dra.name == f"dra-{old.pod_uid}.sock"
    before = _run_pod(cluster, "before")  # prepared by the old instance
    uid_before = before["metadata"]["uid"]
    assert _prepared(cluster, uid_before)
    slices = _slices(cluster)
    log = cluster.server.request_log
    log.reset()
    during: dict[str, Any] = {}

    def while_both_serve() -> None:
        kubelet = cluster.kubelets[NODE]
        wait_for(lambda: len([p for p in kubelet.plugins.all() if p.driver == DRIVER_NAME]) == 2, 30, "both registered")
        # The kubelet now calls the newest instance: a pod started during the switch runs.
        during["claim"] = _run_pod(cluster, "during")
        # A call still in flight at the old instance (the kubelet picked it a moment earlier) succeeds too, on a GPU
        # the scheduler gave to neither pod.
        taken = {
            r["device"] for c in (before, during["claim"]) for r in c["status"]["allocation"]["devices"]["results"]
        }
        ref = allocated_claim(cluster, [next(f"gpu-{i}" for i in range(8) if f"gpu-{i}" not in taken)])
        with grpc.insecure_channel(f"unix://{old.sockets.dra}") as channel:
            result = DraClient(channel, "v1.DRAPlugin", timeout_s=20).prepare([ref])[ref.uid]
        assert result.ok, result.error
        during["direct"] = ref

    new = cluster.upgrade_plugin(NODE, while_both_serve=while_both_serve)
    assert old.process is not None and old.process.returncode == 0  # a clean SIGTERM exit
    assert not old.sockets.dra.exists() and not old.sockets.registration.exists()
    assert new.sockets.dra.exists() and new.sockets.registration.exists()
    kubelet = cluster.kubelets[NODE]
    wait_for(lambda: [p.endpoint for p in kubelet.plugins.all()] == [str(new.sockets.dra)], 30, "old deregistered")

    # Everything either instance prepared is one shared truth, now served by the new instance.
    for uid in (uid_before, during["claim"]["metadata"]["uid"], during["direct"].uid):
        assert _prepared(cluster, uid)
    after = _run_pod(cluster, "after")
    assert _prepared(cluster, after["metadata"]["uid"])

    # The claim the OLD instance prepared is unprepared by the NEW one when its pod goes.
    cluster.api.request("DELETE", "/api/v1/namespaces/default/pods/before")
    wait_for(lambda: uid_before not in checkpoint(cluster).claims, 60, "the old instance's claim to be unprepared")
    # The metadata spec goes after the checkpoint entry (the device-metadata observer runs after the engine): poll for it too.
    wait_for(lambda: list(cluster.cdi_root.glob(f"*{uid_before}*")) == [], 30, "the claim's CDI specs removed")
    with grpc.insecure_channel(f"unix://{new.sockets.dra}") as channel:
        client = DraClient(channel, "v1.DRAPlugin", timeout_s=20)
        assert client.unprepare([during["direct"]]) == {during["direct"].uid: None}

    # The pool was never rewritten, let alone wiped: the new instance took over publishing with zero writes.
    assert _slices(cluster) == slices
    # (The new instance's dry-run feature probes store nothing: docs/reference/dra-in-flight.md.)
    writes = [r for r in log.records() if r.resource == "resourceslices" and not r.dry_run
              and r.verb in ("create", "update", "patch", "delete")]
    assert writes == []
