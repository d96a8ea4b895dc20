"""The sandbox scheduler's pass gives the same plan however its slices come: raw, a fresh (cold) SliceIndex, an
index a previous pass already parsed (warm), or a new index taking over a previous one's parses (a long-lived
scheduler's next pass); and it leaves the garbage collector as it found it."""

from __future__ import annotations

import gc
import json
from typing import Any

import pytest

from dra_driver.allocation import SliceIndex
from dra_driver.cel.environment import DraCelEnvironment
from dra_driver.defaults import DRIVER_NAME
from dra_driver.inventory.catalog import MigOffering, catalog
from dra_driver.inventory.discover import discover
from dra_driver.nvml.factory import open_backend
from dra_driver.slices.builder import SliceSettings, build_slices
from dra_sandbox.deviceclasses import device_classes
from dra_sandbox.kubelet.nodestatus import ready_node
from dra_sandbox.scheduler import PodPlan, plan_pod

PRESETS = ("dgx-a100", "a30x4", "l4x2", "hgx-h200")  # the last node is the only H200 one


Fleet = tuple[list[dict[str, Any]], list[dict[str, Any]]]  # (nodes, slices)


@pytest.fixture(scope="module")
def fleet() -> Fleet:
    nodes: list[dict[str, Any]] = []
    slices: list[dict[str, Any]] = []
    for i, preset in enumerate(PRESETS):
        backend = open_backend(f"fake:{preset}")
        backend.init()
        inv = discover(backend)
        name = f"node-{i}"
        nodes.append(ready_node(name, {"preset": preset}))
        built = build_slices(inv.system, catalog(inv, MigOffering.DYNAMIC), SliceSettings(DRIVER_NAME, name), 1)
        for s in json.loads(json.dumps(built)):
            s["metadata"] = {**s["metadata"], "uid": f"uid-{len(slices)}", "resourceVersion": str(100 + len(slices))}
            slices.append(s)
    return nodes, slices


def _claim(expression: str, count: int = 1) -> dict[str, Any]:
    return {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
            "metadata": {"name": "c", "namespace": "default", "uid": "claim-uid"},
            "spec": {"devices": {"requests": [{"name": "gpu", "exactly": {
                "deviceClassName": DRIVER_NAME, "count": count, "selectors": [{"cel": {"expression": expression}}]}}]}}}


CLAIMS = {
    "fits-last-only": _claim(f"device.attributes['{DRIVER_NAME}'].productName == 'NVIDIA H200'"),
    "fits-nowhere": _claim(f"device.attributes['{DRIVER_NAME}'].productName == 'NVIDIA B200'"),
    "fits-first": _claim("true"),
    "too-many": _claim("true", count=64),
}


@pytest.mark.parametrize("claim", list(CLAIMS))
def test_cold_warm_and_next_pass_agree(fleet: Fleet, claim: str) -> None:
    nodes, slices = fleet
    cel = DraCelEnvironment()
    pod = {"metadata": {"name": "p", "namespace": "default", "uid": "u"}, "spec": {}}

    def plan(source: list[dict[str, Any]] | SliceIndex) -> PodPlan:
        return plan_pod(pod, [CLAIMS[claim]], nodes=nodes, classes=device_classes(DRIVER_NAME), slices=source,
                        allocated_claims=[], namespace_labels={}, cel=cel)

    raw = plan(slices)
    cold_index = SliceIndex(slices)
    cold = plan(cold_index)
    warm = plan(cold_index)  # every slice the first pass needed is parsed already
    relisted = json.loads(json.dumps(slices))  # a new LIST: equal content, new objects, same uid/resourceVersion
    following = SliceIndex(relisted, previous=cold_index)
    taken_over = following.parsed_count
    next_pass = plan(following)
    assert raw == cold == warm == next_pass
    assert taken_over == cold_index.parsed_count > 0  # the next pass really reused the first one's parses
    if claim == "fits-last-only":
        assert cold.node == "node-3"
    if claim in ("fits-nowhere", "too-many"):
        assert cold.node is None and cold.explanation.startswith(f"0/{len(nodes)} nodes are available")


def _set_collector(enabled: bool) -> None:
    if enabled:
        gc.enable()
    else:
        gc.disable()


def test_a_pass_leaves_the_collector_as_it_found_it(fleet: Fleet) -> None:
    nodes, slices = fleet
    pod = {"metadata": {"name": "p", "namespace": "default", "uid": "u"}, "spec": {}}
    cel = DraCelEnvironment()
    was = gc.isenabled()
    try:
        for enabled in (True, False):
            _set_collector(enabled)
            plan_pod(pod, [CLAIMS["fits-first"]], nodes=nodes, classes=device_classes(DRIVER_NAME), slices=slices,
                     allocated_claims=[], namespace_labels={}, cel=cel)
            assert gc.isenabled() is enabled
    finally:
        _set_collector(was)


@pytest.mark.parametrize("claim", list(CLAIMS))
def test_the_sieve_changes_no_plan_and_no_message_and_parses_less(fleet: Fleet, claim: str) -> None:
    """The pass with the pool sieve (the default) and without it agree on the node, the allocation and, when no node
    fits, the message (the sieved pass is redone in full then); where the sieve can judge, it parses fewer slices."""
    nodes, slices = fleet
    cel = DraCelEnvironment()
    pod = {"metadata": {"name": "p", "namespace": "default", "uid": "u"}, "spec": {}}

    def plan(index: SliceIndex, sieve: bool) -> PodPlan:
        return plan_pod(pod, [CLAIMS[claim]], nodes=nodes, classes=device_classes(DRIVER_NAME), slices=index,
                        allocated_claims=[], namespace_labels={}, cel=cel, sieve=sieve)

    sieved_index, full_index = SliceIndex(slices), SliceIndex(slices)
    sieved, full = plan(sieved_index, True), plan(full_index, False)
    assert sieved == full
    if claim == "fits-last-only":
        # Only the H200 node's pools were parsed: the other nodes' pools hold no H200 and were judged raw.
        assert sieved.node == "node-3" and 0 < sieved_index.parsed_count < full_index.parsed_count
        assert {sieved_index.raw(i)["spec"]["nodeName"] for i in range(len(slices)) if i in sieved_index._parsed} == {
            "node-3"}
    if claim == "fits-nowhere":
        assert sieved.node is None and sieved.explanation == full.explanation  # from the full pass, redone


def test_a_sieved_view_leaves_out_whole_pools_and_shares_the_parses(fleet: Fleet) -> None:
    _, slices = fleet
    index = SliceIndex(slices)
    view = index.sieved(lambda raw: raw["spec"]["nodeName"] == "node-1")
    assert index.relevant("node-0") and view.relevant("node-0") == [] and view.left_out == 1
    assert view.relevant("node-1") == index.relevant("node-1") and view.left_out == 1  # judged once per pool
    assert index.left_out == 0 and index.relevant("node-0")  # the index itself is unchanged
    first = view.relevant("node-1")[0]
    parsed = view.parsed(first)
    assert index.parsed(first) is parsed and index.parsed_count == view.parsed_count == 1  # one parse, shared
