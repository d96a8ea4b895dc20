"""The one ResourceClaim parser: a complete claim reads back as values, and every malformed field it reads is
refused with the claim, the field path and the problem."""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Any

import pytest

from dra_driver.claimconfig.api import GpuConfig, MigDeviceConfig, SharingStrategy
from dra_driver.claimconfig.resolve import configs_for
from dra_driver.k8s.quantity import parse_quantity
from dra_driver.resourceapi import (
    AllocatedDeviceStatus,
    ConsumerReference,
    DeviceCondition,
    DeviceId,
    InvalidObjectError,
    NetworkData,
    parse_resource_claim,
)

D = "gpu.dra.dev"
Json = dict[str, Any]


def _claim() -> Json:
    mps = {"apiVersion": f"{D}/v1beta1", "kind": "GpuConfig", "sharing": {"strategy": "MPS"}}
    return {
        "metadata": {"namespace": "ml", "name": "train", "uid": "u-1"},
        "spec": {
            "devices": {
                "requests": [
                    {"name": "gpu", "exactly": {"deviceClassName": "gpu.dra.dev", "count": 2,
                                                "selectors": [{"cel": {"expression": "true"}}],
                                                "tolerations": [{"key": "k", "operator": "Exists"}],
                                                "capacity": {"requests": {"memory": "10Gi"}}}},
                    {"name": "any", "firstAvailable": [{"name": "big", "deviceClassName": "mig-big"},
                                                       {"name": "small", "deviceClassName": "mig-small"}]},
                ],
                "constraints": [{"requests": ["gpu"], "matchAttribute": f"{D}/productName"}],
                "config": [{"requests": ["gpu"], "opaque": {"driver": D, "parameters": mps}}],
            }
        },
        "status": {
            "allocation": {
                "devices": {
                    "results": [
                        {"request": "gpu", "driver": D, "pool": "node-1", "device": "gpu-0-shared", "shareID": "s-1",
                         "consumedCapacity": {"memory": "10Gi"}, "tolerations": [{"key": "k", "operator": "Exists"}],
                         "bindingConditions": ["Ready"], "bindingFailureConditions": ["Failed"]},
                        {"request": "any/small", "driver": D, "pool": "node-1", "device": "gpu-1-mig-1g",
                         "adminAccess": True},
                        {"request": "gpu", "driver": "other.dev", "pool": "node-1", "device": "x"},
                        {"request": "gpu", "driver": D, "pool": "node-2", "device": "gpu-0"},
                    ],
                    "config": [
                        {"source": "FromClass", "opaque": {"driver": "other.dev", "parameters": {}}},
                        {"source": "FromClaim", "requests": ["gpu"], "opaque": {"driver": D, "parameters": mps}},
                    ],
                },
                "nodeSelector": {"nodeSelectorTerms": []},
            },
            "reservedFor": [{"resource": "pods", "name": "p", "uid": "pu"}],
            "devices": [
                {"driver": D, "pool": "node-1", "device": "gpu-0-shared", "shareID": "s-1", "data": {"x": 1},
                 "conditions": [{"type": "Ready", "status": "True", "reason": "Prepared"}],
                 "networkData": {"interfaceName": "eth1", "ips": ["10.0.0.2/24"], "hardwareAddress": "aa:bb"}},
            ],
        },
    }


def test_a_complete_claim_reads_back_as_values() -> None:
    claim = parse_resource_claim(_claim())
    assert (claim.key, claim.uid) == ("ml/train", "u-1")
    gpu, any_ = claim.requests
    assert (gpu.alternatives[0].count, gpu.alternatives[0].selectors) == (2, ("true",))
    assert gpu.alternatives[0].capacity == {"memory": parse_quantity("10Gi")}
    assert [a.class_name for a in any_.alternatives] == ["mig-big", "mig-small"] and any_.first_available
    assert str(claim.constraints[0]) == f"matchAttribute {D}/productName (requests: gpu)"
    assert claim.config[0].source is None and claim.config[0].requests == ("gpu",)
    shared, mig, _, _ = claim.results
    assert shared.id == DeviceId(D, "node-1", "gpu-0-shared") and shared.share_id == "s-1"
    assert shared.consumed_capacity == {"memory": parse_quantity("10Gi")}
    assert (shared.binding_conditions, shared.binding_failure_conditions) == (("Ready",), ("Failed",))
    assert shared.tolerations[0].operator == "Exists" and not shared.admin_access
    assert (mig.admin_access, mig.share_id, mig.request_name, mig.path) == (
        True, None, "any", "status.allocation.devices.results[1]")  # fmt: skip
    assert [claim.device_class_of(r) for r in (shared, mig)] == ["gpu.dra.dev", "mig-small"]
    assert claim.reserved_for == (ConsumerReference("", "pods", "p", "pu"),)
    assert claim.devices == (
        AllocatedDeviceStatus(D, "node-1", "gpu-0-shared", "s-1", (DeviceCondition("Ready", "True", "Prepared", ""),),
                              {"x": 1}, NetworkData("eth1", ("10.0.0.2/24",), "aa:bb")),
    )  # fmt: skip
    assert claim.allocation is not None and claim.allocation.node_selector == {"nodeSelectorTerms": []}


