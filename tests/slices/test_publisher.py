"""The ResourceSlice publisher against the sandbox API server (real HTTP, real client)."""

from __future__ import annotations

import copy
import random
from collections.abc import Iterator
from typing import Any

import pytest

from dra_driver.inventory.catalog import MigPolicy, catalog
from dra_driver.inventory.discover import discover
from dra_driver.k8s.client import ApiError, KubeRest
from dra_driver.nvml.factory import open_backend
from dra_driver.slices.builder import SliceSettings, build_slices
from dra_driver.slices.publisher import SLICES_PATH, SlicePublisher, wait_until
from dra_sandbox.apiserver import ApiServer

DRIVER = "gpu.dra.dev"
NODE = "node-a"


class Desired:
    """The pool's desired slices; tests swap the device set to simulate a new inventory."""

    def __init__(self, preset: str = "dgx-h100", policy: MigPolicy = MigPolicy.STATIC) -> None:
        backend = open_backend(f"fake:{preset}")
        backend.init()
        self.inventory = discover(backend)
        self.devices = catalog(self.inventory, policy)
        self.settings = SliceSettings(DRIVER, NODE)

    def __call__(self, generation: int) -> list[dict[str, Any]]:
        return build_slices(self.inventory.system, self.devices, self.settings, generation)


@pytest.fixture
def server() -> Iterator[ApiServer]:
    with ApiServer() as srv:
        rest = KubeRest(srv.api_client())
        rest.request("POST", "/api/v1/nodes", body={"apiVersion": "v1", "kind": "Node", "metadata": {"name": NODE}})
        yield srv


def _rest(srv: ApiServer) -> KubeRest:
    return KubeRest(srv.api_client())


def _slices(rest: KubeRest) -> list[dict[str, Any]]:
    return list(rest.request("GET", SLICES_PATH).get("items") or [])


def _writes(srv: ApiServer) -> int:
    return sum(
        srv.request_log.count(verb=v, resource="resourceslices") for v in ("create", "update", "patch", "delete")
    )


def _publisher(srv: ApiServer, desired: Desired) -> SlicePublisher:
    return SlicePublisher(_rest(srv), driver_name=DRIVER, node_name=NODE, desired=desired, rng=random.Random(1))


def test_first_publish_then_zero_writes(server: ApiServer) -> None:
    desired = Desired(policy=MigPolicy.DYNAMIC)
    pub = _publisher(server, desired)
    first = pub.reconcile()
    slices = _slices(_rest(server))
    assert first.created == len(slices) == 5 and first.generation == 1
    node_uid = _rest(server).get(f"/api/v1/nodes/{NODE}")["metadata"]["uid"]  # type: ignore[index]
    for s in slices:
        assert s["metadata"]["ownerReferences"] == [
            {"apiVersion": "v1", "kind": "Node", "name": NODE, "uid": node_uid, "controller": True}
        ]
    server.request_log.reset()
    for _ in range(5):
        assert pub.reconcile().writes == 0
    assert _writes(server) == 0
    # A restarted plugin (no memory) sees the same content: still zero writes.
    assert _publisher(server, desired).reconcile().writes == 0
    assert _writes(server) == 0


def test_changed_inventory_is_one_generation_bump(server: ApiServer) -> None:
    desired = Desired()
    pub = _publisher(server, desired)
    pub.reconcile()
    desired.devices = {k: v for k, v in desired.devices.items() if k != "gpu-7"}
    result = pub.reconcile()
    slices = _slices(_rest(server))
    assert result.generation == 2
    assert {s["spec"]["pool"]["generation"] for s in slices} == {2}
    names = [d["name"] for s in slices for d in s["spec"]["devices"]]
    assert "gpu-7" not in names and len(names) == 7


