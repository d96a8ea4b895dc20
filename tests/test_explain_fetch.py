"""`dra-driver explain --node` and `dra-driver status --node`: read only the slices that can matter to the nodes
asked about (field-selected LISTs, then whole pools), and get from them exactly what the whole cluster gives."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from dra_driver.allocation.model import Node
from dra_driver.allocation.pools import gather_pools, pools_to_complete
from dra_driver.commands.explain import fetch_slices
from dra_driver.commands.listing import field_value
from dra_driver.commands.status import driver_slices
from dra_driver.commands.statusview import build_status
from dra_driver.k8s.client import KubeRest
from dra_sandbox.apiserver import ApiServer

SLICES_PATH = "/apis/resource.k8s.io/v1/resourceslices"
DRIVER = "gpu.nvidia.com"


def _slice(name: str, pool: str, *, node: str | None = None, count: int = 1, generation: int = 1,
           **spec: Any) -> dict[str, Any]:
    body: dict[str, Any] = {
        "driver": DRIVER,
        "pool": {"name": pool, "generation": generation, "resourceSliceCount": count},
        "devices": [{"name": f"{name}-d0", "attributes": {"type": {"string": "gpu"}}}],
        **spec,
    }
    if node is not None:
        body["nodeName"] = node
    return {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceSlice", "metadata": {"name": name}, "spec": body}


SLICES = [
    _slice("a-0", "a", node="node-a", count=2),
    _slice("a-1", "a", node="node-b", count=2),  # pool a spans two nodes
    _slice("b-0", "b", node="node-b", generation=2),
    _slice("b-old", "b", node="node-b"),  # an older generation of pool b
    _slice("c-0", "c", node="node-c", count=3),  # incomplete everywhere
    _slice("all", "shared", allNodes=True),
    _slice(
        "sel",
        "picked",
        nodeSelector={
            "nodeSelectorTerms": [{"matchExpressions": [{"key": "kind", "operator": "In", "values": ["h100"]}]}]
        },
    ),
]
NODES = [Node("node-a", {"kind": "h100"}), Node("node-b", {}), Node("node-c", {}), Node("node-z", {})]


@pytest.fixture(scope="module")
def server() -> Iterator[ApiServer]:
    # 1.34: the oldest supported server's field-selector rules (spec.pool.name refused, as on every 1.34-1.37).
    with ApiServer(garbage_collection=False, kube_version="1.34.0") as srv, srv.rest() as client:
        for obj in SLICES:
            client.request("POST", SLICES_PATH, body=obj)
        yield srv


@pytest.fixture(scope="module")
def rest(server: ApiServer) -> KubeRest:
    return server.rest()


def _names(slices: list[dict[str, Any]]) -> list[str]:
    return [s["metadata"]["name"] for s in slices]


@pytest.mark.parametrize("node", NODES, ids=lambda n: n.name)
def test_the_node_scoped_fetch_gathers_what_the_whole_cluster_gives(rest: KubeRest, node: Node) -> None:
    everything = fetch_slices(rest, None)
    assert sorted(_names(everything)) == sorted(_names(SLICES))
    scoped = fetch_slices(rest, [node.name])
    for partitionable in (True, False):
        assert gather_pools(scoped, node, partitionable=partitionable) == gather_pools(
            everything, node, partitionable=partitionable
        )


def test_only_the_slices_that_can_matter_are_read(rest: KubeRest) -> None:
    assert _names(fetch_slices(rest, ["node-z"])) == ["all", "sel"]
    # node-a's slice of pool a says the pool has two slices: the other one (on node-b) is fetched too.
    assert _names(fetch_slices(rest, ["node-a"])) == ["a-0", "a-1", "all", "sel"]
    assert _names(fetch_slices(rest, ["node-b"])) == ["a-0", "a-1", "all", "b-0", "b-old", "sel"]
    assert _names(fetch_slices(rest, ["node-c", "node-a"])) == ["a-0", "a-1", "all", "c-0", "sel"]
    assert _names(fetch_slices(rest, ["no-such-node"])) == ["all", "sel"]


def test_pools_to_complete() -> None:
    assert pools_to_complete(SLICES) == [(DRIVER, "c")]
    assert pools_to_complete([SLICES[0]]) == [(DRIVER, "a")]
    assert pools_to_complete([SLICES[2]]) == []
    # Only the newest generation counts: one slice of generation 2 out of 2 is incomplete.
    newer = _slice("a-2", "a", node="node-a", count=2, generation=2)
    assert pools_to_complete([*SLICES[:2], newer]) == [(DRIVER, "a")]
    # Counts that disagree or cannot be read: fetch the whole pool and let the parser judge it.
    assert pools_to_complete([_slice("x-0", "x", count=1), _slice("x-1", "x", count=2)]) == [(DRIVER, "x")]
    unreadable = _slice("y-0", "y")
    unreadable["spec"]["pool"]["generation"] = "1"
    assert pools_to_complete([unreadable]) == [(DRIVER, "y")]


def test_field_values_are_escaped() -> None:
    assert field_value("plain.name") == "plain.name"
    assert field_value("a,b=c\\d") == "a\\,b\\=c\\\\d"


@pytest.mark.parametrize("node", ["node-a", "node-b", "node-c", "shared", "node-z"])
def test_status_for_some_nodes_reads_their_slices_and_shows_what_the_whole_fleet_shows(
    rest: KubeRest, node: str
) -> None:
    everything = driver_slices(rest, DRIVER, [])
    assert len(everything) == len(SLICES)
    scoped = driver_slices(rest, DRIVER, [node])
    assert len(scoped) < len(everything)
    assert build_status(scoped, [], [], driver=DRIVER, nodes=[node]) == build_status(
        everything, [], [], driver=DRIVER, nodes=[node]
    )


def test_status_reads_whole_pools_of_the_nodes_asked_about(rest: KubeRest) -> None:
    assert _names(driver_slices(rest, DRIVER, ["node-b"])) == ["a-0", "a-1", "b-0", "b-old"]
    assert _names(driver_slices(rest, DRIVER, ["shared"])) == ["all"]  # a slice without a node: its pool's name
    assert _names(driver_slices(rest, "other.example.com", ["node-b"])) == []


def _slice_lists(server: ApiServer) -> int:
    records = server.request_log.records()
    assert all(r.code == 200 for r in records), [r for r in records if r.code != 200]
    return sum(1 for r in records if r.verb == "list" and r.resource == "resourceslices")


@pytest.mark.parametrize(
    ("nodes", "explain_lists", "status_lists"),
    [
        (["node-z"], 2, 2),  # nothing incomplete: the node's slices and those naming no node
        (["node-a"], 3, 3),  # pool a spans node-b: its driver's slices once more
        (["node-c", "node-a"], 4, 4),  # two incomplete pools of one driver: still one more LIST
    ],
)
def test_request_counts_stay_small(server: ApiServer, rest: KubeRest, nodes: list[str], explain_lists: int,
                                   status_lists: int) -> None:
    """One LIST per node, one for the slices naming no node, one per driver with an incomplete pool: not one per
    pool (docs/benchmarks.md), and none a 1.34 server refuses."""
    server.request_log.reset()
    fetch_slices(rest, nodes)
    assert _slice_lists(server) == explain_lists
    server.request_log.reset()
    driver_slices(rest, DRIVER, nodes)
    assert _slice_lists(server) == status_lists