def test_this_drivers_results_with_its_configs() -> None:
    claim = parse_resource_claim(_claim())
    ours = claim.for_driver(D, "node-1")
    assert [r.device for r in ours.results] == ["gpu-0-shared", "gpu-1-mig-1g"]
    assert [(c.source, c.path) for c in ours.configs] == [("FromClaim", "status.allocation.devices.config[1]")]
    kinds = {"gpu-0-shared": "gpu", "gpu-1-mig-1g": "mig"}
    gpu, mig = configs_for(ours.configs, ours.results, lambda r: kinds[r.device])
    assert isinstance(gpu, GpuConfig) and gpu.sharing.strategy is SharingStrategy.MPS
    assert mig == MigDeviceConfig()  # the entry names request "gpu" only


def test_an_unallocated_claim_has_no_results() -> None:
    claim = parse_resource_claim({"metadata": {"name": "c"}})
    assert (claim.namespace, claim.allocation, claim.results, claim.for_driver(D, "p").results) == (
        "default", None, (), ())  # fmt: skip


def _set(path: str, value: Any) -> Callable[[Json], None]:
    """Set (or with value DELETE, remove) the field at a dotted path with [i] list indexes."""

    def edit(obj: Json) -> None:
        keys: list[str | int] = []
        for part in path.split("."):
            name, _, index = part.partition("[")
            keys.append(name)
            if index:
                keys.append(int(index.rstrip("]")))
        node: Any = obj
        for key in keys[:-1]:
            node = node[key]
        if value is DELETE:
            del node[keys[-1]]
        else:
            node[keys[-1]] = value

    return edit


DELETE: Any = object()
RESULT = "status.allocation.devices.results[0]"
CONFIG = "status.allocation.devices.config[1]"
REQUEST = "spec.devices.requests[0]"
DEVICE = "status.devices[0]"

