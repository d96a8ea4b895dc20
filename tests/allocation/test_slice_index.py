"""SliceIndex: one parse per slice across many nodes, only for pools that may touch the node asked about."""

from __future__ import annotations

from typing import Any

from dra_driver.allocation.model import Node
from dra_driver.allocation.pools import SliceIndex, gather_pools


def _slice(name: str, pool: str, *, node: Any = None, count: int = 1, **spec: Any) -> dict[str, Any]:
    body: dict[str, Any] = {
        "driver": "gpu.nvidia.com",
        "pool": {"name": pool, "generation": 1, "resourceSliceCount": count},
        "devices": [{"name": f"{name}-d0", "attributes": {"type": {"string": "gpu"}}}],
        **spec,
    }
    if node is not None:
        body["nodeName"] = node
    return {"metadata": {"name": name}, "spec": body}


SLICES = [
    _slice("a-0", "a", node="node-a", count=2),
    _slice("b-0", "b", node="node-b"),
    _slice("a-1", "a", node="node-b", count=2),  # pool a spans two nodes
    _slice("all", "shared", allNodes=True),
    _slice(
        "sel",
        "picked",
        nodeSelector={
            "nodeSelectorTerms": [{"matchExpressions": [{"key": "kind", "operator": "In", "values": ["h100"]}]}]
        },
    ),
    _slice("bad-c", "c", node="node-c", devices="not a list"),  # malformed, on node-c only
    _slice("bad-any", "d", allNodes=True, devices=[{"name": ""}]),  # malformed, not bound to one node
]
NODES = [Node("node-a", {"kind": "h100"}), Node("node-b", {}), Node("node-c", {}), Node("node-z", {})]


def test_shared_index_gives_what_a_fresh_gather_gives_on_every_node() -> None:
    index = SliceIndex(SLICES)
    for partitionable in (True, False):
        for node in NODES:
            assert gather_pools(index, node, partitionable=partitionable) == gather_pools(
                SLICES, node, partitionable=partitionable
            ), node


def test_pools_naming_only_other_nodes_are_not_parsed() -> None:
    index = SliceIndex(SLICES)
    pools = gather_pools(index, Node("node-z", {}), partitionable=True)
    assert [p.name for p in pools.pools] == ["shared"]
    assert [p.pool for p in pools.problems] == ["d"]
    parsed = {SLICES[i]["metadata"]["name"] for i in index._parsed}
    assert parsed == {"all", "sel", "bad-any"}
    # node-a's pool needs its slice on node-b too (completeness, names, counters); each is parsed once.
    pools = gather_pools(index, Node("node-a", {"kind": "h100"}), partitionable=True)
    assert [p.name for p in pools.pools] == ["a", "shared", "picked"]
    assert [c.id.device for c in pools.candidates] == ["a-0-d0", "all-d0", "sel-d0"]
    before = dict(index._parsed)
    gather_pools(index, Node("node-b", {}), partitionable=True)
    assert all(index._parsed[i] is obj for i, obj in before.items())


def test_a_malformed_slice_invalidates_its_pool_only_on_its_node() -> None:
    index = SliceIndex(SLICES)
    on_c = gather_pools(index, Node("node-c", {}), partitionable=True)
    assert {p.pool for p in on_c.problems} == {"c", "d"}
    on_b = gather_pools(index, Node("node-b", {}), partitionable=True)
    assert {p.pool for p in on_b.problems} == {"d"}


def _versioned(slices: list[dict[str, Any]], version: str = "1") -> list[dict[str, Any]]:
    return [{**s, "metadata": {**s["metadata"], "uid": f"uid-{s['metadata']['name']}", "resourceVersion": version}}
            for s in slices]


def test_an_index_takes_over_the_parses_of_unchanged_slices_from_the_previous_one() -> None:
    first = _versioned(SLICES)
    old = SliceIndex(first)
    for node in NODES:
        gather_pools(old, node, partitionable=True)
    parsed = {first[i]["metadata"]["name"]: obj for i, obj in old._parsed.items()}
    # a-0 changes (new content, new resourceVersion); b-0 is replaced by an object with another uid.
    changed = dict(first[0], metadata={**first[0]["metadata"], "resourceVersion": "2"},
                   spec={**first[0]["spec"], "devices": [{"name": "a-0-new"}]})
    replaced = dict(first[1], metadata={**first[1]["metadata"], "uid": "uid-other"})
    second = [changed, replaced, *first[2:]]
    new = SliceIndex(second, previous=old)
    assert new.parsed_count == len(first) - 2
    for i, raw in enumerate(second[2:], start=2):
        assert new._parsed[i] is parsed[raw["metadata"]["name"]]  # the same object: not parsed again
    for node in NODES:
        assert gather_pools(new, node, partitionable=True) == gather_pools(second, node, partitionable=True), node
    assert "a-0-new" in {c.id.device for c in gather_pools(new, NODES[0], partitionable=True).candidates}


def test_slices_without_uid_or_resource_version_are_always_parsed_again() -> None:
    old = SliceIndex(SLICES)
    for node in NODES:
        gather_pools(old, node, partitionable=True)
    assert old.parsed_count == len(SLICES)
    assert SliceIndex(SLICES, previous=old).parsed_count == 0


def test_an_allocated_claim_is_parsed_once_per_pass_and_a_rebuilt_one_anew() -> None:
    from dra_driver.allocation.pools import SliceIndex

    result = {"request": "r", "driver": "d.dev", "pool": "p", "device": "gpu-0"}
    claim = {"metadata": {"name": "c", "uid": "u"}, "status": {"allocation": {"devices": {"results": [result]}}}}
    index = SliceIndex([])
    first = index.allocated_claim(claim)
    assert index.allocated_claim(claim) is first
    moved = {**claim, "status": {"allocation": {"devices": {"results": [{**result, "device": "gpu-1"}]}}}}
    assert [r.device for r in index.allocated_claim(moved).results] == ["gpu-1"]
