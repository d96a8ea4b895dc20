"""firstAvailable, constraints, taints, admin access and consumable capacity."""

from typing import Any

import pytest

from dra_driver.allocation import ADMIN_ACCESS_LABEL
from dra_driver.defaults import DRIVER_NAME
from tests.allocation.objects import (
    allocated,
    claim,
    device,
    devices_of,
    exact,
    first_available,
    reasons,
    resource_slice,
    result,
    run,
    sub,
)

A = f'device.attributes["{DRIVER_NAME}"]'
BIG = f"{A}.memoryGiB >= 80"


# -- firstAvailable ------------------------------------------------------------------------------


def test_first_available_takes_the_first_satisfiable_subrequest() -> None:
    devs = [device("small-0", {"memoryGiB": 40}), device("small-1", {"memoryGiB": 40})]
    req = first_available("gpu", [sub("big", selectors=[BIG]), sub("two-small", count=2)])
    outcome = run(claim([req]), [resource_slice("s", devs)])
    assert devices_of(outcome) == [("gpu/two-small", "small-0"), ("gpu/two-small", "small-1")]


def test_first_available_prefers_earlier_subrequest() -> None:
    devs = [device("small-0", {"memoryGiB": 40}), device("big-0", {"memoryGiB": 80})]
    req = first_available("gpu", [sub("big", selectors=[BIG]), sub("small")])
    assert devices_of(run(claim([req]), [resource_slice("s", devs)])) == [("gpu/big", "big-0")]


def test_first_available_none_satisfiable() -> None:
    req = first_available("gpu", [sub("big", selectors=[BIG]), sub("three", count=3)])
    outcome = run(claim([req]), [resource_slice("s", [device("small-0", {"memoryGiB": 40})])])
    assert outcome.explanation is not None
    assert outcome.explanation.summary.startswith("no subrequest of 'gpu' can be satisfied")
    assert [r.request for r in outcome.explanation.requests] == ["gpu/big", "gpu/three"]


def test_first_available_backtracks_into_later_subrequest_for_a_later_request() -> None:
    # "gpu/any" would take big-0 first, but "exclusive" needs big-0; the search falls back per device.
    devs = [device("big-0", {"memoryGiB": 80}), device("small-0", {"memoryGiB": 40})]
    claim_obj = claim([first_available("gpu", [sub("any")]), exact("exclusive", selectors=[BIG])])
    assert devices_of(run(claim_obj, [resource_slice("s", devs)])) == [("gpu/any", "small-0"), ("exclusive", "big-0")]


def test_first_available_needs_the_gate() -> None:
    req = first_available("gpu", [sub("any")])
    outcome = run(claim([req]), [resource_slice("s", [device("gpu-0")])], gates={"DRAPrioritizedList": False})
    assert outcome.explanation is not None
    assert "DRAPrioritizedList" in outcome.explanation.summary


# -- constraints ---------------------------------------------------------------------------------

NVLINK = f"{DRIVER_NAME}/nvlinkDomain"
FOUR = [
    device("gpu-0", {"nvlinkDomain": "a", "pcieRoot": "r0"}),
    device("gpu-1", {"nvlinkDomain": "b", "pcieRoot": "r1"}),
    device("gpu-2", {"nvlinkDomain": "b", "pcieRoot": "r1"}),
    device("gpu-3", {"pcieRoot": "r3"}),
]


@pytest.mark.parametrize(
    ("requests", "constraint", "expected"),
    [
        # two devices in the same NVLink domain: gpu-0 alone in "a", so b is chosen
        ([exact("gpu", count=2)], {"matchAttribute": NVLINK}, [("gpu", "gpu-1"), ("gpu", "gpu-2")]),
        # across requests, scoped by name
        (
            [exact("a"), exact("b")],
            {"requests": ["a", "b"], "matchAttribute": NVLINK},
            [("a", "gpu-1"), ("b", "gpu-2")],
        ),
        # distinct PCIe roots
        (
            [exact("gpu", count=2)],
            {"distinctAttribute": f"{DRIVER_NAME}/pcieRoot"},
            [("gpu", "gpu-0"), ("gpu", "gpu-1")],
        ),
        # a constraint scoped to other requests does not bind this one
        (
            [exact("gpu", count=2)],
            {"requests": ["other"], "matchAttribute": NVLINK},
            [("gpu", "gpu-0"), ("gpu", "gpu-1")],
        ),
        # unqualified attributes of the driver match the fully qualified name
        ([exact("gpu", count=3)], {"matchAttribute": NVLINK}, None),
        ([exact("gpu", count=4)], {"distinctAttribute": f"{DRIVER_NAME}/nvlinkDomain"}, None),
        # missing attribute is a mismatch: gpu-3 has no nvlinkDomain
        ([exact("gpu", mode="All")], {"matchAttribute": NVLINK}, None),
    ],
)
def test_constraints(
    requests: list[dict[str, Any]], constraint: dict[str, Any], expected: list[tuple[str, str]] | None
) -> None:
    outcome = run(claim(requests, constraints=[constraint]), [resource_slice("s", FOUR)])
    if expected is None:
        assert not outcome.ok
    else:
        assert devices_of(outcome) == expected


