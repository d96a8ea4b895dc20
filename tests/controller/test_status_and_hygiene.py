"""The controller's status counts (devices, nodes, claims of a policy's class) and slice hygiene (slices of
vanished Nodes), against the sandbox API server: slices, nodes and claims are written through the API as
the kubelet plugin and the scheduler would write them, and every expectation is read back from the API."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from dra_driver.controller.operator import ControllerSettings, run
from dra_driver.k8s.client import KubeRest
from dra_sandbox.apiserver import ApiServer
from tests.controller.test_controller_sandbox import CHART_CRD, CLASSES, DRIVER, POLICIES, TIMEOUT, policy, wait_ready
from tests.polling import wait_for

SLICES = "/apis/resource.k8s.io/v1/resourceslices"
NODES = "/api/v1/nodes"
GRACE = 0.5


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[tuple[ApiServer, KubeRest]]:
    with ApiServer() as srv, srv.rest() as rest:
        rest.request(
            "POST",
            "/apis/apiextensions.k8s.io/v1/customresourcedefinitions",
            body=yaml.safe_load(CHART_CRD.read_text()),
        )
        kubeconfig = tmp_path / "kubeconfig"
        srv.write_kubeconfig(kubeconfig)
        stop, ready = threading.Event(), threading.Event()
        options = ControllerSettings(
            driver_name=DRIVER,
            kubeconfig=str(kubeconfig),
            healthz_port=-1,
            resync_seconds=1.0,
            watch_timeout_seconds=10,
            status_interval_seconds=0.2,
            stale_slice_grace_seconds=GRACE,
        )
        thread = threading.Thread(
            target=run, args=(options,), kwargs={"stop_flag": stop, "ready_flag": ready}, daemon=True
        )
        thread.start()
        try:
            assert ready.wait(TIMEOUT), "the controller did not become ready"
            yield srv, rest
        finally:
            stop.set()
            thread.join(TIMEOUT)
        assert not thread.is_alive(), "the controller did not stop"


def node(name: str) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Node", "metadata": {"name": name}}


def gpu(index: int, product: str, type_: str = "gpu") -> dict[str, Any]:
    return {
        "name": f"gpu-{index}",
        "attributes": {"type": {"string": type_}, "productName": {"string": product}, "index": {"int": index}},
    }


def resource_slice(
    node_name: str, devices: list[dict[str, Any]], *, driver: str = DRIVER, owner_uid: str | None = None
) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": f"{node_name}-{driver}"}
    if owner_uid:
        meta["ownerReferences"] = [{"apiVersion": "v1", "kind": "Node", "name": node_name, "uid": owner_uid}]
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceSlice",
        "metadata": meta,
        "spec": {
            "driver": driver,
            "nodeName": node_name,
            "pool": {"name": node_name, "generation": 1, "resourceSliceCount": 1},
            "devices": devices,
        },
    }


def claim(name: str, class_name: str) -> dict[str, Any]:
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": name, "namespace": "default"},
        "spec": {"devices": {"requests": [{"name": "gpu", "exactly": {"deviceClassName": class_name}}]}},
    }


H100 = "NVIDIA H100 80GB HBM3"
A100 = "NVIDIA A100-SXM4-40GB"


def status_of(rest: KubeRest, name: str) -> dict[str, Any]:
    obj = rest.get(f"{POLICIES}/{name}")
    assert obj is not None
    return dict(obj.get("status") or {})


def wait_counts(rest: KubeRest, name: str, devices: int, nodes: int, claims: int) -> dict[str, Any]:
    def check() -> dict[str, Any] | None:
        status = status_of(rest, name)
        got = (status.get("devices"), status.get("nodes"), status.get("claims"))
        return status if got == (devices, nodes, claims) else None

    return wait_for(
        check, TIMEOUT, f"policy {name} to count {devices} devices, {nodes} nodes, {claims} claims", interval=0.05
    )


def allocate(rest: KubeRest, name: str, device: str, pool: str) -> None:
    rest.request(
        "PUT",
        f"/apis/resource.k8s.io/v1/namespaces/default/resourceclaims/{name}/status",
        body={
            **rest.request("GET", f"/apis/resource.k8s.io/v1/namespaces/default/resourceclaims/{name}"),
            "status": {
                "allocation": {
                    "devices": {"results": [{"request": "gpu", "driver": DRIVER, "pool": pool, "device": device}]}
                }
            },
        },
    )


def test_status_counts_devices_nodes_and_claims(cluster: tuple[ApiServer, KubeRest]) -> None:
    srv, rest = cluster
    for name in ("n1", "n2", "n3"):
        rest.request("POST", NODES, body=node(name))
    rest.request("POST", SLICES, body=resource_slice("n1", [gpu(0, H100), gpu(1, H100)]))
    rest.request("POST", SLICES, body=resource_slice("n2", [gpu(0, H100), gpu(1, A100)]))
    rest.request("POST", SLICES, body=resource_slice("n3", [gpu(0, A100), gpu(1, H100, "mig")]))
    # Another driver's slice with matching-looking attributes never counts (the class pins the driver).
    rest.request("POST", SLICES, body=resource_slice("n3", [gpu(0, H100)], driver="other.example.com"))

    rest.request("POST", POLICIES, body=policy("h100", {"devices": {"type": "gpu", "productNames": [H100]}}))
    rest.request(
        "POST",
        POLICIES,
        body=policy(
            "low-index", {"devices": {"type": "gpu", "selector": 'device.attributes["gpu.dra.dev"].index < 1'}}
        ),
    )
    wait_ready(rest, "h100", "True")
    wait_counts(rest, "h100", devices=3, nodes=2, claims=0)
    wait_counts(rest, "low-index", devices=3, nodes=3, claims=0)

    # Claims count once allocated from the class, not before; other classes' claims never.
    rest.request("POST", "/apis/resource.k8s.io/v1/namespaces/default/resourceclaims", body=claim("c1", "h100"))
    rest.request("POST", "/apis/resource.k8s.io/v1/namespaces/default/resourceclaims", body=claim("c2", "low-index"))
    allocate(rest, "c1", "gpu-0", "n1")
    allocate(rest, "c2", "gpu-0", "n2")
    wait_counts(rest, "h100", devices=3, nodes=2, claims=1)
    wait_counts(rest, "low-index", devices=3, nodes=3, claims=1)
    rest.request("DELETE", "/apis/resource.k8s.io/v1/namespaces/default/resourceclaims/c1")
    wait_counts(rest, "h100", devices=3, nodes=2, claims=0)

    # A node's slices go: the counts drop.
    rest.request("DELETE", f"{SLICES}/n1-{DRIVER}")
    wait_counts(rest, "h100", devices=1, nodes=1, claims=0)
    wait_counts(rest, "low-index", devices=2, nodes=2, claims=1)
    assert rest.get(f"{CLASSES}/h100") is not None

    # Debounced: many slice changes do not cause a status patch each.
    before = srv.request_log.count(verb="patch", resource="gpusharingpolicies/status")
    for i in range(40):
        rest.request(
            "PATCH",
            f"{SLICES}/n2-{DRIVER}",
            body={"metadata": {"labels": {"touch": str(i)}}},
            content_type="application/merge-patch+json",
        )
    rest.request("DELETE", f"{SLICES}/n2-{DRIVER}")
    wait_counts(rest, "h100", devices=0, nodes=0, claims=0)
    wait_counts(rest, "low-index", devices=1, nodes=1, claims=1)
    patches = srv.request_log.count(verb="patch", resource="gpusharingpolicies/status") - before
    assert patches <= 10, patches


def test_slices_of_a_vanished_node_are_deleted_after_the_grace_period(cluster: tuple[ApiServer, KubeRest]) -> None:
    srv, rest = cluster
    for name in ("keep", "gone"):
        rest.request("POST", NODES, body=node(name))
    rest.request("POST", SLICES, body=resource_slice("keep", [gpu(0, H100)]))
    rest.request("POST", SLICES, body=resource_slice("gone", [gpu(0, H100)]))
    foreign = rest.request("POST", SLICES, body=resource_slice("gone", [gpu(0, H100)], driver="other.example.com"))
    # A slice naming a Node that never existed goes too (a plugin that published before its Node was read).
    rest.request("POST", SLICES, body=resource_slice("never", [gpu(0, H100)]))

    rest.request("DELETE", f"{NODES}/gone")
    wait_for(
        lambda: rest.get(f"{SLICES}/gone-{DRIVER}") is None, TIMEOUT, "the stale slice to be deleted", interval=0.05
    )
    wait_for(
        lambda: rest.get(f"{SLICES}/never-{DRIVER}") is None, TIMEOUT, "the orphan slice to be deleted", interval=0.05
    )
    assert rest.get(f"{SLICES}/keep-{DRIVER}") is not None
    after = rest.get(f"{SLICES}/gone-other.example.com")
    assert after == foreign  # another driver's slice: never touched, not even written
    assert srv.request_log.count(verb="delete", resource="resourceslices") == 2


def test_slice_hygiene_waits_for_the_grace_period() -> None:
    from dra_driver.cel import DraCelEnvironment
    from dra_driver.controller.clusterview import ClusterView
    from dra_driver.controller.hygiene import Janitor

    class Rest:
        def __init__(self) -> None:
            self.deleted: list[str] = []
            self.nodes: set[str] = set()

        def get(self, path: str) -> dict[str, Any] | None:
            return {"metadata": {"name": path}} if path.rsplit("/", 1)[-1] in self.nodes else None

        def request(self, method: str, path: str, **_: Any) -> dict[str, Any]:
            assert method == "DELETE"
            self.deleted.append(path.rsplit("/", 1)[-1])
            return {}

    now = [100.0]
    view = ClusterView(DRIVER, DraCelEnvironment())
    rest = Rest()
    janitor = Janitor(view, rest, grace_seconds=300, clock=lambda: now[0])  # type: ignore[arg-type]
    body = resource_slice("n1", [gpu(0, H100)])
    body["metadata"].update(uid="u1", resourceVersion="1")
    view.on_slice("ADDED", body)
    assert janitor.sweep() == []  # the Nodes' first LIST is not in: n1 is not missing, just not seen yet
    now[0] += 301
    assert janitor.sweep() == [] and rest.deleted == []
    for feed in ("slices", "claims", "nodes"):
        view.mark_synced(feed)
    view.on_node("ADDED", node("n1"))
    assert janitor.sweep() == []
    view.on_node("DELETED", node("n1"))
    assert janitor.sweep() == []  # first seen missing now
    now[0] += 299
    assert janitor.sweep() == []
    rest.nodes.add("n1")  # the view lags: the Node is back; GET confirms, nothing is deleted
    now[0] += 2
    assert janitor.sweep() == [] and rest.deleted == []
    rest.nodes.clear()
    assert janitor.sweep() == []  # missing again: the grace period starts over
    now[0] += 301
    assert janitor.sweep() == [f"n1-{DRIVER}"]
