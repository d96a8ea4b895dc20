"""Dynamic MIG end to end on the sandbox: pods with 1g.10gb, 2g.20gb and 3g.40gb claims on one H100 run
at once; a 7g.80gb claim pinned to that GPU waits until they are deleted; MIG instances exist exactly while
claims are prepared (read from the fake NVML state file the plugin process writes)."""

from __future__ import annotations

from collections.abc import Iterator
from functools import partial
from typing import Any

import pytest

from dra_driver.defaults import DRIVER_NAME
from dra_driver.nvml.fake.state import read_fake_state
from dra_sandbox.cluster import NodeSpec, SandboxCluster
from dra_sandbox.deviceclasses import device_classes
from tests.integration.conftest import claim_object, explained, pod_object, sandbox
from tests.narrow import present
from tests.polling import wait_for

NODE = "node-h100"


@pytest.fixture(scope="module")
def cluster() -> Iterator[SandboxCluster]:
    with sandbox("dra-mig-", [NodeSpec(NODE, "fake:dgx-h100")], device_classes=device_classes(DRIVER_NAME)) as c:
        yield c


def _claim(name: str, profile: str | None) -> dict[str, Any]:
    """A claim pinned to GPU 0: the whole GPU, or a MIG device of `profile` on it."""
    if profile is None:
        return claim_object(name, DRIVER_NAME, f"device.attributes['{DRIVER_NAME}'].index == 0")
    return claim_object(
        name,
        f"mig.{DRIVER_NAME}",
        f"device.attributes['{DRIVER_NAME}'].profile == '{profile}' && device.attributes['{DRIVER_NAME}'].index == 0",
    )


def _phase(cluster: SandboxCluster, name: str) -> str:
    pod = cluster.api.get(f"/api/v1/namespaces/default/pods/{name}")
    return str((pod or {}).get("status", {}).get("phase", "Gone" if pod is None else ""))


def _phase_is(cluster: SandboxCluster, name: str, phase: str) -> bool:
    return _phase(cluster, name) == phase


def _instances(cluster: SandboxCluster) -> list[tuple[int, int]]:
    state = read_fake_state(cluster.plugins[NODE].state_file)
    gpu0 = state.gpus[0]
    return sorted((gi.profile_id, gi.placement.start) for gi in gpu0.gis)


def test_partitions_run_together_and_the_big_one_waits(cluster: SandboxCluster) -> None:
    small = {"small-1g": "1g.10gb", "small-2g": "2g.20gb", "small-3g": "3g.40gb"}
    for name, profile in small.items():
        cluster.apply(_claim(name, profile))
        cluster.apply(pod_object(name, name))
    for name in small:
        wait_for(partial(_phase_is, cluster, name, "Running"), 60, f"pod {name} to run")
    live = _instances(cluster)
    assert [p for p, _ in live] == sorted([19, 14, 9]), live  # one GI per claim, all on GPU 0
    for name in small:
        pod = present(cluster.api.get(f"/api/v1/namespaces/default/pods/{name}"))
        seen = pod["metadata"]["annotations"]["sandbox.dra.dev/containers"]
        assert '"NVIDIA_VISIBLE_DEVICES": "MIG-' in seen

    cluster.apply(_claim("big-7g", "7g.80gb"))
    cluster.apply(pod_object("big-7g", "big-7g"))
    message = wait_for(
        lambda: next(
            (
                c.get("message")
                for c in (cluster.api.get("/api/v1/namespaces/default/pods/big-7g") or {})
                .get("status", {})
                .get("conditions", [])
                if c.get("type") == "PodScheduled" and c.get("status") == "False"
            ),
            None,
        ),
        30,
        "the 7g pod to be reported unschedulable",
    )
    assert "cannot allocate all claims" in message, message  # kube-scheduler's words; the reason is explain's
    reason = explained(cluster.kubeconfig, "big-7g")
    assert "gpu-0-counter-set" in reason or "counter" in reason, reason
    assert _phase(cluster, "big-7g") == "Pending"

    for name in small:
        cluster.api.request("DELETE", f"/api/v1/namespaces/default/pods/{name}")
        cluster.api.request("DELETE", f"/apis/resource.k8s.io/v1/namespaces/default/resourceclaims/{name}")
    wait_for(lambda: _phase(cluster, "big-7g") == "Running", 60, "the 7g pod to run after the small ones left")
    assert _instances(cluster) == [(0, 0)]
    cluster.api.request("DELETE", "/api/v1/namespaces/default/pods/big-7g")
    wait_for(lambda: _phase(cluster, "big-7g") == "Gone", 30, "the 7g pod to go")
    wait_for(lambda: _instances(cluster) == [], 30, "the 7g instance to be destroyed at unprepare")
    state = read_fake_state(cluster.plugins[NODE].state_file)
    assert not state.gpus[0].mig_current  # Hopper: MIG off after the last partition