def test_deleted_and_edited_slices_are_repaired_at_the_same_generation(server: ApiServer) -> None:
    desired = Desired(policy=MigPolicy.DYNAMIC)
    pub = _publisher(server, desired)
    pub.reconcile()
    rest = _rest(server)
    victim, edited = _slices(rest)[1], copy.deepcopy(_slices(rest)[2])
    rest.request("DELETE", f"{SLICES_PATH}/{victim['metadata']['name']}")
    edited["spec"]["devices"] = edited["spec"]["devices"][:3]
    rest.request("PUT", f"{SLICES_PATH}/{edited['metadata']['name']}", body=edited)
    server.request_log.reset()
    result = pub.reconcile()
    assert (result.created, result.updated, result.deleted, result.generation) == (1, 1, 0, 1)
    assert _content(_slices(rest)) == _content(desired(1))


def _content(slices: list[dict[str, Any]]) -> list[tuple[str, Any]]:
    return sorted((s["metadata"]["name"], s["spec"]) for s in slices)


def test_leftover_slices_of_the_pool_are_deleted(server: ApiServer) -> None:
    rest = _rest(server)
    stray = Desired()(9)[0]
    stray["metadata"]["name"] = "node-a-stray"
    rest.request("POST", SLICES_PATH, body=stray)
    other_node = copy.deepcopy(stray)
    other_node["metadata"]["name"] = "node-b-slice"
    other_node["spec"]["nodeName"] = "node-b"
    other_node["spec"]["pool"]["name"] = "node-b"
    rest.request("POST", SLICES_PATH, body=other_node)
    result = _publisher(server, Desired()).reconcile()
    names = {s["metadata"]["name"] for s in _slices(rest)}
    assert "node-a-stray" not in names and "node-b-slice" in names
    assert result.generation == 10 and result.deleted == 1


def test_injected_errors_and_conflicts_converge(server: ApiServer) -> None:
    desired = Desired(policy=MigPolicy.DYNAMIC)
    pub = _publisher(server, desired)
    server.faults.inject(verb="create", resource="resourceslices", status=500, count=2)
    with pytest.raises(ApiError):
        pub.reconcile()
    server.faults.inject(verb="create", resource="resourceslices", status=409, count=1)
    pub.start()
    try:
        assert wait_until(lambda: len(_slices(_rest(server))) == 5 and pub.last_result is not None, timeout=20)
        desired.devices = {k: v for k, v in desired.devices.items() if not k.startswith("gpu-7")}
        server.faults.inject(verb="update", resource="resourceslices", status=500, count=3)
        pub.trigger()
        assert wait_until(
            lambda: (
                {s["spec"]["pool"]["generation"] for s in _slices(_rest(server))} == {3}
                or {s["spec"]["pool"]["generation"] for s in _slices(_rest(server))} == {2}
            ),
            timeout=20,
        )
        assert wait_until(lambda: _content(_slices(_rest(server))) == _content(desired(_gen(server))), timeout=20)
    finally:
        pub.stop()


def _gen(srv: ApiServer) -> int:
    return max(s["spec"]["pool"]["generation"] for s in _slices(_rest(srv)))


def test_watch_restores_a_deleted_slice_within_seconds(server: ApiServer) -> None:
    desired = Desired()
    pub = _publisher(server, desired)
    pub.start()
    try:
        rest = _rest(server)
        assert wait_until(lambda: len(_slices(rest)) == 1, timeout=10)
        name = _slices(rest)[0]["metadata"]["name"]
        rest.request("DELETE", f"{SLICES_PATH}/{name}")
        assert wait_until(lambda: [s["metadata"]["name"] for s in _slices(rest)] == [name], timeout=5)
    finally:
        pub.stop()


def test_running_loop_makes_zero_writes_over_many_reconciles(server: ApiServer) -> None:
    """The loop as it runs in the plugin (here resyncing every 20 ms): after the first publish, 25 more
    reconciles make no write at all, as the API server's request log shows."""
    pub = SlicePublisher(
        _rest(server), driver_name=DRIVER, node_name=NODE, desired=Desired(policy=MigPolicy.DYNAMIC), resync_seconds=0.02
    )
    pub.start()
    try:
        assert pub.wait_for_reconciles(1, timeout=20)
        server.request_log.reset()
        first = pub.reconcile_count
        assert pub.wait_for_reconciles(first + 25, timeout=30)
        assert _writes(server) == 0
        assert server.request_log.count(verb="list", resource="resourceslices") >= 25
    finally:
        pub.stop()
