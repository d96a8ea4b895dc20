"""Slice targeting, pool generations, selectors, counts, in-use devices, result shape, explain text."""

from typing import Any

import pytest

from dra_driver.allocation import InvalidObjectError, explain_text
from dra_driver.defaults import DRIVER_NAME
from tests.allocation.objects import (
    allocated,
    claim,
    device,
    device_class,
    devices_of,
    exact,
    first_available,
    node,
    reasons,
    resource_slice,
    result,
    run,
    sub,
)
from tests.narrow import present

A = f'device.attributes["{DRIVER_NAME}"]'
TWO = [device("gpu-0", {"model": "H100", "numa": 0}), device("gpu-1", {"model": "A100", "numa": 1})]
LABELED_NODE = node(labels={"nvidia.com/gpu.present": "true", "zone": "a"})


def selector(key: str, value: str) -> dict[str, object]:
    return {"nodeSelectorTerms": [{"matchExpressions": [{"key": key, "operator": "In", "values": [value]}]}]}


@pytest.mark.parametrize(
    ("case", "slice_kwargs", "node_obj", "ok", "node_selector"),
    [
        (
            "nodeName matches",
            {"node": "node-1"},
            node(),
            True,
            {
                "nodeSelectorTerms": [
                    {"matchFields": [{"key": "metadata.name", "operator": "In", "values": ["node-1"]}]}
                ]
            },
        ),
        ("nodeName other node", {"node": "node-2"}, node(), False, None),
        ("nodeSelector matches", {"node_selector": selector("zone", "a")}, LABELED_NODE, True, selector("zone", "a")),
        ("nodeSelector misses", {"node_selector": selector("zone", "b")}, LABELED_NODE, False, None),
        ("allNodes", {"all_nodes": True}, node(), True, None),
    ],
)
def test_slice_node_targeting(
    case: str, slice_kwargs: dict[str, Any], node_obj: dict[str, Any], ok: bool, node_selector: object
) -> None:
    outcome = run(claim([exact("gpu")]), [resource_slice("s", TWO, **slice_kwargs)], node_obj=node_obj)
    assert outcome.ok is ok, case
    if ok:
        assert outcome.allocation is not None
        assert outcome.allocation.get("nodeSelector") == node_selector
    else:
        assert outcome.explanation is not None
        assert outcome.explanation.requests[0].considered == 0


def test_per_device_node_selection() -> None:
    devs = [device("gpu-0", nodeName="node-2"), device("gpu-1", nodeName="node-1"), device("gpu-2", allNodes=True)]
    outcome = run(claim([exact("gpu", count=2)]), [resource_slice("s", devs, per_device=True)])
    assert devices_of(outcome) == [("gpu", "gpu-1"), ("gpu", "gpu-2")]
    # one node-local device pins the allocation to the node
    assert outcome.allocation is not None
    assert outcome.allocation["nodeSelector"]["nodeSelectorTerms"][0]["matchFields"][0]["values"] == ["node-1"]
    # without DRAPartitionableDevices per-device selection is invisible
    gated = run(
        claim([exact("gpu")]), [resource_slice("s", devs, per_device=True)], gates={"DRAPartitionableDevices": False}
    )
    assert not gated.ok


def test_only_the_newest_generation_counts() -> None:
    old = resource_slice("old", [device("gpu-old")], generation=1)
    new = resource_slice("new", [device("gpu-new")], generation=2)
    assert devices_of(run(claim([exact("gpu")]), [old, new])) == [("gpu", "gpu-new")]
    # the old generation's device is gone, so asking for two fails
    failed = run(claim([exact("gpu", count=2)]), [old, new])
    assert not failed.ok
    assert failed.explanation is not None
    assert failed.explanation.requests[0].considered == 1


def test_incomplete_pool_is_skipped_and_said_so() -> None:
    part = resource_slice("s-0", TWO, count=2, generation=4)
    outcome = run(claim([exact("gpu")]), [part])
    assert not outcome.ok
    assert outcome.explanation is not None
    assert outcome.explanation.pool_problems == (
        "pool gpu.dra.dev/pool-1 is incomplete: 1 of 2 slices published at generation 4; "
        "the driver is still updating it",
    )
    assert reasons(outcome) == {outcome.explanation.pool_problems[0]: 2}
    complete = run(claim([exact("gpu")]), [part, resource_slice("s-1", [device("gpu-2")], count=2, generation=4)])
    assert devices_of(complete) == [("gpu", "gpu-0")]


