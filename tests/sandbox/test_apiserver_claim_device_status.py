"""ResourceClaim `status.devices` (KEP-4817) on the sandbox API server, as upstream checks and strips it:
pkg/apis/resource/validation/validation.go validateDeviceStatus (with apimachinery's ValidateConditions) and
pkg/registry/resource/resourceclaim/strategy.go dropDeallocatedStatusDevices."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from dra_driver.defaults import DRIVER_NAME
from dra_driver.k8s.client import ApiError, JsonObject, KubeRest
from dra_sandbox.apiserver import ApiServer
from dra_sandbox.objects import create_allocated_claim
from tests.narrow import present

CLAIMS = "/apis/resource.k8s.io/v1/namespaces/default/resourceclaims"
MERGE = "application/merge-patch+json"
SHARE = "6f1d2c3e-0000-4000-8000-000000000001"
T = "2026-07-01T00:00:00Z"


@pytest.fixture(scope="module")
def api() -> Iterator[KubeRest]:
    with ApiServer(kube_version="1.37.0") as srv:
        yield srv.rest()


def _ready(**overrides: Any) -> JsonObject:
    return {"type": "Ready", "status": "True", "reason": "Prepared", "lastTransitionTime": T, **overrides}


def _entry(device: str = "gpu-0", **extra: Any) -> JsonObject:
    return {"driver": DRIVER_NAME, "pool": "n1", "device": device, "conditions": [_ready()], **extra}


def _claim(api: KubeRest, name: str, **kwargs: Any) -> JsonObject:
    return create_allocated_claim(api, namespace="default", name=name, driver=DRIVER_NAME, pool="n1",
                                  devices=kwargs.pop("devices", ["gpu-0"]), **kwargs)


def _patch(api: KubeRest, name: str, devices: Any) -> JsonObject:
    return api.request("PATCH", f"{CLAIMS}/{name}/status", body={"status": {"devices": devices}}, content_type=MERGE)


def _refusal(api: KubeRest, name: str, devices: Any) -> str:
    with pytest.raises(ApiError) as caught:
        _patch(api, name, devices)
    assert caught.value.status == 422, caught.value
    return str(caught.value)


def test_an_entry_for_an_allocated_device_is_stored(api: KubeRest) -> None:
    _claim(api, "ok", devices=["gpu-0", "gpu-0-shared"], result_fields=[{}, {"shareID": SHARE}])
    stored = _patch(api, "ok", [_entry(data={"uuid": "GPU-1"}), _entry("gpu-0-shared", shareID=SHARE)])
    assert [e["device"] for e in stored["status"]["devices"]] == ["gpu-0", "gpu-0-shared"]


@pytest.mark.parametrize(("entry", "message"), [
    (_entry("gpu-7"), f'status.devices[0]: Invalid value: {DRIVER_NAME}/n1/gpu-7: must be an allocated device in '
                      "the claim"),
    (_entry(shareID=SHARE), f"status.devices[0]: Invalid value: {DRIVER_NAME}/n1/gpu-0/{SHARE}: must be an "
                            "allocated device in the claim"),
    (_entry(shareID="ABC"), 'status.devices[0].shareID: Invalid value: "ABC": error validating uid: invalid UUID '
                            "length: 3"),
    (_entry(shareID=SHARE.upper()), "uid must be in RFC 4122 normalized form"),
    (_entry("GPU_0"), 'status.devices[0].device: Invalid value: "GPU_0": a lowercase RFC 1123 label'),
    (_entry(conditions=[_ready(reason="")]), "status.devices[0].conditions[0].reason: Required value: must be set"),
    (_entry(conditions=[_ready(reason="not ok")]), "a condition reason must start with alphabetic character"),
    (_entry(conditions=[_ready(lastTransitionTime=None)]),
     "status.devices[0].conditions[0].lastTransitionTime: Required value: must be set"),
    (_entry(conditions=[_ready(status="Yes")]),
     'status.devices[0].conditions[0].status: Unsupported value: "Yes": supported values: "False", "True", '
     '"Unknown"'),
    (_entry(conditions=[_ready(), _ready()]), 'status.devices[0].conditions[1].type: Duplicate value: "Ready"'),
    (_entry(conditions=[_ready(type=f"T{i}") for i in range(9)]),
     "status.devices[0].conditions: Too many: 9: must have at most 8 items"),
    (_entry(conditions=[_ready(message="m" * (32 * 1024 + 1))]),
     "status.devices[0].conditions[0].message: Too long: may not be more than 32768 bytes"),
    (_entry(data={"blob": "x" * 10240}), "status.devices[0].data: Too long: may not be more than 10240 bytes"),
    (_entry(data=[1]), 'status.devices[0].data: Invalid value: "<value omitted>": must be a valid JSON object'),
    (_entry(networkData={"interfaceName": "i" * 257}),
     "status.devices[0].networkData.interfaceName: Too long: may not be more than 256 bytes"),
])  # fmt: skip
def test_entries_are_refused_as_upstream_refuses_them(api: KubeRest, entry: JsonObject, message: str) -> None:
    name = f"bad-{abs(hash(message)) % 10**8}"
    _claim(api, name)
    assert message in _refusal(api, name, [entry])


def test_two_entries_for_one_device_are_a_duplicate(api: KubeRest) -> None:
    _claim(api, "dup")
    assert f"status.devices[1]: Duplicate value: {DRIVER_NAME}/n1/gpu-0" in _refusal(api, "dup", [_entry(), _entry()])


def test_entries_of_deallocated_devices_are_dropped_on_status_update(api: KubeRest) -> None:
    """The status strategy strips them before validating, so a client unaware of status.devices (the scheduler,
    deallocating) is not refused for leaving them behind."""
    _claim(api, "dealloc")
    _patch(api, "dealloc", [_entry(data={"uuid": "GPU-1"})])
    claim = present(api.get(f"{CLAIMS}/dealloc"))
    del claim["status"]["allocation"]
    stored = api.request("PUT", f"{CLAIMS}/dealloc/status", body=claim)
    assert "devices" not in stored.get("status", {}), stored
