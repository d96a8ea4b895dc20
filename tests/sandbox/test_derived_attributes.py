"""KEP-6080 derived attributes in the imitation, as kube-apiserver and kube-scheduler 1.37 serve them: with
DRADerivedAttributes on the API server keeps `derivedAttributes` (and refuses a bad one) and the scheduler compares
their values; with it off the API server drops them without a word (the field is known, so strict decoding keeps
quiet) and a scheduler without the gate refuses a claim that still has them."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from dra_driver.cel import DraCelEnvironment
from dra_driver.defaults import DRIVER_NAME
from dra_driver.k8s.client import ApiError, KubeRest
from dra_sandbox.apiserver import ApiServer
from dra_sandbox.scheduler import plan_pod

CLAIMS = "/apis/resource.k8s.io/v1/namespaces/default/resourceclaims"
SOCKET = "example.com/socket"
ROOT = f'device.attributes["{DRIVER_NAME}"].pcieRoot'
EXPRESSION = f'{ROOT}.startsWith("pci0000:8") ? 1 : 0'
GATE = "DRADerivedAttributes"


def _claim(name: str = "c", derived: list[dict[str, Any]] | None = None,
           constraints: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    exactly: dict[str, Any] = {"deviceClassName": "gpu.dra.dev", "count": 2}
    if derived is not None:
        exactly["derivedAttributes"] = derived
    return {
        "apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
        "metadata": {"name": name, "namespace": "default", "uid": f"uid-{name}"},
        "spec": {"devices": {"requests": [{"name": "gpu", "exactly": exactly}],
                             "constraints": [{"matchAttribute": SOCKET}] if constraints is None else constraints}},
    }


SOCKET_ATTRIBUTE = [{"name": SOCKET, "expression": EXPRESSION}]


@pytest.fixture(scope="module", params=[True, False], ids=["gate-on", "gate-off"])
def rest(request: pytest.FixtureRequest) -> Iterator[tuple[KubeRest, bool]]:
    with ApiServer(garbage_collection=False, kube_version="1.37.2", feature_gates={GATE: request.param}) as srv:
        yield srv.rest(), request.param


def test_the_api_server_keeps_derived_attributes_only_with_the_gate(rest: tuple[KubeRest, bool]) -> None:
    client, on = rest
    stored = client.request("POST", CLAIMS, body=_claim("kept", SOCKET_ATTRIBUTE), query={"fieldValidation": "Strict"})
    exactly = stored["spec"]["devices"]["requests"][0]["exactly"]
    assert exactly.get("derivedAttributes") == (SOCKET_ATTRIBUTE if on else None)


@pytest.mark.parametrize(
    ("derived", "field", "words"),
    [
        ([{"name": "example.com/other", "expression": "1"}], "derivedAttributes[0].name",
         "must be referenced by at least one matchAttribute or distinctAttribute constraint"),
        ([{"name": SOCKET, "expression": "1.5"}], "derivedAttributes[0].expression",
         "must evaluate to a primitive scalar"),
        ([{"name": "socket", "expression": "1"}], "derivedAttributes[0].name", ""),
        ([{"name": SOCKET}], "derivedAttributes[0].expression", ""),
    ],
)
def test_a_bad_derived_attribute_is_refused_with_the_gate_on(
        rest: tuple[KubeRest, bool], derived: list[dict[str, Any]], field: str, words: str) -> None:
    client, on = rest
    if not on:
        pytest.skip("with the gate off the field is dropped before validation")
    with pytest.raises(ApiError) as caught:
        client.request("POST", CLAIMS, body=_claim("bad", derived))
    assert caught.value.status == 422
    causes = (caught.value.body or {}).get("details", {}).get("causes", [])
    assert any(c["field"] == f"spec.devices.requests[0].exactly.{field}" and words in c["message"] for c in causes), \
        causes


# -- the scheduler -------------------------------------------------------------------------------


def _device(name: str, root: str) -> dict[str, Any]:
    return {"name": name, "attributes": {"pcieRoot": {"string": root}}}


SLICE = {
    "apiVersion": "resource.k8s.io/v1", "kind": "ResourceSlice", "metadata": {"name": "n1-gpus"},
    "spec": {"driver": DRIVER_NAME, "nodeName": "n1", "pool": {"name": "n1", "generation": 1, "resourceSliceCount": 1},
             "devices": [_device("gpu-0", "pci0000:00"), _device("gpu-1", "pci0000:80"),
                         _device("gpu-2", "pci0000:01")]},
}
CLASS = {"apiVersion": "resource.k8s.io/v1", "kind": "DeviceClass", "metadata": {"name": "gpu.dra.dev"},
         "spec": {"selectors": [{"cel": {"expression": f'device.driver == "{DRIVER_NAME}"'}}]}}
NODE = {"apiVersion": "v1", "kind": "Node", "metadata": {"name": "n1", "labels": {}},
        "status": {"allocatable": {"cpu": "8", "memory": "32Gi", "pods": "110"}}}


def _plan(gates: dict[str, bool]) -> Any:
    return plan_pod({"metadata": {"name": "p", "namespace": "default"}, "spec": {}}, [_claim("c", SOCKET_ATTRIBUTE)],
                    nodes=[NODE], classes=[CLASS], slices=[SLICE], allocated_claims=[], namespace_labels={},
                    cel=DraCelEnvironment(kubernetes_minor=37), kube_version=(1, 37), feature_gates=gates)


def test_the_scheduler_compares_the_derived_values_with_the_gate() -> None:
    plan = _plan({GATE: True})
    assert plan.node == "n1"
    devices = [r["device"] for r in plan.allocations["c"]["devices"]["results"]]
    assert devices == ["gpu-0", "gpu-2"]  # gpu-0 and gpu-1 come first but sit on different sockets


def test_a_scheduler_without_the_gate_refuses_the_claim() -> None:
    plan = _plan({})
    assert plan.node is None
    assert "derived attributes, but the DRADerivedAttributes feature is disabled" in plan.device_reasons["n1"][1]
