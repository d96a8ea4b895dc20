"""Pools pruned before parsing (`allocation.prune`) never change a verdict: on varied fleets, explain with pruning
fits on exactly the nodes, with exactly the devices, that explain over every device does; what prune cannot
judge exactly keeps everything; and a node with fewer devices than a request asks for is answered from the count
alone."""

from __future__ import annotations

import json
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dra_driver.allocation.prune import PoolSieve, claim_reach
from dra_driver.cel.environment import DraCelEnvironment
from dra_driver.commands.explain import explain_claim

DRIVER = "gpu.dra.dev"
OTHER = "other.example.com"
PRODUCTS = ("H100", "A100", "L4")
CLASSES: list[dict[str, Any]] = [
    {"metadata": {"name": "gpu"}, "spec": {"selectors": [{"cel": {"expression":
        f"device.driver == '{DRIVER}' && device.attributes['{DRIVER}'].type == 'gpu'"}}]}},
    {"metadata": {"name": "any"}, "spec": {}},
    {"metadata": {"name": "mig"}, "spec": {"selectors": [{"cel": {"expression":
        f"device.attributes['{DRIVER}'].type == 'mig'"}}]}},
]
# Selectors of the request: equality, a version comparison, a missing attribute (a runtime error where the device
# lacks it), a qualified name, an attribute of another domain.
SELECTORS = (
    f"device.attributes['{DRIVER}'].productName == 'H100'",
    f"device.attributes['{DRIVER}'].productName != 'L4'",
    f"device.attributes['{DRIVER}'].driverVersion.compareTo(semver('2.0.0')) >= 0",
    f"device.attributes['{DRIVER}'].memory > 40",
    f"'extra' in device.attributes['{DRIVER}'] && device.attributes['{DRIVER}'].extra",
    "device.attributes['example.com'].zone == 'a'",
    f"device.driver == '{OTHER}'",
)


@st.composite
def devices(draw: st.DrawFn, prefix: str) -> list[dict[str, Any]]:
    out = []
    for i in range(draw(st.integers(0, 4))):
        attributes: dict[str, Any] = {
            "type": {"string": draw(st.sampled_from(("gpu", "mig")))},
            "productName": {"string": draw(st.sampled_from(PRODUCTS))},
            "memory": {"int": draw(st.sampled_from((24, 40, 80)))},
        }
        if draw(st.booleans()):
            attributes[f"{DRIVER}/driverVersion"] = {"version": draw(st.sampled_from(("1.0.0", "2.1.0")))}
        if draw(st.booleans()):
            attributes["extra"] = {"bool": draw(st.booleans())}
        if draw(st.booleans()):
            attributes["example.com/zone"] = {"string": draw(st.sampled_from(("a", "b")))}
        if draw(st.integers(0, 9)) == 0:
            attributes["productName"] = {"strings": ["H100"]}  # a list value: not judged, kept
        out.append({"name": f"{prefix}-{i}", "attributes": attributes})
    return out


@st.composite
def fleets(draw: st.DrawFn) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    nodes, slices = [], []
    for n in range(draw(st.integers(1, 4))):
        node = f"node-{n}"
        nodes.append({"metadata": {"name": node, "labels": {"zone": "a" if n % 2 else "b"}}})
        driver = draw(st.sampled_from((DRIVER, DRIVER, OTHER)))
        count = draw(st.integers(1, 2))
        for k in range(count - draw(st.integers(0, 1) if count > 1 else st.just(0))):  # some pools incomplete
            slices.append({"metadata": {"name": f"{node}-{k}"}, "spec": {
                "driver": driver, "nodeName": node,
                "pool": {"name": node, "generation": 1, "resourceSliceCount": count},
                "devices": draw(devices(f"{node}-{k}"))}})
    if draw(st.booleans()):
        slices.append({"metadata": {"name": "shared"}, "spec": {
            "driver": DRIVER, "allNodes": True, "pool": {"name": "shared", "generation": 1, "resourceSliceCount": 1},
            "devices": draw(devices("shared"))}})
    return nodes, slices


