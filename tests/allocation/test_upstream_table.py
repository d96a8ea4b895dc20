"""Differential table: cases and verdicts of upstream's structured allocator tests, run against our allocator.

Source (facts only: case names, inputs, expected results or errors): kubernetes/kubernetes
`staging/src/k8s.io/dynamic-resource-allocation/structured/internal/allocatortesting/allocator_testing.go`
(the table shared by the stable, incubating and experimental allocators, 1.34-1.37). Names are upstream's.

A verdict is the allocated (request, driver, pool, device) list, NONE (no allocation, no error) or ERROR
(upstream returns an error; ours reports a claim error or refuses the object). Upstream allocates all claims of a
pod together and backtracks across them; so does `allocate_pod_claims`, which the scheduler stand-in uses.
Upstream's feature flags default to off in its table; the cases below pass the gates each one names.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import pytest

from dra_driver.allocation import allocate_pod_claims
from dra_driver.resourceapi import InvalidObjectError
from tests.allocation.objects import (
    Version,
    allocated,
    claim,
    device,
    device_class,
    exact,
    first_available,
    node,
    resource_slice,
    result,
    share_ids,
    sub,
)

DRIVER_A, DRIVER_B = "driver-a", "driver-b"
CLASS_A = device_class("class-a", ['device.driver == "driver-a"'])
CLASS_B = device_class("class-b", ['device.driver == "driver-b"'])
NONE = "none"
ERROR = "error"
TAINT_NO_SCHEDULE = {"key": "taint-key", "value": "taint-value", "effect": "NoSchedule"}
TAINT_NO_EXECUTE = {"key": "taint-key", "value": "taint-value-2", "effect": "NoExecute"}
TAINT_NONE = {"key": "taint-key", "value": "taint-value", "effect": "None"}
TOLERATE_NO_EXECUTE = {"operator": "Equal", "key": "taint-key", "value": "taint-value-2", "effect": "NoExecute"}
TOLERATE_NO_SCHEDULE = {"operator": "Exists", "key": "taint-key", "effect": "NoSchedule"}
# Upstream's table turns features on per case; ours are on unless a case turns one off.
GATES = ("DRAAdminAccess", "DRAPrioritizedList", "DRAPartitionableDevices", "DRADeviceTaints", "DRAConsumableCapacity")


def memory_at_least(size: str, driver: str = DRIVER_A) -> str:
    return f'device.capacity["{driver}"].memory.compareTo(quantity("{size}")) >= 0'


def one(name: str = "slice-1", *, pool: str = "pool-1", driver: str = DRIVER_A, node: str = "node-1",
        **kwargs: Any) -> dict[str, Any]:
    """upstream sliceWithOneDevice: one device named device-1."""
    return resource_slice(name, [device("device-1")], pool=pool, driver=driver, node=node, **kwargs)


def counters(name: str = "slice-2", memory: str = "18Gi", *, count: int = 2, **kwargs: Any) -> dict[str, Any]:
    return resource_slice(name, [], count=count, counter_sets={"counter-set-1": {"memory": memory}}, driver=DRIVER_A,
                          **kwargs)


def from_counters(name: str, memory: str, **extra: Any) -> dict[str, Any]:
    """upstream device(name, fromCounters, nil).withDeviceCounterConsumption(...): capacity = the counters drawn."""
    return device(name, capacity={"memory": memory}, consumes=[("counter-set-1", {"memory": memory})], **extra)


@dataclass(frozen=True)
class Case:
    name: str
    claims: Sequence[Mapping[str, Any]]
    slices: Sequence[Mapping[str, Any]]
    expect: Any  # list of (request, driver, pool, device) per claim, NONE or ERROR
    classes: Sequence[Mapping[str, Any]] = (CLASS_A,)
    gates: Mapping[str, bool] = field(default_factory=dict)
    allocated_devices: Sequence[tuple[str, str, str]] = ()  # (driver, pool, device)
    namespace_labels: Mapping[str, str] = field(default_factory=dict)


def _c(*requests: Mapping[str, Any], name: str = "claim-0", **kwargs: Any) -> dict[str, Any]:
    return claim(requests, name=name, **kwargs)


def _r(req: str, dev: str, *, driver: str = DRIVER_A, pool: str = "pool-1") -> tuple[str, str, str, str]:
    return (req, driver, pool, dev)


CASES: list[Case] = [
    # --- simple ---------------------------------------------------------------------------------------
    Case("simple", [_c(exact("req-0", "class-a"))], [one()], [[_r("req-0", "device-1")]]),
    Case("other-node", [_c(exact("req-0", "class-a"))],
         [one(driver=DRIVER_B), one("slice-2", pool="pool-2", node="node-2")], NONE),
    Case("small-and-large",
         [_c(exact("req-0", "class-a", selectors=[memory_at_least("1Gi")]),
             exact("req-1", "class-a", selectors=[memory_at_least("2Gi")]))],
         [resource_slice("slice-1", [device("device-1", capacity={"memory": "1Gi"}),
                                     device("device-2", capacity={"memory": "2Gi"})], driver=DRIVER_A)],
         [[_r("req-0", "device-1"), _r("req-1", "device-2")]]),
    Case("small-and-large-backtrack-requests",
         [_c(exact("req-0", "class-a", selectors=[memory_at_least("1Gi")]),
             exact("req-1", "class-a", selectors=[memory_at_least("2Gi")]))],
         [resource_slice("slice-1", [device("device-2", capacity={"memory": "2Gi"}),
                                     device("device-1", capacity={"memory": "1Gi"})], driver=DRIVER_A)],
         [[_r("req-0", "device-1"), _r("req-1", "device-2")]]),
    Case("small-and-large-backtrack-claims",
         [_c(exact("req-0", "class-a", selectors=[memory_at_least("1Gi")])),
          _c(exact("req-1", "class-a", selectors=[memory_at_least("2Gi")]), name="claim-1")],
         [resource_slice("slice-1", [device("device-2", capacity={"memory": "2Gi"}),
                                     device("device-1", capacity={"memory": "1Gi"})], driver=DRIVER_A)],
         [[_r("req-0", "device-1")], [_r("req-1", "device-2")]]),
    Case("devices-split-across-different-slices", [_c(exact("req-0", "class-a", count=2))],
         [one(), one("slice-2", pool="pool-2")],
         [[_r("req-0", "device-1"), _r("req-0", "device-1", pool="pool-2")]]),
    Case("obsolete-slice", [_c(exact("req-0", "class-a"))],
         [resource_slice("slice-1-obsolete", [device("device-1")], count=2, driver=DRIVER_A),
          resource_slice("slice-1-obsolete", [device("device-2")], count=2, generation=2, driver=DRIVER_A)], NONE),
    Case("no-slices", [_c(exact("req-0", "class-a"))], [], NONE),
    Case("not-enough-suitable-devices", [_c(exact("req-0", "class-a"), exact("req-1", "class-a"))], [one()], NONE),
    Case("no-classes", [_c(exact("req-0", "class-a"))], [one()], ERROR, classes=()),
    Case("unknown-class", [_c(exact("req-0", "unknown-class"))], [one()], ERROR),
    # --- counts / All mode ------------------------------------------------------------------------------
    Case("all-devices-single", [_c(exact("req-0", "class-a", mode="All"))], [one()], [[_r("req-0", "device-1")]]),
    Case("all-devices-many", [_c(exact("req-0", "class-a", mode="All"))], [one(), one(pool="pool-2")],
         [[_r("req-0", "device-1"), _r("req-0", "device-1", pool="pool-2")]]),
    Case("all-devices-of-the-incomplete-pool", [_c(exact("req-0", "class-a", mode="All"))], [one(count=2)], ERROR),
    Case("all-devices-plus-another",
         [_c(exact("req-0", "class-a", mode="All")), _c(exact("req-0", "class-b", count=1), name="claim-1")],
         [one(), one(driver=DRIVER_B)],
         [[_r("req-0", "device-1")], [_r("req-0", "device-1", driver=DRIVER_B)]], classes=(CLASS_A, CLASS_B)),
    Case("too-many-devices-single-request", [_c(exact("req-0", "class-a", count=500))], [], ERROR),
    # --- admin access -------------------------------------------------------------------------------------
    Case("admin-access-disabled", [_c(exact("req-0", "class-a", admin=True))], [one()], ERROR,
         gates={"DRAAdminAccess": False}, namespace_labels={"resource.kubernetes.io/admin-access": "true"}),
    Case("admin-access-enabled", [_c(exact("req-0", "class-a", admin=True))], [one()],
         [[_r("req-0", "device-1")]], allocated_devices=[(DRIVER_A, "pool-1", "device-1"),
                                                         (DRIVER_A, "pool-1", "device-2")],
         namespace_labels={"resource.kubernetes.io/admin-access": "true"}),
    # --- constraints -----------------------------------------------------------------------------------
    Case("with-constraint",
         [_c(exact("req-0", "class-a"), exact("req-1", "class-a"),
             constraints=[{"matchAttribute": f"{DRIVER_A}/{a}"} for a in ("numa", "driverVersion",
                                                                            "stringAttribute", "boolAttribute")])],
         [resource_slice("slice-1", [device(d, {"numa": 1, "stringAttribute": "stringAttributeValue",
                                                "boolAttribute": True, "driverVersion": Version("1.0.0")}) for d in ("device-1", "device-2")],
                         driver=DRIVER_A)],
         [[_r("req-0", "device-1"), _r("req-1", "device-2")]]),
    Case("with-constraint-non-existent-attribute",
         [_c(exact("req-0", "class-a"), constraints=[{"matchAttribute": "driver-a/noSuchAttribute"}])], [one()],
         NONE),
    Case("with-constraint-not-matching-int-attribute",
         [_c(exact("req-0", "class-a", count=2), constraints=[{"matchAttribute": f"{DRIVER_A}/numa"}])],
         [resource_slice("slice-1", [device("device-1", {"numa": 1}), device("device-2", {"numa": 2})],
                         driver=DRIVER_A)], NONE),
    Case("with-constraint-not-matching-int-attribute-all-devices",
         [_c(exact("req-0", "class-a", mode="All"), constraints=[{"matchAttribute": f"{DRIVER_A}/numa"}])],
         [resource_slice("slice-1", [device("device-1", {"numa": 1}), device("device-2", {"numa": 2})],
                         driver=DRIVER_A)], ERROR),
    Case("with-constraint-not-matching-string-attribute",
         [_c(exact("req-0", "class-a", count=2), constraints=[{"matchAttribute": f"{DRIVER_A}/stringAttribute"}])],
         [resource_slice("slice-1", [device("device-1", {"stringAttribute": "stringAttributeValue"}),
                                     device("device-2", {"stringAttribute": "stringAttributeValue2"})],
                         driver=DRIVER_A)], NONE),
    Case("with-constraint-for-request",
         [_c(exact("req-0", "class-a"), exact("req-1", "class-a"),
             constraints=[{"requests": ["req-0"], "matchAttribute": f"{DRIVER_A}/driverVersion"}])],
         [resource_slice("slice-1", [device("device-1", {"driverVersion": Version("1.0.0")}),
                                     device("device-2", {"driverVersion": Version("2.0.0")})], driver=DRIVER_A)],
         [[_r("req-0", "device-1"), _r("req-1", "device-2")]]),
    Case("with-constraint-for-request-retry",
         [_c(exact("req-0", "class-a"), exact("req-1", "class-a"),
             constraints=[{"requests": ["req-0"], "matchAttribute": f"{DRIVER_A}/driverVersion"},
                          {"matchAttribute": f"{DRIVER_A}/stringAttribute"}])],
         [resource_slice("slice-1", [device("device-1", {"stringAttribute": "a", "driverVersion": Version("1.0.0")}),
                                     device("device-2", {"stringAttribute": "b", "driverVersion": Version("2.0.0")}),
                                     device("device-3", {"stringAttribute": "b", "driverVersion": Version("3.0.0")})],
                         driver=DRIVER_A)],
         [[_r("req-0", "device-2"), _r("req-1", "device-3")]]),
    # --- unknown / invalid input ---------------------------------------------------------------------------
    Case("unknown-selector", [_c({"name": "req-0", "exactly": {"deviceClassName": "class-a", "selectors": [{}]}})],
         [one()], ERROR),
    Case("unknown-allocation-mode", [_c(exact("req-0", "class-a", mode="future-mode"))], [one()], ERROR),
    Case("unknown-constraint", [_c(exact("req-0", "class-a"), constraints=[{}])], [one()], ERROR),
    Case("invalid-CEL-one-device", [_c(exact("req-0", "class-a", selectors=["noSuchVar"]))], [one()], ERROR),
    Case("invalid-CEL-one-device-class", [_c(exact("req-0", "class-a"))], [one()], ERROR,
         classes=(device_class("class-a", ["noSuchVar"]),)),
    Case("invalid-CEL-all-devices", [_c(exact("req-0", "class-a", mode="All", selectors=["noSuchVar"]))], [one()],
         ERROR),
    # --- partitionable devices / counters ----------------------------------------------------------------
    Case("partitionable-devices-overallocated-capacity-pool", [_c(exact("req-0", "class-a"))],
         [resource_slice("slice-1", [from_counters("device-1", "4Gi"), from_counters("device-2", "20Gi")], count=2,
                         driver=DRIVER_A), counters()],
         NONE, allocated_devices=[(DRIVER_A, "pool-1", "device-2")]),
    Case("partitionable-devices-disabled-device-consumes-counters", [_c(exact("req-0", "class-a"))],
         [resource_slice("slice-1", [from_counters("device-1", "4Gi")], count=2, driver=DRIVER_A), counters()],
         NONE, gates={"DRAPartitionableDevices": False}),
    Case("partitionable-devices-disabled-other-device-do-not-consume-counters", [_c(exact("req-0", "class-a"))],
         [resource_slice("slice-1", [from_counters("device-1", "4Gi"), device("device-2")], count=2,
                         driver=DRIVER_A), counters()],
         [[_r("req-0", "device-2")]], gates={"DRAPartitionableDevices": False}),
    Case("partitionable-devices-per-device-node-selection-nodename",
         [_c(first_available("req-0", [sub("subReq-0", "class-a", selectors=[memory_at_least("6Gi")]),
                                       sub("subReq-1", "class-a", selectors=[memory_at_least("4Gi")])]))],
         [resource_slice("slice-1", [from_counters("device-1", "4Gi", nodeName="node-1"),
                                     from_counters("device-2", "6Gi", nodeName="node-2")], count=2, per_device=True,
                         driver=DRIVER_A), counters(per_device=True)],
         [[_r("req-0/subReq-1", "device-1")]]),
    # --- taints ---------------------------------------------------------------------------------------------
    Case("tainted-two-devices", [_c(exact("req-0", "class-a"))],
         [resource_slice("slice-1", [device("device-1", taints=[TAINT_NO_SCHEDULE]),
                                     device("device-2", taints=[TAINT_NO_EXECUTE])], driver=DRIVER_A)], NONE),
    Case("tainted-two-devices-tolerated", [_c(exact("req-0", "class-a", tolerations=[TOLERATE_NO_EXECUTE]))],
         [resource_slice("slice-1", [device("device-1", taints=[TAINT_NO_SCHEDULE]),
                                     device("device-2", taints=[TAINT_NO_EXECUTE])], driver=DRIVER_A)],
         [[_r("req-0", "device-2")]]),
    Case("tainted-two-devices-prioritized-list-tolerated",
         [_c(first_available("req-0", [sub("subReq-0", "class-a"),
                                       sub("subReq-1", "class-a", tolerations=[TOLERATE_NO_EXECUTE])]))],
         [resource_slice("slice-1", [device("device-1", taints=[TAINT_NO_SCHEDULE]),
                                     device("device-2", taints=[TAINT_NO_EXECUTE])], driver=DRIVER_A)],
         [[_r("req-0/subReq-1", "device-2")]]),
    Case("tainted-no-effect", [_c(exact("req-0", "class-a"))],
         [resource_slice("slice-1", [device("device-1", taints=[TAINT_NONE])], driver=DRIVER_A)],
         [[_r("req-0", "device-1")]]),
    Case("tainted-one-device-two-taints-both-tolerated",
         [_c(exact("req-0", "class-a", tolerations=[TOLERATE_NO_SCHEDULE, TOLERATE_NO_EXECUTE]))],
         [resource_slice("slice-1", [device("device-1", taints=[TAINT_NO_SCHEDULE, TAINT_NO_EXECUTE])],
                         driver=DRIVER_A)], [[_r("req-0", "device-1")]]),
    Case("tainted-disabled", [_c(exact("req-0", "class-a"))],
         [resource_slice("slice-1", [device("device-1", taints=[TAINT_NO_SCHEDULE, TAINT_NO_EXECUTE])],
                         driver=DRIVER_A)], [[_r("req-0", "device-1")]], gates={"DRADeviceTaints": False}),
    Case("tainted-prioritized-list",
         [_c(first_available("req-0", [sub("subReq-0", "class-b"), sub("subReq-1", "class-a")]))],
         [resource_slice("slice-1", [device("device-1", taints=[TAINT_NO_SCHEDULE])], driver=DRIVER_A)], NONE,
         classes=(CLASS_A, CLASS_B)),
]


def _allocated_claims(devices: Sequence[tuple[str, str, str]]) -> list[dict[str, Any]]:
    return [allocated(f"holder-{i}", [result(dev, pool=pool, driver=driver)])
            for i, (driver, pool, dev) in enumerate(devices)]


def verdict(case: Case) -> Any:
    """Allocate the case's claims together on node-1, as the claims of one pod."""
    gates = {**{k: True for k in GATES}, **case.gates}
    try:
        outcome = allocate_pod_claims(case.claims, node=node(), classes=list(case.classes), slices=list(case.slices),
                                      allocated_claims=_allocated_claims(case.allocated_devices),
                                      namespace_labels=dict(case.namespace_labels), feature_gates=gates,
                                      new_share_id=share_ids())
    except InvalidObjectError:
        return ERROR
    if outcome.failure is not None:
        assert outcome.failure.explanation is not None
        return ERROR if outcome.failure.explanation.errors else NONE
    assert len(outcome.outcomes) == len(case.claims)
    out = []
    for claim_outcome in outcome.outcomes:
        assert claim_outcome.allocation is not None
        results = claim_outcome.allocation["devices"]["results"]
        out.append([(r["request"], r["driver"], r["pool"], r["device"]) for r in results])
    return out


@pytest.mark.parametrize("case", [pytest.param(c, id=c.name) for c in CASES])
def test_upstream_allocator_case(case: Case) -> None:
    assert verdict(case) == case.expect


def test_the_table_is_big_enough() -> None:
    assert len(CASES) >= 30
    assert len({c.name for c in CASES}) == len(CASES)