def test_unsatisfiable_constraint_is_named() -> None:
    outcome = run(claim([exact("gpu", count=3)], constraints=[{"matchAttribute": NVLINK}]), [resource_slice("s", FOUR)])
    assert outcome.explanation is not None
    assert outcome.explanation.unsatisfiable_constraints == (f"matchAttribute {NVLINK} (requests: all requests)",)
    assert outcome.explanation.summary == (
        f"constraint matchAttribute {NVLINK} (requests: all requests) cannot be satisfied by the available devices"
    )


def test_match_attribute_compares_types() -> None:
    devs = [device("gpu-0", {"x": 1}), device("gpu-1", {"x": True})]  # 1 != true
    outcome = run(
        claim([exact("gpu", count=2)], constraints=[{"matchAttribute": f"{DRIVER_NAME}/x"}]),
        [resource_slice("s", devs)],
    )
    assert not outcome.ok


NUMA = "resource.kubernetes.io/numaNode"


def _numa_devices(*values: Any) -> list[dict[str, Any]]:
    """gpu-<i> with numaNode = values[i]: an int or a list (KEP-5491 `ints`)."""
    return [device(f"gpu-{i}", attributes={NUMA: {"ints": v} if isinstance(v, list) else {"int": v}})
            for i, v in enumerate(values)]


@pytest.mark.parametrize(
    ("values", "constraint", "expected"),
    [
        # matchAttribute over lists: a non-empty intersection of every device's values.
        ([[0, 1], [1, 2]], "matchAttribute", ["gpu-0", "gpu-1"]),
        ([[0, 1], [2, 3], [1, 3]], "matchAttribute", ["gpu-0", "gpu-2"]),
        ([[0], [1], [2]], "matchAttribute", None),
        # a scalar is a one-element set
        ([1, [0, 1]], "matchAttribute", ["gpu-0", "gpu-1"]),
        # distinctAttribute over lists: pairwise disjoint.
        ([[0, 1], [1, 2], [2, 3]], "distinctAttribute", ["gpu-0", "gpu-2"]),
        ([[0, 1], [1, 2]], "distinctAttribute", None),
        ([0, [1, 2]], "distinctAttribute", ["gpu-0", "gpu-1"]),
    ],
)
def test_list_attributes_in_constraints(values: list[Any], constraint: str, expected: list[str] | None) -> None:
    outcome = run(claim([exact("gpu", count=2)], constraints=[{constraint: NUMA}]),
                  [resource_slice("s", _numa_devices(*values))])
    if expected is None:
        assert not outcome.ok
    else:
        assert [d for _, d in devices_of(outcome)] == expected


def test_match_over_lists_keeps_the_running_intersection() -> None:
    # {0,1} & {1,2} = {1}; {0,2} meets each of them but not their intersection, so three devices do not match.
    outcome = run(claim([exact("gpu", count=3)], constraints=[{"matchAttribute": NUMA}]),
                  [resource_slice("s", _numa_devices([0, 1], [1, 2], [0, 2]))])
    assert not outcome.ok


# -- taints --------------------------------------------------------------------------------------

NO_SCHEDULE = {"key": "gpu.dra.dev/unhealthy", "value": "xid-79", "effect": "NoSchedule"}


@pytest.mark.parametrize(
    ("taint", "tolerations", "gates", "ok"),
    [
        (NO_SCHEDULE, [], None, False),
        ({**NO_SCHEDULE, "effect": "NoExecute"}, [], None, False),
        ({**NO_SCHEDULE, "effect": "None"}, [], None, True),  # effect None never blocks
        (NO_SCHEDULE, [{"key": "gpu.dra.dev/unhealthy", "operator": "Exists"}], None, True),
        (NO_SCHEDULE, [{"operator": "Exists"}], None, True),  # empty key + Exists tolerates everything
        (NO_SCHEDULE, [{"key": "gpu.dra.dev/unhealthy", "operator": "Equal", "value": "xid-79"}], None, True),
        (NO_SCHEDULE, [{"key": "gpu.dra.dev/unhealthy", "value": "xid-48"}], None, False),  # Equal is the default
        (NO_SCHEDULE, [{"key": "gpu.dra.dev/unhealthy", "operator": "Exists", "effect": "NoExecute"}], None, False),
        (NO_SCHEDULE, [{"key": "gpu.dra.dev/unhealthy", "operator": "Exists", "effect": "NoSchedule"}], None, True),
        (NO_SCHEDULE, [], {"DRADeviceTaints": False}, True),
    ],
)
def test_taints(
    taint: dict[str, str], tolerations: list[dict[str, str]], gates: dict[str, bool] | None, ok: bool
) -> None:
    outcome = run(
        claim([exact("gpu", tolerations=tolerations)]),
        [resource_slice("s", [device("gpu-0", taints=[taint])])],
        gates=gates,
    )
    assert outcome.ok is ok
    if not ok:
        key = f"tainted {taint['key']}={taint['value']}:{taint['effect']} and the request does not tolerate it"
        assert reasons(outcome) == {key: 1}
    elif tolerations:
        assert outcome.allocation is not None
        assert outcome.allocation["devices"]["results"][0]["tolerations"] == tolerations