BAD: list[tuple[str, Any, str, str]] = [
    # (field, value, path in the message, problem)
    ("metadata", DELETE, "metadata", "is required (an object)"),
    ("metadata.name", 7, "metadata.name", "must be a string, got int 7"),
    ("metadata.uid", ["u"], "metadata.uid", "must be a string, got list ['u']"),
    ("spec", "x", "spec", "must be an object, got str"),
    ("spec.devices.requests", {}, "spec.devices.requests", "must be a list, got dict"),
    (f"{REQUEST}.name", "", f"{REQUEST}.name", "is required (a non-empty string)"),
    ("spec.devices.requests[1].name", "gpu", "spec.devices.requests[1].name",
     "duplicate request name 'gpu'; request names must be unique"),
    (f"{REQUEST}.firstAvailable", [{"name": "a", "deviceClassName": "c"}], REQUEST,
     "set exactly one of 'exactly' and 'firstAvailable'"),
    (f"{REQUEST}.exactly.deviceClassName", None, f"{REQUEST}.exactly.deviceClassName",
     "is required (a non-empty string)"),
    (f"{REQUEST}.exactly.count", 0, f"{REQUEST}.exactly.count", "must be >= 1 for ExactCount, got 0"),
    (f"{REQUEST}.exactly.count", "2", f"{REQUEST}.exactly.count", "must be an integer, got str '2'"),
    (f"{REQUEST}.exactly.allocationMode", "Some", f"{REQUEST}.exactly.allocationMode",
     "must be ExactCount or All, got 'Some'"),
    (f"{REQUEST}.exactly.selectors[0].cel", None, f"{REQUEST}.exactly.selectors[0].cel", "is required (an object)"),
    (f"{REQUEST}.exactly.tolerations[0].operator", "In", f"{REQUEST}.exactly.tolerations[0].operator",
     "must be Equal or Exists, got 'In'"),
    (f"{REQUEST}.exactly.capacity.requests.memory", "ten", f"{REQUEST}.exactly.capacity.requests.memory", ""),
    (f"{REQUEST}.exactly.adminAccess", "yes", f"{REQUEST}.exactly.adminAccess", "must be true or false, got 'yes'"),
    ("spec.devices.requests[1].firstAvailable[0].adminAccess", True,
     "spec.devices.requests[1].firstAvailable[0].adminAccess", "is not allowed on a firstAvailable subrequest"),
    ("spec.devices.constraints[0].matchAttribute", "productName", "spec.devices.constraints[0].matchAttribute",
     "'productName' must be fully qualified (<domain>/<name>)"),
    ("spec.devices.constraints[0].distinctAttribute", f"{D}/uuid", "spec.devices.constraints[0]",
     "set exactly one of matchAttribute and distinctAttribute"),
    ("spec.devices.constraints[0].requests", [1], "spec.devices.constraints[0].requests[0]",
     "must be a string, got int 1"),
    ("spec.devices.config[0].opaque.driver", None, "spec.devices.config[0].opaque.driver",
     "is required (a non-empty string)"),
    ("status.allocation", [], "status.allocation", "must be an object, got list"),
    ("status.allocation.devices.results", {}, "status.allocation.devices.results", "must be a list, got dict"),
    (RESULT, "gpu-0", RESULT, "must be an object, got str"),
    (f"{RESULT}.request", None, f"{RESULT}.request", "is required (a non-empty string)"),
    (f"{RESULT}.driver", None, f"{RESULT}.driver", "is required (a non-empty string)"),
    (f"{RESULT}.pool", 3, f"{RESULT}.pool", "must be a string, got int 3"),
    (f"{RESULT}.device", "", f"{RESULT}.device", "is required (a non-empty string)"),
    (f"{RESULT}.adminAccess", "true", f"{RESULT}.adminAccess", "must be true or false, got 'true'"),
    (f"{RESULT}.shareID", 5, f"{RESULT}.shareID", "must be a string, got int 5"),
    (f"{RESULT}.consumedCapacity", ["10Gi"], f"{RESULT}.consumedCapacity", "must be an object, got list"),
    (f"{RESULT}.consumedCapacity.memory", True, f"{RESULT}.consumedCapacity.memory",
     "must be a quantity string such as '40Gi', got True"),
    (f"{RESULT}.tolerations[0].operator", "Gt", f"{RESULT}.tolerations[0].operator",
     "must be Equal or Exists, got 'Gt'"),
    (f"{RESULT}.bindingConditions", "Ready", f"{RESULT}.bindingConditions", "must be a list, got str"),
    (f"{RESULT}.bindingFailureConditions", [""], f"{RESULT}.bindingFailureConditions[0]",
     "is required (a non-empty string)"),
    (f"{CONFIG}.source", DELETE, f"{CONFIG}.source", "is required (a non-empty string)"),
    (f"{CONFIG}.source", "FromNode", f"{CONFIG}.source", "must be FromClass or FromClaim, got 'FromNode'"),
    (f"{CONFIG}.requests", "gpu", f"{CONFIG}.requests", "must be a list, got str"),
    (f"{CONFIG}.opaque", "x", f"{CONFIG}.opaque", "must be an object, got str"),
    (f"{CONFIG}.opaque.driver", None, f"{CONFIG}.opaque.driver", "is required (a non-empty string)"),
    ("status.allocation.nodeSelector", "n1", "status.allocation.nodeSelector", "must be an object, got str"),
    ("status.reservedFor", {}, "status.reservedFor", "must be a list, got dict"),
    ("status.reservedFor[0].resource", None, "status.reservedFor[0].resource", "is required (a non-empty string)"),
    ("status.reservedFor[0].name", None, "status.reservedFor[0].name", "is required (a non-empty string)"),
    ("status.reservedFor[0].uid", None, "status.reservedFor[0].uid", "is required (a non-empty string)"),
    ("status.reservedFor[0].apiGroup", 1, "status.reservedFor[0].apiGroup", "must be a string, got int 1"),
    ("status.devices", "x", "status.devices", "must be a list, got str"),
    (f"{DEVICE}.driver", None, f"{DEVICE}.driver", "is required (a non-empty string)"),
    (f"{DEVICE}.pool", None, f"{DEVICE}.pool", "is required (a non-empty string)"),
    (f"{DEVICE}.device", None, f"{DEVICE}.device", "is required (a non-empty string)"),
    (f"{DEVICE}.shareID", 1, f"{DEVICE}.shareID", "must be a string, got int 1"),
    (f"{DEVICE}.conditions[0].type", None, f"{DEVICE}.conditions[0].type", "is required (a non-empty string)"),
    (f"{DEVICE}.conditions[0].status", None, f"{DEVICE}.conditions[0].status", "is required (a non-empty string)"),
    (f"{DEVICE}.conditions[0].message", 1, f"{DEVICE}.conditions[0].message", "must be a string, got int 1"),
    (f"{DEVICE}.networkData", [], f"{DEVICE}.networkData", "must be an object, got list"),
    (f"{DEVICE}.networkData.ips", "10.0.0.2", f"{DEVICE}.networkData.ips", "must be a list, got str"),
]  # fmt: skip


@pytest.mark.parametrize(("field", "value", "path", "problem"), BAD, ids=[f"{b[0]}=" + ("<deleted>" if b[1] is DELETE else repr(b[1])) for b in BAD])
def test_every_bad_field_is_named(field: str, value: Any, path: str, problem: str) -> None:
    obj = copy.deepcopy(_claim())
    _set(field, value)(obj)
    with pytest.raises(InvalidObjectError) as err:
        parse_resource_claim(obj)
    name = "<unnamed>" if field in ("metadata", "metadata.name") else "ml/train"
    assert (err.value.obj, err.value.path) == (f"ResourceClaim {name}", path)
    assert err.value.problem == problem or (not problem and err.value.problem)
    assert str(err.value).startswith(f"ResourceClaim {name}: {path}: ")


def test_not_an_object_at_all() -> None:
    with pytest.raises(InvalidObjectError, match=r"ResourceClaim <unnamed>: \(the object\): must be an object, got list"):
        parse_resource_claim([])  # type: ignore[arg-type]
