"""Shares through the sandbox: the sandbox API server admits what the kubelet plugin publishes with
`--sharing-mode shares` (validated against resource.k8s.io/v1), and the scheduler stand-in allocates shares of
one GPU, keeps out what does not fit (saying why on the pod), and keeps the whole GPU and shares apart.
Each step calls `reconcile()` directly: no background thread, no waiting."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from dra_driver.defaults import DRIVER_NAME
from dra_driver.inventory.catalog import MigOffering, catalog
from dra_driver.inventory.discover import discover
from dra_driver.inventory.sharing import sharing_settings
from dra_driver.k8s.client import KubeRest
from dra_driver.nvml.factory import open_backend
from dra_driver.slices.builder import SliceSettings, build_slices
from dra_sandbox.apiserver import ApiServer
from dra_sandbox.deviceclasses import device_classes
from dra_sandbox.kubelet.nodestatus import ready_node
from dra_sandbox.scheduler import SandboxScheduler
from tests.integration.conftest import explained
from tests.sandbox.conftest import create_claim

NODE = "dgx-1"
RESOURCE = "/apis/resource.k8s.io/v1"
SHARE_CLASS = f"gpu-share.{DRIVER_NAME}"
GPU0 = f"device.attributes['{DRIVER_NAME}'].index == 0"


@pytest.fixture
def apiserver() -> Iterator[ApiServer]:
    with ApiServer(kube_version="1.35.0") as server:
        rest = server.rest()
        rest.request("POST", "/api/v1/nodes", body=ready_node(NODE))
        for obj in device_classes(DRIVER_NAME):
            rest.request("POST", f"{RESOURCE}/deviceclasses", body=obj)
        for obj in published_slices():
            rest.request("POST", f"{RESOURCE}/resourceslices", body=obj)  # the server validates each one
        yield server


@pytest.fixture
def rest(apiserver: ApiServer) -> KubeRest:
    return apiserver.rest()


@pytest.fixture
def kubeconfig(apiserver: ApiServer, tmp_path: Path) -> Path:
    return apiserver.write_kubeconfig(tmp_path / "kubeconfig")


def published_slices() -> list[dict[str, Any]]:
    backend = open_backend("fake:dgx-h100")
    backend.init()
    try:
        inventory = discover(backend)
    finally:
        backend.shutdown()
    sharing = sharing_settings("shares", shared_gpus="0")
    devices = catalog(inventory, MigOffering.STATIC, sharing)
    return build_slices(inventory.system, devices, SliceSettings(DRIVER_NAME, NODE, sharing=sharing), generation=1)


def share(rest: KubeRest, name: str, **requests: str) -> None:
    create_claim(rest, name, {"deviceClassName": SHARE_CLASS, **({"capacity": {"requests": requests}} if requests else {})})


def whole_gpu0(rest: KubeRest, name: str) -> None:
    create_claim(rest, name, {"deviceClassName": DRIVER_NAME, "selectors": [{"cel": {"expression": GPU0}}]})


def results(rest: KubeRest, name: str) -> list[dict[str, Any]] | None:
    claim = rest.request("GET", f"{RESOURCE}/namespaces/default/resourceclaims/{name}")
    allocation = (claim.get("status") or {}).get("allocation")
    return None if allocation is None else list(allocation["devices"]["results"])


def pod_status(rest: KubeRest, name: str) -> tuple[str | None, str]:
    pod = rest.request("GET", f"/api/v1/namespaces/default/pods/pod-{name}")
    conditions = (pod.get("status") or {}).get("conditions") or []
    message = " ".join(str(c.get("message", "")) for c in conditions if c.get("type") == "PodScheduled")
    return pod["spec"].get("nodeName"), message


def test_three_shares_then_one_that_does_not_fit(rest: KubeRest, kubeconfig: Path) -> None:
    scheduler = SandboxScheduler(rest)
    for name, memory in (("a", "20Gi"), ("b", "20Gi"), ("c", "30Gi")):
        share(rest, name, memory=memory)
    scheduler.reconcile()
    got = {name: results(rest, name) for name in "abc"}
    assert {n: [(r["device"], r["consumedCapacity"]) for r in rs or []] for n, rs in got.items()} == {
        "a": [("gpu-0-shared", {"memory": "20Gi", "compute": "10"})],
        "b": [("gpu-0-shared", {"memory": "20Gi", "compute": "10"})],
        "c": [("gpu-0-shared", {"memory": "30Gi", "compute": "10"})],
    }
    assert len({rs[0]["shareID"] for rs in got.values() if rs}) == 3
    assert all(pod_status(rest, n)[0] == NODE for n in "abc")

    share(rest, "d", memory="20Gi")
    scheduler.reconcile()
    assert results(rest, "d") is None
    node, message = pod_status(rest, "d")
    assert node is None
    assert "1 cannot allocate all claims." in message  # kube-scheduler's words
    assert "memory 20Gi requested, 70Gi of 81559Mi already consumed by 3 shares" in explained(kubeconfig, "d")

    whole_gpu0(rest, "whole")
    scheduler.reconcile()
    assert results(rest, "whole") is None
    assert "1 cannot allocate all claims." in pod_status(rest, "whole")[1]
    assert "held by gpu-0-shared (3 shares)" in explained(kubeconfig, "whole")


def test_whole_gpu_first_keeps_shares_out_and_defaults_apply(rest: KubeRest, kubeconfig: Path) -> None:
    scheduler = SandboxScheduler(rest)
    whole_gpu0(rest, "whole")
    scheduler.reconcile()
    assert [r["device"] for r in results(rest, "whole") or []] == ["gpu-0"]
    share(rest, "plain")  # requests nothing: the defaults, if it fit
    scheduler.reconcile()
    assert results(rest, "plain") is None
    assert "1 cannot allocate all claims." in pod_status(rest, "plain")[1]
    assert "held by gpu-0 (claim default/whole)" in explained(kubeconfig, "plain")

    # Free GPU 0: delete the pod; the scheduler releases the claim; then the share fits with the defaults.
    rest.request("DELETE", "/api/v1/namespaces/default/pods/pod-whole?gracePeriodSeconds=0")
    scheduler.reconcile()
    assert results(rest, "whole") is None
    scheduler.reconcile()
    [only] = results(rest, "plain") or [{}]
    assert (only.get("device"), only.get("consumedCapacity")) == ("gpu-0-shared", {"memory": "4Gi", "compute": "10"})