@st.composite
def claims(draw: st.DrawFn) -> dict[str, Any]:
    requests = []
    for r in range(draw(st.integers(1, 2))):
        exactly: dict[str, Any] = {"deviceClassName": draw(st.sampled_from(("gpu", "any", "mig"))),
                                   "count": draw(st.integers(1, 3))}
        chosen = draw(st.lists(st.sampled_from(SELECTORS), max_size=2, unique=True))
        if chosen:
            exactly["selectors"] = [{"cel": {"expression": e}} for e in chosen]
        requests.append({"name": f"r{r}", "exactly": exactly})
    devices_spec: dict[str, Any] = {"requests": requests}
    if len(requests) > 1 and draw(st.booleans()):
        devices_spec["constraints"] = [{"matchAttribute": f"{DRIVER}/productName"}]
    return {"metadata": {"name": "c", "namespace": "default"}, "spec": {"devices": devices_spec}}


def _allocations(text: str) -> list[str]:
    """The sections of the nodes the claim fits on (their devices), as printed."""
    return [s for s in text.split("\n\n") if " can be allocated on node " in s]


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(fleets(), claims())
def test_a_pruned_pool_never_changes_a_verdict(fleet: tuple[list[dict[str, Any]], list[dict[str, Any]]],
                                               claim: dict[str, Any]) -> None:
    nodes, slices = fleet
    # The light decode of encoded slices sieves exactly as the decoded ones.
    reach = claim_reach(claim, CLASSES, cel=DraCelEnvironment())
    decoded, encoded = PoolSieve(reach), PoolSieve(reach)
    for raw in slices:
        decoded.add(raw)
        encoded.add_encoded(json.dumps(raw).encode())
    assert encoded.result() == decoded.result()
    full_fits, full_text = explain_claim(claim, nodes=nodes, classes=CLASSES, slices=slices, claims=[],
                                         namespace_labels={}, prune=False)
    fits, text = explain_claim(claim, nodes=nodes, classes=CLASSES, slices=slices, claims=[], namespace_labels={})
    assert fits == full_fits
    assert _allocations(text) == _allocations(full_text)
    # Each node's summary line says the same thing unless its pools were left out.
    if "not looked at" not in text and "not parsed" not in text:
        assert text == full_text


def test_pools_no_request_can_reach_are_left_out_before_parsing() -> None:
    cel = DraCelEnvironment()
    claim = {"metadata": {"name": "c", "namespace": "default"}, "spec": {"devices": {"requests": [
        {"name": "r", "exactly": {"deviceClassName": "gpu", "selectors": [{"cel": {"expression": SELECTORS[0]}}]}}]}}}
    h100 = [{"name": "d", "attributes": {"type": {"string": "gpu"}, "productName": {"string": "H100"}}}]
    l4 = [{"name": "d", "attributes": {"type": {"string": "gpu"}, "productName": {"string": "L4"}}}]
    mig = [{"name": "m", "attributes": {"type": {"string": "mig"}, "productName": {"string": "H100"}}}]
    broken = [{"name": "x", "attributes": "not a map"}]

    def pool(name: str, devs: list[dict[str, Any]] | None, count: int = 1) -> dict[str, Any]:
        spec: dict[str, Any] = {"driver": DRIVER, "nodeName": name.split(".")[0],
                                "pool": {"name": name.split(".")[0], "generation": 1, "resourceSliceCount": count}}
        if devs is not None:
            spec["devices"] = devs
        return {"metadata": {"name": name}, "spec": spec}

    sieve = PoolSieve(claim_reach(claim, CLASSES, cel=cel))
    for raw in (pool("a.0", None, 2), pool("a.1", h100, 2),  # counters-only slice, kept with its pool
                pool("b.0", l4), pool("c.0", mig), pool("d.0", broken)):
        sieve.add(raw)
    kept, pruned = sieve.result()
    assert [s["metadata"]["name"] for s in kept] == ["a.0", "a.1", "d.0"]
    assert (pruned.pools, pruned.slices, pruned.devices) == (2, 2, 2)


