"""Issue 23, "Done means": on the sandbox (API server, scheduler, kubelet simulator, the plugin as its own process),
a running MIG claim's `status.devices` shows the MIG UUID and profile; after the pod is deleted the entry is gone;
a failing API write fails no prepare and is retried."""

from __future__ import annotations

from collections.abc import Iterator
from functools import partial
from typing import Any

import pytest

from dra_driver.commands.status import status_text
from dra_driver.defaults import DRIVER_NAME
from dra_sandbox.cluster import NodeSpec, SandboxCluster
from dra_sandbox.deviceclasses import device_classes
from tests.integration.conftest import claim_object, pod_object, sandbox
from tests.polling import wait_for

NODE = "node-status"
CLAIMS = "/apis/resource.k8s.io/v1/namespaces/default/resourceclaims"


@pytest.fixture(scope="module")
def cluster() -> Iterator[SandboxCluster]:
    with sandbox("dra-devst-", [NodeSpec(NODE, "fake:dgx-h100")], device_classes=device_classes(DRIVER_NAME),
                 kube_version="1.37.0") as c:
        yield c


def _ours(cluster: SandboxCluster, name: str) -> list[dict[str, Any]]:
    claim = cluster.api.get(f"{CLAIMS}/{name}") or {}
    return [e for e in (claim.get("status") or {}).get("devices") or [] if e.get("driver") == DRIVER_NAME]


def _phase_is(cluster: SandboxCluster, name: str, phase: str) -> bool:
    pod = cluster.api.get(f"/api/v1/namespaces/default/pods/{name}") or {}
    return bool((pod.get("status") or {}).get("phase") == phase)


def _mig_claim(name: str) -> dict[str, Any]:
    return claim_object(name, f"mig.{DRIVER_NAME}", f"device.attributes['{DRIVER_NAME}'].profile == '1g.10gb'")


def test_a_running_mig_claim_shows_its_mig_device_until_the_pod_is_deleted(cluster: SandboxCluster) -> None:
    cluster.apply(_mig_claim("mig-a"))
    pod = cluster.apply(pod_object("mig-a", "mig-a"))
    wait_for(partial(_phase_is, cluster, "mig-a", "Running"), 60, "pod mig-a to run")
    (entry,) = wait_for(lambda: _ours(cluster, "mig-a"), 30, "the claim's status.devices entry")
    allocated = (cluster.api.get(f"{CLAIMS}/mig-a") or {})["status"]["allocation"]["devices"]["results"][0]
    assert (entry["pool"], entry["device"]) == (allocated["pool"], allocated["device"])
    assert entry["data"]["uuid"].startswith("MIG-") and entry["data"]["parentUUID"].startswith("GPU-")
    assert entry["data"]["migProfile"] == "1g.10gb"
    seen = (cluster.api.get("/api/v1/namespaces/default/pods/mig-a") or {})["metadata"]["annotations"]
    assert f'"NVIDIA_VISIBLE_DEVICES": "{entry["data"]["uuid"]}"' in seen["sandbox.dra.dev/containers"]
    ready = next(c for c in entry["conditions"] if c["type"] == "Ready")
    assert ready["status"] == "True"
    shown = status_text(cluster.api, driver=DRIVER_NAME, nodes=[NODE], output="").split("(status.devices)\n")[1]
    assert [NODE, "default/mig-a", entry["device"], entry["data"]["uuid"], "1g.10gb", "True"] in [
        line.split() for line in shown.splitlines()], shown

    cluster.delete(pod)
    wait_for(lambda: cluster.api.get("/api/v1/namespaces/default/pods/mig-a") is None, 60, "pod mig-a gone")
    wait_for(lambda: not _ours(cluster, "mig-a"), 30, "the entry gone after the pod")


def test_a_failing_status_write_fails_no_prepare_and_is_retried(cluster: SandboxCluster) -> None:
    cluster.server.faults.inject(verb="patch", resource="resourceclaims/status", status=503, count=2,
                                 name="mig-b")
    cluster.apply(_mig_claim("mig-b"))
    cluster.apply(pod_object("mig-b", "mig-b"))
    wait_for(partial(_phase_is, cluster, "mig-b", "Running"), 60, "pod mig-b to run despite the faults")
    (entry,) = wait_for(lambda: _ours(cluster, "mig-b"), 30, "the entry written after the retries")
    assert entry["data"]["migProfile"] == "1g.10gb"
    assert cluster.server.faults.pending() == 0
    log = cluster.server.request_log
    assert log.count("patch", "resourceclaims/status", name="mig-b") >= 3, log.summary()