def test_invalid_pool_is_skipped() -> None:
    dup = resource_slice("s", [device("gpu-0"), device("gpu-0")])
    outcome = run(claim([exact("gpu")]), [dup])
    assert outcome.explanation is not None
    assert "device name 'gpu-0' appears more than once" in outcome.explanation.pool_problems[0]
    broken = resource_slice("s", [device("gpu-0", capacity={"memory": "lots"})])
    outcome = run(claim([exact("gpu")]), [broken])
    assert outcome.explanation is not None
    assert "spec.devices[0].capacity.memory.value: invalid quantity 'lots'" in outcome.explanation.pool_problems[0]


@pytest.mark.parametrize(
    ("class_selectors", "request_selectors", "expected"),
    [
        ([], [], "gpu-0"),
        ([f'{A}.model == "A100"'], [], "gpu-1"),
        ([], [f"{A}.numa == 1"], "gpu-1"),
        ([f'{A}.model == "H100"'], [f"{A}.numa == 0"], "gpu-0"),
        ([f'{A}.model == "H100"'], [f"{A}.numa == 1"], None),  # all selectors must hold
        ([f'{A}.model == "B200"'], [], None),
    ],
)
def test_class_and_request_selectors(
    class_selectors: list[str], request_selectors: list[str], expected: str | None
) -> None:
    outcome = run(
        claim([exact("gpu", "gpu-class", selectors=request_selectors)]),
        [resource_slice("s", TWO)],
        classes=[device_class("gpu-class", class_selectors)],
    )
    if expected is None:
        assert not outcome.ok
        found = reasons(outcome)
        assert sum(found.values()) == 2
        assert all("selector #0 is false" in r for r in found)
    else:
        assert devices_of(outcome) == [("gpu", expected)]


def test_selector_false_reasons_name_class_and_request() -> None:
    outcome = run(
        claim([exact("gpu", "gpu-class", selectors=[f"{A}.numa == 1"])]),
        [resource_slice("s", TWO)],
        classes=[device_class("gpu-class", [f'{A}.model == "H100"'])],
    )
    assert reasons(outcome) == {
        f"device class 'gpu-class' selector #0 is false: {A}.model == \"H100\"": 1,
        f"request 'gpu' selector #0 is false: {A}.numa == 1": 1,
    }


def test_cel_runtime_error_aborts_allocation_with_the_error() -> None:
    outcome = run(claim([exact("gpu", selectors=[f'{A}.missing == "x"'])]), [resource_slice("s", TWO)])
    assert not outcome.ok
    assert outcome.explanation is not None
    assert outcome.explanation.summary.startswith(
        "allocation aborted: CEL runtime error in request 'gpu' selector #0 on device gpu.dra.dev/pool-1/gpu-0"
    )
    assert "no such key: missing" in outcome.explanation.summary
    counted = reasons(outcome)
    assert len(counted) == 1
    assert next(iter(counted.values())) == 2  # every device failed with that error


def test_guarded_selector_does_not_abort() -> None:
    expr = f'"missing" in {A} && {A}.missing == "x" || {A}.model == "A100"'
    assert devices_of(run(claim([exact("gpu", selectors=[expr])]), [resource_slice("s", TWO)])) == [("gpu", "gpu-1")]


def test_cel_compile_error_is_a_claim_error() -> None:
    outcome = run(claim([exact("gpu", selectors=["device.driver =="])]), [resource_slice("s", TWO)])
    assert outcome.explanation is not None
    assert "request 'gpu' selector #0" in outcome.explanation.summary
    assert "Syntax error" in outcome.explanation.summary


def test_device_class_not_found() -> None:
    outcome = run(claim([exact("gpu", "no-such-class")]), [resource_slice("s", TWO)])
    assert outcome.explanation is not None
    assert outcome.explanation.summary == "request gpu: device class 'no-such-class' not found"
    assert outcome.explanation.requests[0].problem == "device class 'no-such-class' not found"


@pytest.mark.parametrize(
    ("request_obj", "expected"),
    [
        (exact("gpu"), [("gpu", "gpu-0")]),
        (exact("gpu", count=2), [("gpu", "gpu-0"), ("gpu", "gpu-1")]),
        (exact("gpu", count=3), None),
        (exact("gpu", mode="All"), [("gpu", "gpu-0"), ("gpu", "gpu-1")]),
        (exact("gpu", mode="All", selectors=[f'{A}.model == "A100"']), [("gpu", "gpu-1")]),
        (exact("gpu", mode="All", selectors=[f'{A}.model == "B200"']), None),
    ],
)
def test_exact_count_and_all(request_obj: dict[str, Any], expected: list[tuple[str, str]] | None) -> None:
    outcome = run(claim([request_obj]), [resource_slice("s", TWO)])
    if expected is None:
        assert not outcome.ok
        assert outcome.explanation is not None
        assert outcome.explanation.requests[0].problem is not None
    else:
        assert devices_of(outcome) == expected