def test_what_prune_cannot_judge_exactly_keeps_every_pool() -> None:
    cel = DraCelEnvironment()

    def claim(**exactly: Any) -> dict[str, Any]:
        return {"metadata": {"name": "c", "namespace": "default"},
                "spec": {"devices": {"requests": [{"name": "r", "exactly": {"deviceClassName": "gpu", **exactly}}]}}}

    def cel_selector(expression: str) -> list[dict[str, Any]]:
        return [{"cel": {"expression": expression}}]

    assert claim_reach(claim(), CLASSES, cel=cel) is not None
    assert claim_reach(claim(allocationMode="All"), CLASSES, cel=cel) is None  # pool problems fail it
    assert claim_reach(claim(deviceClassName="missing"), CLASSES, cel=cel) is None
    assert claim_reach(claim(selectors=cel_selector("device.capacity['gpu.dra.dev'].memory.isGreaterThan("
                                                    "quantity('1Gi'))")), CLASSES, cel=cel) is None
    assert claim_reach(claim(selectors=cel_selector("device.attributes['gpu.dra.dev'].size() > 1")), CLASSES,
                       cel=cel) is None
    assert claim_reach(claim(selectors=cel_selector("device.attributes[")), CLASSES, cel=cel) is None


def test_a_pool_whose_devices_make_a_selector_fail_is_kept() -> None:
    """A runtime error aborts the allocation where the search meets the device (as kube-scheduler's allocator):
    pruning that pool would let the node fit on another pool's device."""
    zone = "device.attributes['example.com'].zone == 'a'"
    claim = {"metadata": {"name": "c", "namespace": "default"}, "spec": {"devices": {"requests": [
        {"name": "r", "exactly": {"deviceClassName": "any", "selectors": [{"cel": {"expression": zone}}]}}]}}}
    slices = [
        {"metadata": {"name": "n"}, "spec": {"driver": DRIVER, "nodeName": "node-0",
                                              "pool": {"name": "n", "generation": 1, "resourceSliceCount": 1},
                                              "devices": [{"name": "no-zone", "attributes": {}}]}},
        {"metadata": {"name": "z"}, "spec": {"driver": DRIVER, "allNodes": True,
                                              "pool": {"name": "z", "generation": 1, "resourceSliceCount": 1},
                                              "devices": [{"name": "zoned", "attributes": {
                                                  "example.com/zone": {"string": "a"}}}]}},
    ]
    nodes = [{"metadata": {"name": "node-0"}}]
    full = explain_claim(claim, nodes=nodes, classes=CLASSES, slices=slices, claims=[], namespace_labels={},
                         prune=False)
    pruned = explain_claim(claim, nodes=nodes, classes=CLASSES, slices=slices, claims=[], namespace_labels={})
    assert pruned == full
    assert "CEL runtime error" in full[1] and full[0] == []


def _gpus(node: str, count: int, *, pool: str = "", multiple: bool = False, **spec: Any) -> dict[str, Any]:
    devices = [{"name": f"gpu-{i}", "attributes": {"type": {"string": "gpu"}, "productName": {"string": "H100"}},
                **({"allowMultipleAllocations": True} if multiple else {})} for i in range(count)]
    where = spec or {"nodeName": node}
    return {"metadata": {"name": pool or node}, "spec": {
        "driver": DRIVER, **where, "pool": {"name": pool or node, "generation": 1, "resourceSliceCount": 1},
        "devices": devices}}


def _wanting(count: int) -> dict[str, Any]:
    return {"metadata": {"name": "c", "namespace": "default"}, "spec": {"devices": {"requests": [
        {"name": "r", "exactly": {"deviceClassName": "gpu", "count": count}}]}}}