def test_tainted_device_is_skipped_for_the_next() -> None:
    devs = [device("gpu-0", taints=[NO_SCHEDULE]), device("gpu-1")]
    assert devices_of(run(claim([exact("gpu")]), [resource_slice("s", devs)])) == [("gpu", "gpu-1")]


# -- admin access --------------------------------------------------------------------------------

ADMIN_NS = {ADMIN_ACCESS_LABEL: "true"}


def test_admin_access_requires_the_namespace_label() -> None:
    outcome = run(claim([exact("gpu", admin=True)], namespace="monitoring"), [resource_slice("s", [device("gpu-0")])])
    assert outcome.explanation is not None
    assert outcome.explanation.summary == (
        "request gpu: admin access is not allowed in namespace 'monitoring'; "
        "label the namespace resource.kubernetes.io/admin-access=true to allow it"
    )


def test_admin_access_reaches_devices_in_use_and_is_marked() -> None:
    used = [allocated("busy", [result("gpu-0")])]
    outcome = run(
        claim([exact("gpu", admin=True)], namespace="monitoring"),
        [resource_slice("s", [device("gpu-0")])],
        allocated_claims=used,
        namespace_labels=ADMIN_NS,
    )
    assert outcome.allocation is not None
    assert outcome.allocation["devices"]["results"] == [
        {"request": "gpu", "driver": DRIVER_NAME, "pool": "pool-1", "device": "gpu-0", "adminAccess": True}
    ]


def test_admin_access_allocations_do_not_consume_the_device() -> None:
    admin_holder = [allocated("monitor", [result("gpu-0", adminAccess=True)], namespace="monitoring")]
    outcome = run(claim([exact("gpu")]), [resource_slice("s", [device("gpu-0")])], allocated_claims=admin_holder)
    assert devices_of(outcome) == [("gpu", "gpu-0")]


def test_admin_access_needs_the_gate() -> None:
    outcome = run(
        claim([exact("gpu", admin=True)]),
        [resource_slice("s", [device("gpu-0")])],
        namespace_labels=ADMIN_NS,
        gates={"DRAAdminAccess": False},
    )
    assert outcome.explanation is not None
    assert "DRAAdminAccess feature is disabled" in outcome.explanation.summary


# -- consumable capacity -------------------------------------------------------------------------


def shared_gpu(policy: dict[str, Any] | None = None, name: str = "gpu-0") -> dict[str, Any]:
    memory: dict[str, Any] = {"value": "80Gi"}
    if policy is not None:
        memory["requestPolicy"] = policy
    return device(name, capacity={"memory": memory}, multi=True)


RANGE = {"default": "1Gi", "validRange": {"min": "1Gi", "max": "40Gi", "step": "1Gi"}}


@pytest.mark.parametrize(
    ("policy", "request_capacity", "consumed"),
    [
        (None, {"memory": "10Gi"}, "10Gi"),
        (None, None, "80Gi"),  # no request, no default: the whole capacity
        (RANGE, None, "1Gi"),  # the default
        (RANGE, {"memory": "1.5Gi"}, "2Gi"),  # rounded up to a step
        (RANGE, {"memory": "100Mi"}, "1Gi"),  # raised to min
        ({"default": "10Gi", "validValues": ["10Gi", "20Gi", "40Gi"]}, {"memory": "11Gi"}, "20Gi"),
        (None, {"gpu.dra.dev/memory": "4Gi"}, "4Gi"),  # qualified name of the driver's own capacity
    ],
)
def test_consumed_capacity_follows_request_policy(
    policy: dict[str, Any] | None, request_capacity: dict[str, str] | None, consumed: str
) -> None:
    outcome = run(claim([exact("gpu", capacity=request_capacity)]), [resource_slice("s", [shared_gpu(policy)])])
    assert outcome.allocation is not None
    assert outcome.allocation["devices"]["results"] == [
        {
            "request": "gpu",
            "driver": DRIVER_NAME,
            "pool": "pool-1",
            "device": "gpu-0",
            "shareID": "share-1",
            "consumedCapacity": {"memory": consumed},
        }
    ]