def test_all_fails_when_a_matching_device_is_in_use() -> None:
    outcome = run(
        claim([exact("gpu", mode="All")]),
        [resource_slice("s", TWO)],
        allocated_claims=[allocated("other", [result("gpu-1")], namespace="team-a")],
    )
    assert outcome.explanation is not None
    assert outcome.explanation.requests[0].problem == (
        "allocationMode All needs every matching device, but 1 of 2 cannot be allocated"
    )
    assert reasons(outcome) == {"allocated to claim team-a/other": 1}


def test_devices_in_use_are_skipped_and_named() -> None:
    used = [allocated("other", [result("gpu-0")], namespace="team-a")]
    assert devices_of(run(claim([exact("gpu")]), [resource_slice("s", TWO)], allocated_claims=used)) == [
        ("gpu", "gpu-1")
    ]
    full = run(claim([exact("gpu", count=2)]), [resource_slice("s", TWO)], allocated_claims=used)
    assert full.explanation is not None
    assert full.explanation.summary == "request 'gpu' cannot be satisfied: needs 2 devices, 1 available"
    assert reasons(full) == {"allocated to claim team-a/other": 1}
    # the claim's own previous allocation is not counted against it
    mine = [allocated("claim-1", [result("gpu-0")])]
    assert devices_of(run(claim([exact("gpu")]), [resource_slice("s", TWO)], allocated_claims=mine)) == [
        ("gpu", "gpu-0")
    ]


def test_backtracking_across_requests() -> None:
    # a could take gpu-0 or gpu-1; b only gpu-0. Greedy a=gpu-0 fails; the search must move a to gpu-1.
    outcome = run(
        claim([exact("a"), exact("b", selectors=[f'{A}.model == "H100"'])]),
        [resource_slice("s", TWO)],
    )
    assert devices_of(outcome) == [("a", "gpu-1"), ("b", "gpu-0")]


def test_devices_are_tried_in_slice_and_device_order() -> None:
    slices = [
        resource_slice("s-b", [device("gpu-9")], pool="pool-b"),
        resource_slice("s-a", [device("gpu-0")], pool="pool-a"),
    ]
    assert present(run(claim([exact("gpu")]), slices).allocation)["devices"]["results"][0]["pool"] == "pool-b"


def test_requests_compete_for_devices() -> None:
    outcome = run(claim([exact("a"), exact("b"), exact("c")]), [resource_slice("s", TWO)])
    assert outcome.explanation is not None
    assert outcome.explanation.summary.startswith("each request can be satisfied on its own, but not all together")


def test_config_class_then_claim_with_requests_filtered() -> None:
    cls = device_class("gpu-class", config=[{"driver": DRIVER_NAME, "parameters": {"kind": "class"}}])
    other = device_class("other-class")
    claim_cfg: list[dict[str, Any]] = [
        {"requests": ["a"], "opaque": {"driver": DRIVER_NAME, "parameters": {"kind": "for-a"}}},
        {"requests": ["zzz"], "opaque": {"driver": DRIVER_NAME, "parameters": {"kind": "unrelated"}}},
        {"opaque": {"driver": DRIVER_NAME, "parameters": {"kind": "all"}}},
    ]
    outcome = run(
        claim([exact("a", "gpu-class"), exact("b", "other-class")], config=claim_cfg),
        [resource_slice("s", TWO)],
        classes=[cls, other],
    )
    assert outcome.allocation is not None
    assert outcome.allocation["devices"]["config"] == [
        {"source": "FromClass", "requests": ["a"], "opaque": {"driver": DRIVER_NAME, "parameters": {"kind": "class"}}},
        {"source": "FromClaim", "requests": ["a"], "opaque": {"driver": DRIVER_NAME, "parameters": {"kind": "for-a"}}},
        {"source": "FromClaim", "opaque": {"driver": DRIVER_NAME, "parameters": {"kind": "all"}}},
    ]