def _explain_both(claim: dict[str, Any], nodes: list[dict[str, Any]], slices: list[dict[str, Any]]
                  ) -> tuple[tuple[list[str], str], tuple[list[str], str]]:
    full = explain_claim(claim, nodes=nodes, classes=CLASSES, slices=slices, claims=[], namespace_labels={},
                         prune=False)
    sieve = PoolSieve(claim_reach(claim, CLASSES, cel=DraCelEnvironment()))
    for raw in slices:
        sieve.add_encoded(json.dumps(raw).encode())
    kept, pruned = sieve.result()
    sieved = explain_claim(claim, nodes=nodes, classes=CLASSES, slices=kept, claims=[], namespace_labels={},
                           prune=False, pruned_before=pruned)
    return full, sieved


def test_a_node_with_fewer_devices_than_a_request_asks_for_is_answered_before_parsing() -> None:
    nodes = [{"metadata": {"name": "node-a"}}, {"metadata": {"name": "node-b"}}]
    slices = [_gpus("node-a", 2), _gpus("node-b", 3)]
    sieve = PoolSieve(claim_reach(_wanting(3), CLASSES, cel=DraCelEnvironment()))
    for raw in slices:
        sieve.add(raw)
    kept, pruned = sieve.result()
    assert [s["metadata"]["name"] for s in kept] == ["node-b"]  # node-a's pool is never parsed
    assert dict(pruned.short_nodes) == {
        "node-a": "request 'r' cannot be satisfied: needs 3 devices, at most 2 on the node match its selectors"}
    assert (pruned.short_pools, pruned.short_slices, pruned.short_devices) == (1, 1, 2)
    (full_fits, full_text), (fits, text) = _explain_both(_wanting(3), nodes, slices)
    assert fits == full_fits == ["node-b"]
    assert "cannot be allocated on node node-a: request 'r' cannot be satisfied: needs 3 devices, at most 2" in text
    assert "needs 3 devices, 2 available" in full_text  # the full pass says the same, device by device
    assert "not parsed: 2 devices in 1 slices of 1 pools on 1 nodes" in text
    # Asking for one device (or as many as the node has) counts nothing: the pass is the full one.
    assert _explain_both(_wanting(2), nodes, slices)[0] == _explain_both(_wanting(2), nodes, slices)[1]
    assert PoolSieve(claim_reach(_wanting(1), CLASSES, cel=DraCelEnvironment()))._counting is False


def test_what_the_count_cannot_bound_keeps_the_node() -> None:
    """A pool not local to one node counts for every node; a device that allows multiple allocations, any
    number; a firstAvailable request is short only when every subrequest is."""
    nodes = [{"metadata": {"name": "node-a"}}]
    shared = _gpus("", 1, pool="shared", allNodes=True)
    for slices in ([_gpus("node-a", 2), shared], [_gpus("node-a", 2, multiple=True)]):
        (full_fits, _), (fits, text) = _explain_both(_wanting(3), nodes, slices)
        assert "not parsed" not in text and fits == full_fits
    assert _explain_both(_wanting(3), nodes, [_gpus("node-a", 2), shared])[1][0] == ["node-a"]
    first_available = {"metadata": {"name": "c", "namespace": "default"}, "spec": {"devices": {"requests": [
        {"name": "r", "firstAvailable": [{"name": "four", "deviceClassName": "gpu", "count": 4},
                                         {"name": "three", "deviceClassName": "gpu", "count": 3}]}]}}}
    (full_fits, _), (fits, text) = _explain_both(first_available, nodes, [_gpus("node-a", 2)])
    assert fits == full_fits == []
    assert ("request 'r' cannot be satisfied: no subrequest has enough devices ('four' needs 4, at most 2 match; "
            "'three' needs 3, at most 2 match)") in text
    (full_fits, _), (fits, text) = _explain_both(first_available, nodes, [_gpus("node-a", 3)])
    assert fits == full_fits == ["node-a"] and "not parsed" not in text
