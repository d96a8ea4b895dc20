"""The sandbox API server's rule book (`dra_sandbox.apiserver.validation`): every resource.k8s.io/v1 limit
(docs/reference/kubernetes-dra.md §3.6) at its boundary and one past it, plus the oneOf/format rules."""

from __future__ import annotations

import copy
import json
from collections.abc import Callable
from fractions import Fraction
from typing import Any

import pytest

from dra_driver.defaults import DRIVER_NAME
from dra_sandbox.apiserver import validation as rv

V134 = rv.ValidationOptions(kube_version=(1, 34))
V135 = rv.ValidationOptions(kube_version=(1, 35))
V136 = rv.ValidationOptions(kube_version=(1, 36))
V136_LISTS = rv.ValidationOptions(kube_version=(1, 36), list_type_attributes=True)  # DRAListTypeAttributes on

Obj = dict[str, Any]


def device(name: str = "gpu-0", **extra: Any) -> Obj:
    return {"name": name, "attributes": {"productName": {"string": "H100"}}, **extra}


def slice_(devices: list[Obj] | None = None, **spec: Any) -> Obj:
    base: Obj = {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceSlice",
        "metadata": {"name": "node-1-gpu"},
        "spec": {
            "driver": DRIVER_NAME,
            "pool": {"name": "node-1", "generation": 0, "resourceSliceCount": 1},
            "nodeName": "node-1",
            "devices": [device()] if devices is None else devices,
        },
    }
    base["spec"].update(spec)
    return base


def counters(n: int) -> dict[str, Obj]:
    return {f"c-{i}": {"value": "1"} for i in range(n)}


def counter_slice(sets: list[Obj]) -> Obj:
    s = slice_(devices=[])
    del s["spec"]["devices"]
    s["spec"]["sharedCounters"] = sets
    return s


def claim(requests: list[Obj] | None = None, **devices: Any) -> Obj:
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": "claim", "namespace": "default"},
        "spec": {"devices": {"requests": requests if requests is not None else [exact("gpu")], **devices}},
    }


def exact(name: str, **fields: Any) -> Obj:
    return {"name": name, "exactly": {"deviceClassName": DRIVER_NAME, **fields}}


def device_class(**spec: Any) -> Obj:
    return {"apiVersion": "resource.k8s.io/v1", "kind": "DeviceClass", "metadata": {"name": DRIVER_NAME},
            "spec": spec}


def opaque(size: int | None = None) -> Obj:
    params: Obj = {"kind": "GpuConfig"}
    if size is not None:
        base = len(json.dumps({"kind": "GpuConfig", "pad": ""}, separators=(",", ":")))
        params["pad"] = "x" * (size - base)
    return {"opaque": {"driver": DRIVER_NAME, "parameters": params}}


def allocated_claim(results: int = 1, **status: Any) -> Obj:
    c = claim()
    c["status"] = {
        "allocation": {
            "devices": {
                "results": [{"request": "gpu", "driver": DRIVER_NAME, "pool": "node-1", "device": f"gpu-{i}"}
                            for i in range(results)],
            }
        },
        **status,
    }
    return c


def taint(i: int) -> Obj:
    return {"key": f"example.com/t{i}", "value": "v", "effect": "NoSchedule"}


def name_of(length: int, *, alphabet: str = "a") -> str:
    return alphabet * length


# A limit case: build(n) makes an object with n of the counted thing; `limit` must pass, limit+1 must fail
# at `path` with `reason`.
LimitCase = tuple[str, rv.ValidationOptions, Callable[[int], Obj], int, str, str]