def test_class_config_listing_every_request_drops_the_list() -> None:
    cls = device_class(DRIVER_NAME, config=[{"driver": DRIVER_NAME, "parameters": {"x": 1}}])
    outcome = run(claim([exact("a"), exact("b")]), [resource_slice("s", TWO)], classes=[cls])
    assert outcome.allocation is not None
    assert outcome.allocation["devices"]["config"] == [
        {"source": "FromClass", "opaque": {"driver": DRIVER_NAME, "parameters": {"x": 1}}}
    ]


def test_claim_config_requests_are_copied_as_written_unless_they_cover_every_request() -> None:
    """Issue 32 (1), against dynamic-resource-allocation v0.37 (allocator_incubating.go, kubernetes commits
    03ab440c and 0ae6c252): a claim config is copied with its `requests` as written, once; its `requests` are
    emptied only when they name every request of the claim (by name or by its chosen subrequest)."""
    opaque = {"driver": DRIVER_NAME, "parameters": {"kind": "MigDeviceConfig"}}
    one = run(claim([exact("gpu")], config=[{"requests": ["gpu"], "opaque": opaque}]), [resource_slice("s", TWO)])
    assert present(one.allocation)["devices"]["config"] == [{"source": "FromClaim", "opaque": opaque}]
    both = run(claim([exact("gpu"), exact("other")], config=[{"requests": ["gpu"], "opaque": opaque}]),
               [resource_slice("s", TWO)])
    assert present(both.allocation)["devices"]["config"] == [
        {"source": "FromClaim", "requests": ["gpu"], "opaque": opaque}]
    named_twice = run(claim([exact("gpu"), exact("other")], config=[{"requests": ["gpu", "other"], "opaque": opaque}]),
                      [resource_slice("s", TWO)])
    assert present(named_twice.allocation)["devices"]["config"] == [{"source": "FromClaim", "opaque": opaque}]
    # Scoped to both subrequests of one request, in a claim with two requests: not widened to the whole claim
    # (upstream case claim-config-scoped-to-subrequests-of-one-request).
    scoped = claim([first_available("req0", [sub("sub0"), sub("sub1")]), exact("req1")],
                   config=[{"requests": ["req0/sub0", "req0/sub1"], "opaque": opaque}])
    assert present(run(scoped, [resource_slice("s", TWO)]).allocation)["devices"]["config"] == [
        {"source": "FromClaim", "requests": ["req0/sub0", "req0/sub1"], "opaque": opaque}]


def test_too_many_devices_for_one_allocation() -> None:
    devs = [device(f"gpu-{i}") for i in range(40)]
    outcome = run(claim([exact("gpu", count=33)]), [resource_slice("s", devs)])
    assert outcome.explanation is not None
    assert "at most 32" in outcome.explanation.summary
    assert len(devices_of(run(claim([exact("gpu", count=32)]), [resource_slice("s", devs)]))) == 32


def test_invalid_claim_names_the_field() -> None:
    bad = claim([exact("gpu")])
    bad["spec"]["devices"]["requests"][0]["exactly"]["count"] = "two"
    with pytest.raises(
        InvalidObjectError, match=r"ResourceClaim default/claim-1: spec.devices.requests\[0\].exactly.count"
    ):
        run(bad, [resource_slice("s", TWO)])
    bad2 = claim([{"name": "gpu"}])
    with pytest.raises(InvalidObjectError, match="set exactly one of 'exactly' and 'firstAvailable'"):
        run(bad2, [])


def test_explain_text_is_readable() -> None:
    used = [allocated("other", [result("gpu-0")], namespace="team-a")]
    outcome = run(
        claim([exact("gpu", count=2, selectors=[f"{A}.numa >= 0"])]), [resource_slice("s", TWO)], allocated_claims=used
    )
    assert explain_text(outcome) == "\n".join(
        [
            "claim default/claim-1 cannot be allocated on node node-1: "
            "request 'gpu' cannot be satisfied: needs 2 devices, 1 available",
            "requests:",
            "  request gpu (class gpu.dra.dev, wants 2 devices): 1 of 2 devices on the node available",
            "    problem: needs 2 devices, 1 available",
            "    1 device: allocated to claim team-a/other",
            "      e.g. gpu.dra.dev/pool-1/gpu-0",
        ]
    )
    ok = run(claim([exact("gpu")]), [resource_slice("s", TWO)])
    assert (
        explain_text(ok) == "claim default/claim-1 can be allocated on node node-1:\n  gpu -> gpu.dra.dev/pool-1/gpu-0"
    )
