"""The walks of allocation results read claims through the one parser: ownership rebuild, policy counts, the
allocator's devices in use."""

from __future__ import annotations

from typing import Any

import pytest

from dra_driver.allocation.inuse import gather_in_use
from dra_driver.plugin.ownership import claims_allocated_here
from dra_driver.policy.counts import claim_classes
from dra_driver.resourceapi import DeviceId, InvalidObjectError

D = "gpu.dra.dev"
UID = "1c2d3e4f-0000-4000-8000-000000000001"


def _claim(name: str, results: list[dict[str, Any]], uid: str = UID) -> dict[str, Any]:
    requests = [{"name": "gpu", "exactly": {"deviceClassName": "gpu.dra.dev"}},
                {"name": "any", "firstAvailable": [{"name": "small", "deviceClassName": "mig-small"}]}]  # fmt: skip
    return {
        "metadata": {"namespace": "ml", "name": name, "uid": uid},
        "spec": {"devices": {"requests": requests}},
        "status": {"allocation": {"devices": {"results": results}}},
    }


def _result(device: str, *, pool: str = "node-1", driver: str = D, request: str = "gpu", **extra: Any) -> Any:
    return {"request": request, "driver": driver, "pool": pool, "device": device, **extra}


def test_ownership_takes_this_drivers_results_in_this_pool() -> None:
    claim = _claim("c", [_result("gpu-0"), _result("gpu-1", pool="node-2"), _result("x", driver="other.dev")])
    found = claims_allocated_here([claim, _claim("bad name!", [_result("gpu-2")])], D, "node-1")
    assert [(uid, c.devices) for uid, c in found.items()] == [(UID, ("gpu-0",))]


def test_ownership_is_unknown_when_a_claim_cannot_be_read() -> None:
    broken = _claim("c", [{"driver": D, "pool": "node-1", "device": "gpu-0"}])  # no request
    with pytest.raises(InvalidObjectError, match=r"ResourceClaim ml/c: status.allocation.devices.results\[0\].request"):
        claims_allocated_here([broken], D, "node-1")


def test_policy_counts_read_the_class_of_each_result() -> None:
    claim = _claim("c", [_result("gpu-0"), _result("gpu-1-mig", request="any/small")])
    assert claim_classes(claim) == {"gpu.dra.dev", "mig-small"}
    assert claim_classes({"metadata": {"name": "c"}, "status": {"allocation": "?"}}) == frozenset()


def test_devices_in_use_skip_admin_access_and_sum_shares() -> None:
    claims = [
        _claim("a", [_result("gpu-0"), _result("gpu-1", adminAccess=True)]),
        _claim("b", [_result("gpu-2", shareID="s1", consumedCapacity={"memory": "1Gi"})]),
        _claim("c", [_result("gpu-2", shareID="s2", consumedCapacity={f"{D}/memory": "2Gi"})]),
    ]
    in_use = gather_in_use(claims, skip_claims={"ml/c"})
    assert in_use.exclusive == {DeviceId(D, "node-1", "gpu-0"): "ml/a"}
    assert in_use.shared == {DeviceId(D, "node-1", "gpu-2"): {f"{D}/memory": 2**30 * 10**9}}
    assert in_use.share_holders == {DeviceId(D, "node-1", "gpu-2"): ("ml/b",)}