LIMIT_CASES: list[LimitCase] = [
    ("devices per slice", V135, lambda n: slice_([device(f"d-{i}") for i in range(n)]), 128,
     "spec.devices", rv.TOO_MANY),
    ("devices with taints", V135, lambda n: slice_([device(f"d-{i}", taints=[taint(0)]) for i in range(n)]), 64,
     "spec.devices", rv.TOO_MANY),
    ("devices consuming counters", V135,
     lambda n: slice_([device(f"d-{i}", consumesCounters=[{"counterSet": "gpu-0", "counters": counters(1)}])
                       for i in range(n)]), 64, "spec.devices", rv.TOO_MANY),
    ("devices with taints in 1.34", V134, lambda n: slice_([device(f"d-{i}", taints=[taint(0)]) for i in range(n)]),
     128, "spec.devices", rv.TOO_MANY),
    ("attributes+capacities per device", V135,
     lambda n: slice_([{"name": "d", "attributes": {f"a{i}": {"int": i} for i in range(n - 1)},
                        "capacity": {"memory": {"value": "80Gi"}}}]), 32, "spec.devices[0]", rv.TOO_MANY),
    ("counter sets per slice", V135, lambda n: counter_slice([{"name": f"s-{i}", "counters": counters(1)}
                                                             for i in range(n)]), 8, "spec.sharedCounters",
     rv.TOO_MANY),
    ("counters per set", V135, lambda n: counter_slice([{"name": "s", "counters": counters(n)}]), 32,
     "spec.sharedCounters[0].counters", rv.TOO_MANY),
    ("counters across sets in 1.34", V134,
     lambda n: counter_slice([{"name": "a", "counters": counters(n // 2)},
                              {"name": "b", "counters": counters(n - n // 2)}]), 32, "spec.sharedCounters",
     rv.TOO_MANY),
    ("consumesCounters per device", V135,
     lambda n: slice_([device(consumesCounters=[{"counterSet": f"s-{i}", "counters": counters(1)}
                                                for i in range(n)])]), 2, "spec.devices[0].consumesCounters",
     rv.TOO_MANY),
    ("counters per consumption", V135,
     lambda n: slice_([device(consumesCounters=[{"counterSet": "s", "counters": counters(n)}])]), 32,
     "spec.devices[0].consumesCounters[0].counters", rv.TOO_MANY),
    ("taints per device", V135, lambda n: slice_([device(taints=[taint(i) for i in range(n)])]), 16,
     "spec.devices[0].taints", rv.TOO_MANY),
    ("taints per device in 1.34", V134, lambda n: slice_([device(taints=[taint(i) for i in range(n)])]), 4,
     "spec.devices[0].taints", rv.TOO_MANY),
    ("bindingConditions", V135,
     lambda n: slice_([device(bindingConditions=[f"c{i}" for i in range(n)], bindingFailureConditions=["f"])]),
     4, "spec.devices[0].bindingConditions", rv.TOO_MANY),
    ("bindingFailureConditions", V135,
     lambda n: slice_([device(bindingConditions=["c"], bindingFailureConditions=[f"f{i}" for i in range(n)])]),
     4, "spec.devices[0].bindingFailureConditions", rv.TOO_MANY),
    ("driver name length", V135, lambda n: slice_(driver="a" * (n - 4) + ".dev"), 63, "spec.driver", rv.TOO_LONG),
    ("attribute id length", V135, lambda n: slice_([{"name": "d", "attributes": {"a" * n: {"int": 1}}}]), 32,
     f"spec.devices[0].attributes[{'a' * 33}]", rv.TOO_LONG),
    ("attribute domain length", V135,
     lambda n: slice_([{"name": "d", "attributes": {"a" * (n - 4) + ".com/x": {"int": 1}}}]), 63,
     f"spec.devices[0].attributes[{'a' * 60}.com/x]", rv.TOO_LONG),
    ("pool name length", V135, lambda n: slice_(pool={"name": "/".join(["a" * 62] * 5)[: n - 1] + "a",
                                                      "generation": 0, "resourceSliceCount": 1}), 253,
     "spec.pool.name", rv.TOO_LONG),
    ("string attribute length", V135, lambda n: slice_([{"name": "d", "attributes": {"s": {"string": "x" * n}}}]),
     64, "spec.devices[0].attributes[s].string", rv.TOO_LONG),
    ("version attribute length", V135,
     lambda n: slice_([{"name": "d", "attributes": {"v": {"version": "1.0.0-" + "a" * (n - 6)}}}]), 64,
     "spec.devices[0].attributes[v].version", rv.TOO_LONG),
    ("device name length", V135, lambda n: slice_([device("a" * n)]), 63, "spec.devices[0].name", rv.INVALID),
    ("list attribute values (1.36)", V136_LISTS,
     lambda n: slice_([{"name": "d", "attributes": {"l": {"ints": list(range(n))}}}]), 48,
     "spec.devices[0].attributes", rv.TOO_MANY),
    ("devices with list attributes (1.36)", V136_LISTS,
     lambda n: slice_([{"name": f"d-{i}", "attributes": {"l": {"ints": [1]}}} for i in range(n)]), 64,
     "spec.devices", rv.TOO_MANY),
    ("requestPolicy validValues", V135,
     lambda n: slice_([{"name": "d", "allowMultipleAllocations": True, "capacity": {"memory": {
         "value": "80Gi", "requestPolicy": {"default": "1Gi", "validValues": [f"{i + 1}Gi" for i in range(n)]}}}}]),
     10,
     "spec.devices[0].capacity[memory].requestPolicy.validValues", rv.TOO_MANY),
    ("CEL expression length (class)", V135,
     lambda n: device_class(selectors=[{"cel": {"expression": "true" + " " * (n - 4)}}]), 10 * 1024,
     "spec.selectors[0].cel.expression", rv.TOO_LONG),
    ("selectors per class", V135, lambda n: device_class(selectors=[{"cel": {"expression": "true"}}] * n), 32,
     "spec.selectors", rv.TOO_MANY),
    ("config per class", V135, lambda n: device_class(config=[opaque()] * n), 32, "spec.config", rv.TOO_MANY),
    ("opaque parameters size", V135, lambda n: device_class(config=[opaque(n)]), 10 * 1024,
     "spec.config[0].opaque.parameters", rv.TOO_LONG),
    ("requests per claim", V135, lambda n: claim([exact(f"r-{i}") for i in range(n)]), 32,
     "spec.devices.requests", rv.TOO_MANY),
    ("constraints per claim", V135, lambda n: claim(constraints=[{"matchAttribute": "gpu.dra.dev/model"}] * n), 32,
     "spec.devices.constraints", rv.TOO_MANY),
    ("config per claim", V135, lambda n: claim(config=[opaque()] * n), 32, "spec.devices.config", rv.TOO_MANY),
    ("selectors per request", V135,
     lambda n: claim([exact("gpu", selectors=[{"cel": {"expression": "true"}}] * n)]), 32,
     "spec.devices.requests[0].exactly.selectors", rv.TOO_MANY),
    ("firstAvailable subrequests", V135,
     lambda n: claim([{"name": "gpu", "firstAvailable": [{"name": f"s-{i}", "deviceClassName": DRIVER_NAME}
                                                         for i in range(n)]}]), 8,
     "spec.devices.requests[0].firstAvailable", rv.TOO_MANY),
    ("tolerations per request", V135,
     lambda n: claim([exact("gpu", tolerations=[{"key": f"k{i}", "operator": "Exists"} for i in range(n)])]), 16,
     "spec.devices.requests[0].exactly.tolerations", rv.TOO_MANY),
    ("allocation results", V135, lambda n: allocated_claim(n), 32, "status.allocation.devices.results",
     rv.TOO_MANY),
    ("allocation config", V135,
     lambda n: _with(allocated_claim(), ["status", "allocation", "devices", "config"],
                     [{"source": "FromClaim", **opaque()}] * n), 64, "status.allocation.devices.config",
     rv.TOO_MANY),
    ("reservedFor", V135,
     lambda n: allocated_claim(reservedFor=[{"resource": "pods", "name": f"p{i}", "uid": f"u{i}"}
                                            for i in range(n)]), 256, "status.reservedFor", rv.TOO_MANY),
    ("device status conditions", V135,
     lambda n: allocated_claim(devices=[{"driver": DRIVER_NAME, "pool": "node-1", "device": "gpu-0",
                                         "conditions": [{"type": f"T{i}", "status": "True", "reason": "R",
                                                         "lastTransitionTime": "2026-01-01T00:00:00Z"}
                                                        for i in range(n)]}]),
     8, "status.devices[0].conditions", rv.TOO_MANY),
    ("networkData ips", V135,
     lambda n: allocated_claim(devices=[{"driver": DRIVER_NAME, "pool": "node-1", "device": "gpu-0",
                                         "networkData": {"ips": [f"10.0.0.{i}/24" for i in range(n)]}}]),
     16, "status.devices[0].networkData.ips", rv.TOO_MANY),
    ("networkData interfaceName", V135,
     lambda n: allocated_claim(devices=[{"driver": DRIVER_NAME, "pool": "node-1", "device": "gpu-0",
                                         "networkData": {"interfaceName": "e" * n}}]),
     256, "status.devices[0].networkData.interfaceName", rv.TOO_LONG),
    ("networkData hardwareAddress", V135,
     lambda n: allocated_claim(devices=[{"driver": DRIVER_NAME, "pool": "node-1", "device": "gpu-0",
                                         "networkData": {"hardwareAddress": "a" * n}}]),
     128, "status.devices[0].networkData.hardwareAddress", rv.TOO_LONG),
    ("device status data size", V135,
     lambda n: allocated_claim(devices=[{"driver": DRIVER_NAME, "pool": "node-1", "device": "gpu-0",
                                         "data": opaque(n)["opaque"]["parameters"]}]),
     10 * 1024, "status.devices[0].data", rv.TOO_LONG),
]


def _with(obj: Obj, path: list[str], value: Any) -> Obj:
    cur = obj
    for part in path[:-1]:
        cur = cur.setdefault(part, {})
    cur[path[-1]] = value
    return obj


@pytest.mark.parametrize(("title", "options", "build", "limit", "path", "reason"), LIMIT_CASES,
                         ids=[c[0] for c in LIMIT_CASES])
def test_limit_boundary(title: str, options: rv.ValidationOptions, build: Callable[[int], Obj], limit: int,
                        path: str, reason: str) -> None:
    at_limit = rv.validate(build(limit), options)
    assert at_limit == [], f"{title}: {limit} must be accepted, got {rv.format_errors(at_limit)}"
    past = rv.validate(build(limit + 1), options)
    assert any(e.field == path and e.reason == reason for e in past), (
        f"{title}: {limit + 1} must fail at {path} ({reason}), got {rv.format_errors(past) if past else 'no errors'}")


def codes(errors: list[rv.FieldError]) -> set[tuple[str, str]]:
    return {(e.field, e.reason) for e in errors}


def test_valid_objects_have_no_errors() -> None:
    assert rv.validate(slice_()) == []
    assert rv.validate(claim()) == []
    assert rv.validate(device_class(selectors=[{"cel": {"expression": f'device.driver == "{DRIVER_NAME}"'}}],
                                    config=[opaque()])) == []
    template = {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaimTemplate",
                "metadata": {"name": "t", "namespace": "default"},
                "spec": {"metadata": {"labels": {"app": "x"}}, "spec": claim()["spec"]}}
    assert rv.validate(template) == []


@pytest.mark.parametrize(
    ("spec", "reason"),
    [
        ({"nodeName": None}, rv.REQUIRED),  # none set
        ({"allNodes": True}, rv.INVALID),  # two set
        ({"nodeName": None, "allNodes": False}, rv.INVALID),  # false is not "set"
        ({"nodeName": None, "nodeSelector": {"nodeSelectorTerms": [{"matchExpressions": [
            {"key": "gpu", "operator": "Exists"}]}]}}, None),
        ({"nodeName": None, "allNodes": True}, None),
    ],
)
def test_exactly_one_node_selection(spec: Obj, reason: str | None) -> None:
    s = slice_()
    s["spec"].update(spec)
    s["spec"] = {k: v for k, v in s["spec"].items() if v is not None}
    errors = rv.validate(s)
    if reason is None:
        assert errors == []
    else:
        assert ("spec", reason) in codes(errors) or ("spec.allNodes", reason) in codes(errors)


def test_per_device_node_selection() -> None:
    s = slice_([device(nodeName="node-1"), device("gpu-1")], perDeviceNodeSelection=True)
    del s["spec"]["nodeName"]
    assert codes(rv.validate(s)) == {("spec.devices[1]", rv.REQUIRED)}
    plain = slice_([device(nodeName="node-1")])
    assert ("spec.devices[0].nodeName", rv.FORBIDDEN) in codes(rv.validate(plain))


def test_devices_or_shared_counters_since_1_35() -> None:
    both = slice_([device()], sharedCounters=[{"name": "gpu-0", "counters": counters(1)}])
    assert ("spec", rv.INVALID) in codes(rv.validate(both, V135))
    assert rv.validate(both, V134) == []


@pytest.mark.parametrize(
    ("attribute", "path", "reason"),
    [
        ({}, "spec.devices[0].attributes[a]", rv.REQUIRED),
        ({"int": 1, "string": "x"}, "spec.devices[0].attributes[a]", rv.INVALID),
        ({"version": "1.2"}, "spec.devices[0].attributes[a].version", rv.INVALID),
        ({"version": "01.2.3"}, "spec.devices[0].attributes[a].version", rv.INVALID),
        ({"int": True}, "spec.devices[0].attributes[a].int", rv.TYPE_INVALID),
        ({"ints": [1]}, "spec.devices[0].attributes[a].ints", rv.FORBIDDEN),  # list attributes need 1.36
    ],
)
def test_attribute_values(attribute: Obj, path: str, reason: str) -> None:
    s = slice_([{"name": "d", "attributes": {"a": attribute}}])
    assert (path, reason) in codes(rv.validate(s, V135))


def test_semver_values_accepted() -> None:
    for version in ("1.2.3", "550.54.15", "1.0.0-rc.1+build.5"):
        assert rv.validate(slice_([{"name": "d", "attributes": {"v": {"version": version}}}])) == [], version


@pytest.mark.parametrize("name", ["model", "gpu.dra.dev/model", "_x9"])
def test_qualified_attribute_names_accepted(name: str) -> None:
    assert rv.validate(slice_([{"name": "d", "attributes": {name: {"bool": True}}}])) == []


@pytest.mark.parametrize("name", ["copy-engines", "9lives", "Bad_Domain/x", "/x", "gpu.dra.dev/"])
def test_bad_attribute_names_rejected(name: str) -> None:
    errors = rv.validate(slice_([{"name": "d", "attributes": {name: {"bool": True}}}]))
    assert errors and all(e.field == f"spec.devices[0].attributes[{name}]" for e in errors)


def test_capacity_quantities_and_duplicate_names() -> None:
    s = slice_([{"name": "d", "capacity": {"memory": {"value": "80GB"}}}, device("d")])
    found = codes(rv.validate(s))
    assert ("spec.devices[0].capacity[memory].value", rv.INVALID) in found
    assert ("spec.devices[1].name", rv.DUPLICATE) in found


def test_request_policy_needs_multiple_allocations() -> None:
    s = slice_([{"name": "d", "capacity": {"memory": {"value": "1Gi", "requestPolicy": {"default": "1Gi"}}}}])
    assert ("spec.devices[0].capacity[memory].requestPolicy", rv.FORBIDDEN) in codes(rv.validate(s))


def _policy_errors(policy: Obj, value: str = "80Gi") -> set[tuple[str, str]]:
    s = slice_([{"name": "d", "allowMultipleAllocations": True,
                 "capacity": {"memory": {"value": value, "requestPolicy": policy}}}])
    return codes(rv.validate(s, V135))


POLICY = "spec.devices[0].capacity[memory].requestPolicy"


@pytest.mark.parametrize(
    ("policy", "expected"),
    [
        # What the driver publishes for a shared GPU: no max, so only min, default and step rules apply.
        ({"default": "4Gi", "validRange": {"min": "1Gi", "step": "1Gi"}}, set()),
        ({"default": "10", "validRange": {"min": "1", "max": "80", "step": "1"}}, set()),
        ({"default": "2Gi", "validValues": ["1Gi", "2Gi", "4Gi"]}, set()),
        ({"default": "4Gi"}, set()),  # a default alone is a policy: every share consumes exactly it
        # validValues xor validRange
        ({"default": "1Gi", "validValues": ["1Gi"], "validRange": {"min": "1Gi"}}, {(POLICY, rv.FORBIDDEN)}),
        # default required with either
        ({"validRange": {"min": "1Gi"}}, {(f"{POLICY}.default", rv.REQUIRED)}),
        ({"validValues": ["1Gi"]}, {(f"{POLICY}.default", rv.REQUIRED)}),
        # validRange rules
        ({"default": "1Gi", "validRange": {"step": "1Gi"}}, {(f"{POLICY}.validRange.min", rv.REQUIRED)}),
        ({"default": "90Gi", "validRange": {"min": "90Gi"}}, {(f"{POLICY}.validRange.min", rv.INVALID)}),
        ({"default": "1Gi", "validRange": {"min": "2Gi"}}, {(f"{POLICY}.validRange.min", rv.INVALID)}),
        ({"default": "2Gi", "validRange": {"min": "2Gi", "max": "1Gi"}}, {(f"{POLICY}.validRange.max", rv.INVALID)}),
        ({"default": "1Gi", "validRange": {"min": "1Gi", "max": "81Gi"}}, {(f"{POLICY}.validRange.max", rv.INVALID)}),
        ({"default": "5Gi", "validRange": {"min": "1Gi", "max": "4Gi"}}, {(f"{POLICY}.validRange.max", rv.INVALID)}),
        ({"default": "1Gi", "validRange": {"min": "1Gi", "step": "80Gi"}}, {(f"{POLICY}.validRange.step", rv.INVALID)}),
        ({"default": "1536Mi", "validRange": {"min": "1Gi", "step": "1Gi"}}, {(f"{POLICY}.validRange.step", rv.INVALID)}),
        # max - min must be a multiple of step too
        ({"default": "2Gi", "validRange": {"min": "1Gi", "max": "3584Mi", "step": "1Gi"}},
         {(f"{POLICY}.validRange.step", rv.INVALID)}),
        # validValues rules
        ({"default": "2Gi", "validValues": ["2Gi", "1Gi"]}, {(f"{POLICY}.validValues[1]", rv.INVALID)}),
        ({"default": "1Gi", "validValues": ["1Gi", "1Gi"]}, {(f"{POLICY}.validValues[1]", rv.DUPLICATE)}),
        ({"default": "1Gi", "validValues": ["1Gi", "81Gi"]}, {(f"{POLICY}.validValues[1]", rv.INVALID)}),
        ({"default": "3Gi", "validValues": ["1Gi", "2Gi"]}, {(f"{POLICY}.validValues", rv.INVALID)}),
    ],
)
def test_request_policy_rules_as_upstream(policy: Obj, expected: set[tuple[str, str]]) -> None:
    assert _policy_errors(policy) == expected


def test_request_policy_step_uses_integer_values() -> None:
    """Value() rounds up to an integer, as resource.Quantity does: 1.5 counts as 2, a multiple of step 1 from 1."""
    assert _policy_errors({"default": "1500m", "validRange": {"min": "1", "step": "1"}}, value="100") == set()


def test_taint_effect_none_since_1_35() -> None:
    s = slice_([device(taints=[{"key": "k", "effect": "None"}])])
    assert rv.validate(s, V135) == []
    assert ("spec.devices[0].taints[0].effect", rv.NOT_SUPPORTED) in codes(rv.validate(s, V134))


def test_claim_request_rules() -> None:
    both = claim([{"name": "gpu", "exactly": {"deviceClassName": "c"}, "firstAvailable": []}])
    assert ("spec.devices.requests[0]", rv.INVALID) in codes(rv.validate(both))
    neither = claim([{"name": "gpu"}])
    assert ("spec.devices.requests[0]", rv.REQUIRED) in codes(rv.validate(neither))
    admin_sub = claim([{"name": "gpu", "firstAvailable": [{"name": "a", "deviceClassName": "c",
                                                            "adminAccess": True}]}])
    assert ("spec.devices.requests[0].firstAvailable[0].adminAccess", rv.FORBIDDEN) in codes(rv.validate(admin_sub))
    all_with_count = claim([exact("gpu", allocationMode="All", count=2)])
    assert ("spec.devices.requests[0].exactly.count", rv.INVALID) in codes(rv.validate(all_with_count))
    dup = claim([exact("gpu"), exact("gpu")])
    assert ("spec.devices.requests[1].name", rv.DUPLICATE) in codes(rv.validate(dup))


def test_constraint_and_config_references() -> None:
    c = claim([exact("gpu"), {"name": "alt", "firstAvailable": [{"name": "big", "deviceClassName": "c"}]}],
              constraints=[{"requests": ["gpu", "alt/big", "nope"], "matchAttribute": "gpu.dra.dev/model"},
                           {"matchAttribute": "model"}],
              config=[{"requests": ["alt/small"], **opaque()}])
    found = codes(rv.validate(c))
    assert ("spec.devices.constraints[0].requests[2]", rv.INVALID) in found
    assert ("spec.devices.constraints[1].matchAttribute", rv.INVALID) in found  # needs a domain
    assert ("spec.devices.config[0].requests[0]", rv.INVALID) in found
    assert ("spec.devices.constraints[0].requests[1]", rv.INVALID) not in found


def test_updates_keep_immutable_fields() -> None:
    old = slice_()
    new = copy.deepcopy(old)
    new["spec"]["driver"] = "other.dev"
    new["spec"]["pool"]["name"] = "other"
    found = codes(rv.validate_resource_slice_update(new, old))
    assert {("spec.driver", rv.INVALID), ("spec.pool.name", rv.INVALID)} <= found
    old_claim = claim()
    new_claim = claim([exact("gpu", count=2)])
    assert ("spec", rv.INVALID) in codes(rv.validate_resource_claim_update(new_claim, old_claim))


def test_claim_status_rules() -> None:
    stray = allocated_claim(devices=[{"driver": DRIVER_NAME, "pool": "node-1", "device": "gpu-7"}])
    assert ("status.devices[0]", rv.INVALID) in codes(rv.validate(stray))
    unallocated = claim()
    unallocated["status"] = {"reservedFor": [{"resource": "pods", "name": "p", "uid": "u"}]}
    assert ("status.reservedFor", rv.FORBIDDEN) in codes(rv.validate(unallocated))
    old = allocated_claim(1)
    changed = allocated_claim(2)
    assert ("status.allocation", rv.INVALID) in codes(rv.validate_resource_claim_status_update(changed, old))
    cleared = claim()
    cleared["status"] = {}
    assert rv.validate_resource_claim_status_update(cleared, old) == []


def test_unknown_fields_are_found_and_pruned() -> None:
    s = slice_([device(atributes={})], nodename="x")
    s["metadata"]["lables"] = {}
    pruned, dropped = rv.prune_unknown_fields(s)
    assert dropped == ["metadata.lables", "spec.devices[0].atributes", "spec.nodename"]
    assert "nodename" not in pruned["spec"] and "atributes" not in pruned["spec"]["devices"][0]
    assert rv.unknown_fields(slice_()) == []
    list_attr = slice_([{"name": "d", "attributes": {"l": {"ints": [1]}}}])
    assert rv.unknown_fields(list_attr, options=V135) == ["spec.devices[0].attributes[l].ints"]
    assert rv.unknown_fields(list_attr, options=V136) == []


def test_wrong_json_types_are_errors_not_crashes() -> None:
    s = slice_()
    s["spec"]["devices"] = {"gpu-0": {}}
    s["spec"]["pool"] = "node-1"
    found = codes(rv.validate(s))
    assert ("spec.devices", rv.TYPE_INVALID) in found
    assert ("spec.pool", rv.TYPE_INVALID) in found


def test_error_messages_read_like_the_apiserver() -> None:
    err = rv.validate(slice_(driver="GPU"))[0]
    assert str(err).startswith('spec.driver: Invalid value: "GPU": a lowercase RFC 1123 subdomain')
    too_many = rv.FieldError("spec.devices", rv.TOO_MANY, "must have at most 128 items", 129)
    assert str(too_many) == "spec.devices: Too many: 129: must have at most 128 items"
    assert rv.validate({"kind": "Pod"})[0].reason == rv.NOT_SUPPORTED


def test_cel_hook_is_called() -> None:
    seen: list[str] = []

    def check(expr: str) -> str | None:
        seen.append(expr)
        return "undeclared reference to 'devise'" if "devise" in expr else None

    opts = rv.ValidationOptions(cel_check=check)
    bad = device_class(selectors=[{"cel": {"expression": "devise.driver == 'x'"}}])
    assert ("spec.selectors[0].cel.expression", rv.INVALID) in codes(rv.validate(bad, opts))
    assert seen == ["devise.driver == 'x'"]


@pytest.mark.parametrize(
    ("text", "value"),
    [("40Gi", Fraction(40 * 2**30)), ("500m", Fraction(1, 2)), ("1e3", Fraction(1000)), ("1.5", Fraction(3, 2)),
     ("-2k", Fraction(-2000)), (".5Ki", Fraction(512)), (7, Fraction(7)), ("5.", Fraction(5))],
)
def test_parse_quantity(text: object, value: Fraction) -> None:
    assert rv.parse_quantity(text) == value


@pytest.mark.parametrize("text", ["", "Gi", "1.2.3", "1GB", "abc", "1 Gi", True, None, "1e"])
def test_parse_quantity_rejects(text: object) -> None:
    with pytest.raises(ValueError, match="quantit"):
        rv.parse_quantity(text)


def test_kube_version_parsing() -> None:
    assert rv.parse_kube_version("v1.36.2") == (1, 36)
    assert rv.limits_for((1, 34)).max_taints == 4
    with pytest.raises(ValueError, match=r"1\.35\.0"):
        rv.parse_kube_version("latest")


def test_object_meta_checks() -> None:
    found = codes(rv.validate_object_meta({"name": "Bad_Name", "labels": {"a/b/c": "x", "ok": "-bad"},
                                           "ownerReferences": [{"kind": "Node"}]}))
    assert ("metadata.name", rv.INVALID) in found
    assert ("metadata.labels", rv.INVALID) in found
    assert ("metadata.labels[ok]", rv.INVALID) in found
    assert ("metadata.ownerReferences[0].uid", rv.REQUIRED) in found
    assert ("metadata.name", rv.REQUIRED) in codes(rv.validate_object_meta({}))
    assert rv.validate_object_meta({"generateName": "x-"}) == []


@pytest.mark.parametrize(
    ("options", "allowed"),
    [
        (V135, False),
        (V136, False),  # DRAListTypeAttributes is alpha, off by default
        (V136_LISTS, True),
        (rv.ValidationOptions(kube_version=(1, 37), list_type_attributes=True), True),
        (rv.ValidationOptions(kube_version=(1, 35), list_type_attributes=True), False),  # no such gate before 1.36
    ],
)
def test_list_attributes_need_136_and_the_gate(options: rv.ValidationOptions, allowed: bool) -> None:
    obj = slice_([{"name": "d", "attributes": {"resource.kubernetes.io/numaNode": {"ints": [0, 1]}}}])
    errors = rv.validate(obj, options)
    if allowed:
        assert errors == []
    else:
        path = "spec.devices[0].attributes[resource.kubernetes.io/numaNode]"
        assert [e.field for e in errors] == [f"{path}.ints", path]  # forbidden, then no value left
        assert "DRAListTypeAttributes" in errors[0].detail