@pytest.mark.parametrize(
    ("policy", "request_capacity", "reason"),
    [
        (RANGE, {"memory": "41Gi"}, "capacity 'memory' request policy not satisfiable"),
        (
            {"default": "10Gi", "validValues": ["10Gi", "20Gi"]},
            {"memory": "21Gi"},
            "capacity 'memory' request policy not satisfiable",
        ),
        (None, {"memory": "81Gi"}, "insufficient capacity 'memory'"),
        (None, {"cores": "1"}, "device has no capacity 'cores'"),
    ],
)
def test_capacity_request_rejections(
    policy: dict[str, Any] | None, request_capacity: dict[str, str], reason: str
) -> None:
    outcome = run(claim([exact("gpu", capacity=request_capacity)]), [resource_slice("s", [shared_gpu(policy)])])
    assert reasons(outcome) == {reason: 1}


def test_shares_add_up_against_existing_allocations() -> None:
    existing = [
        allocated("a", [result("gpu-0", shareID="s-a", consumedCapacity={"memory": "30Gi"})]),
        allocated("b", [result("gpu-0", shareID="s-b", consumedCapacity={"memory": "40Gi"})]),
    ]
    fits = run(
        claim([exact("gpu", capacity={"memory": "10Gi"})]),
        [resource_slice("s", [shared_gpu()])],
        allocated_claims=existing,
    )
    assert devices_of(fits) == [("gpu", "gpu-0")]
    too_big = run(
        claim([exact("gpu", capacity={"memory": "11Gi"})]),
        [resource_slice("s", [shared_gpu()])],
        allocated_claims=existing,
    )
    assert too_big.explanation is not None
    req = too_big.explanation.requests[0]
    assert req.reasons[0].reason == "insufficient capacity 'memory'"
    assert req.reasons[0].examples == (
        "gpu.dra.dev/pool-1/gpu-0 (memory 11Gi requested, 70Gi of 80Gi already consumed by 2 shares)",
    )


def test_two_requests_share_one_device_with_fresh_share_ids() -> None:
    outcome = run(
        claim([exact("a", capacity={"memory": "40Gi"}), exact("b", capacity={"memory": "40Gi"})]),
        [resource_slice("s", [shared_gpu()])],
    )
    assert outcome.allocation is not None
    results = outcome.allocation["devices"]["results"]
    assert [(r["request"], r["device"], r["shareID"]) for r in results] == [
        ("a", "gpu-0", "share-1"),
        ("b", "gpu-0", "share-2"),
    ]
    third = run(
        claim([exact("a", capacity={"memory": "40Gi"}), exact("b", capacity={"memory": "41Gi"})]),
        [resource_slice("s", [shared_gpu()])],
    )
    assert not third.ok


def test_capacity_on_exclusive_device_is_a_filter() -> None:
    devs = [device("gpu-0", capacity={"memory": "40Gi"}), device("gpu-1", capacity={"memory": "80Gi"})]
    outcome = run(claim([exact("gpu", capacity={"memory": "42949672961"})]), [resource_slice("s", devs)])
    assert outcome.allocation is not None
    assert outcome.allocation["devices"]["results"] == [
        {"request": "gpu", "driver": DRIVER_NAME, "pool": "pool-1", "device": "gpu-1"}
    ]


def test_consumable_capacity_gate_off() -> None:
    outcome = run(
        claim([exact("gpu", capacity={"memory": "1Gi"})]),
        [resource_slice("s", [shared_gpu()])],
        gates={"DRAConsumableCapacity": False},
    )
    assert outcome.explanation is not None
    assert "DRAConsumableCapacity feature is disabled" in outcome.explanation.summary
    # without the gate a multi-allocatable device is exclusive
    used = [allocated("a", [result("gpu-0")])]
    assert not run(
        claim([exact("gpu")]),
        [resource_slice("s", [shared_gpu()])],
        allocated_claims=used,
        gates={"DRAConsumableCapacity": False},
    ).ok


def test_share_ids_are_uuids_by_default() -> None:
    import uuid

    from dra_driver.allocation import allocate
    from tests.allocation.objects import GPU_CLASS, node

    outcome = allocate(
        claim([exact("gpu")]), node=node(), classes=[GPU_CLASS], slices=[resource_slice("s", [shared_gpu()])]
    )
    assert outcome.allocation is not None
    uuid.UUID(outcome.allocation["devices"]["results"][0]["shareID"])
