"""Admission over HTTP: resource.k8s.io objects get the full rule book (422 Invalid with causes), other
kinds get metadata checks; the reported Kubernetes version picks the rule set."""

from __future__ import annotations

import json
from typing import Any

import kubernetes.client as k
import pytest
from kubernetes.client.exceptions import ApiException

from dra_driver.defaults import DRIVER_NAME
from dra_sandbox.apiserver import ApiServer
from tests.kube_models import name_of
from tests.narrow import present


def status_of(err: pytest.ExceptionInfo[ApiException]) -> dict[str, Any]:
    assert err.value.status == 422
    body: dict[str, Any] = json.loads(present(err.value.body))
    assert (body["kind"], body["status"], body["reason"], body["code"]) == ("Status", "Failure", "Invalid", 422)
    return body


def causes(body: dict[str, Any]) -> set[tuple[str, str]]:
    return {(c["field"], c["reason"]) for c in body["details"]["causes"]}


def a_slice(name: str, devices: int = 1, **spec: Any) -> dict[str, Any]:
    return {"metadata": {"name": name}, "spec": {
        "driver": DRIVER_NAME, "nodeName": "n1", "pool": {"name": "n1", "generation": 1, "resourceSliceCount": 1},
        "devices": [{"name": f"gpu-{i}", "attributes": {"index": {"int": i}}} for i in range(devices)], **spec}}


def test_slice_over_the_device_limit_is_invalid(api: k.ApiClient) -> None:
    res = k.ResourceV1Api(api)
    res.create_resource_slice(k.V1ResourceSlice.model_validate(a_slice("full", 128)))
    with pytest.raises(ApiException) as err:
        res.create_resource_slice(k.V1ResourceSlice.model_validate(a_slice("overfull", 129)))
    body = status_of(err)
    assert causes(body) == {("spec.devices", "FieldValueTooMany")}
    assert body["details"]["kind"] == "ResourceSlice" and body["details"]["group"] == "resource.k8s.io"
    assert body["message"] == ('ResourceSlice.resource.k8s.io "overfull" is invalid: spec.devices: Too many: 129: '
                               "must have at most 128 items")


def test_slice_with_several_problems_lists_every_cause(api: k.ApiClient) -> None:
    bad = a_slice("bad")
    bad["spec"]["devices"][0]["attributes"] = {"bad-key": {"string": "x" * 65}}
    bad["spec"]["allNodes"] = True
    with pytest.raises(ApiException) as err:
        k.ResourceV1Api(api).create_resource_slice(k.V1ResourceSlice.model_validate(bad))
    found = causes(status_of(err))
    assert {("spec.devices[0].attributes[bad-key]", "FieldValueInvalid"),
            ("spec.devices[0].attributes[bad-key].string", "FieldValueTooLong"),
            ("spec", "FieldValueInvalid")} <= found


def test_slice_update_cannot_move_it_to_another_driver(api: k.ApiClient) -> None:
    res = k.ResourceV1Api(api)
    res.create_resource_slice(k.V1ResourceSlice.model_validate(a_slice("moving")))
    with pytest.raises(ApiException) as err:
        res.patch_resource_slice("moving", {"spec": {"driver": "other.example.com"}})
    assert ("spec.driver", "FieldValueInvalid") in causes(status_of(err))


def test_claim_template_and_class_are_validated(api: k.ApiClient) -> None:
    res = k.ResourceV1Api(api)
    with pytest.raises(ApiException) as err:
        res.create_namespaced_resource_claim("default", k.ResourceV1ResourceClaim.model_validate({
            "metadata": {"name": "c"}, "spec": {"devices": {
                "requests": [{"name": "gpu", "exactly": {"deviceClassName": DRIVER_NAME},
                              "firstAvailable": [{"name": "a", "deviceClassName": DRIVER_NAME}]}]}}}))
    assert ("spec.devices.requests[0]", "FieldValueInvalid") in causes(status_of(err))
    with pytest.raises(ApiException) as err:
        res.create_namespaced_resource_claim_template("default", k.V1ResourceClaimTemplate.model_validate({
            "metadata": {"name": "t"}, "spec": {"spec": {
                "devices": {"requests": [{"name": "Not_A_Label", "exactly": {"deviceClassName": DRIVER_NAME}}]}}}}))
    assert ("spec.spec.devices.requests[0].name", "FieldValueInvalid") in causes(status_of(err))
    with pytest.raises(ApiException) as err:
        res.create_device_class(k.V1DeviceClass.model_validate({"metadata": {"name": DRIVER_NAME}, "spec": {
            "selectors": [{"cel": {"expression": ""}}],
            "config": [{"opaque": {"driver": DRIVER_NAME, "parameters": {"pad": "x" * 10240}}}]}}))
    assert {("spec.selectors[0].cel.expression", "FieldValueRequired"),
            ("spec.config[0].opaque.parameters", "FieldValueTooLong")} <= causes(status_of(err))
    created = res.create_device_class(k.V1DeviceClass.model_validate({"metadata": {"name": DRIVER_NAME}, "spec": {
        "selectors": [{"cel": {"expression": f'device.driver == "{DRIVER_NAME}"'}}]}}))
    assert name_of(created) == DRIVER_NAME


def test_claim_status_must_match_the_allocation(api: k.ApiClient) -> None:
    res = k.ResourceV1Api(api)
    res.create_namespaced_resource_claim("default", k.ResourceV1ResourceClaim.model_validate({
        "metadata": {"name": "alloc"}, "spec": {"devices": {
            "requests": [{"name": "gpu", "exactly": {"deviceClassName": DRIVER_NAME}}]}}}))
    allocation = {"devices": {"results": [{"request": "gpu", "driver": DRIVER_NAME, "pool": "n1",
                                           "device": "gpu-0"}]}}
    res.patch_namespaced_resource_claim_status("alloc", "default", {"status": {"allocation": allocation}})
    with pytest.raises(ApiException) as err:
        res.patch_namespaced_resource_claim_status("alloc", "default", {"status": {"devices": [
            {"driver": DRIVER_NAME, "pool": "n1", "device": "gpu-9"}]}})
    assert ("status.devices[0]", "FieldValueInvalid") in causes(status_of(err))
    ok = res.patch_namespaced_resource_claim_status("alloc", "default", {"status": {"devices": [
        {"driver": DRIVER_NAME, "pool": "n1", "device": "gpu-0",
         "conditions": [{"type": "Ready", "status": "True", "reason": "Prepared", "message": "",
                         "lastTransitionTime": "2026-01-01T00:00:00Z"}]}]}})
    assert present(present(present(ok.status).devices)[0].conditions)[0].type == "Ready"
    with pytest.raises(ApiException) as err:
        res.patch_namespaced_resource_claim_status("alloc", "default", {"status": {"allocation": {"devices": {
            "results": [{"request": "gpu", "driver": DRIVER_NAME, "pool": "n1", "device": "gpu-1"}]}}}})
    assert ("status.allocation", "FieldValueInvalid") in causes(status_of(err))


def test_other_kinds_get_metadata_checks(api: k.ApiClient) -> None:
    core = k.CoreV1Api(api)
    with pytest.raises(ApiException) as err:
        core.create_namespace(k.V1Namespace(metadata=k.V1ObjectMeta(name="not.a.label")))
    assert ("metadata.name", "FieldValueInvalid") in causes(status_of(err))
    with pytest.raises(ApiException) as err:
        core.create_namespaced_config_map("default", k.V1ConfigMap(metadata=k.V1ObjectMeta(
            name="ok", labels={"bad key": "x"})))
    assert ("metadata.labels", "FieldValueInvalid") in causes(status_of(err))
    with pytest.raises(ApiException) as err:
        core.create_namespaced_config_map("default", k.V1ConfigMap(metadata=k.V1ObjectMeta()))
    assert ("metadata.name", "FieldValueRequired") in causes(status_of(err))


def test_kube_version_selects_the_rule_set() -> None:
    mixed = k.V1ResourceSlice.model_validate(
        a_slice("mixed", sharedCounters=[{"name": "gpu-0", "counters": {"memory": {"value": "80Gi"}}}]))
    with ApiServer(kube_version="1.34.1") as old, old.api_client() as client:
        assert name_of(k.ResourceV1Api(client).create_resource_slice(mixed)) == "mixed"
    with ApiServer(kube_version="1.35.0") as new, new.api_client() as client:
        with pytest.raises(ApiException) as err:
            k.ResourceV1Api(client).create_resource_slice(mixed)
        assert ("spec", "FieldValueInvalid") in causes(status_of(err))


def test_cel_selectors_are_compiled_at_admission(api: k.ApiClient) -> None:
    res = k.ResourceV1Api(api)
    with pytest.raises(ApiException) as err:
        res.create_namespaced_resource_claim("default", k.ResourceV1ResourceClaim.model_validate({
            "metadata": {"name": "bad-cel"}, "spec": {"devices": {
                "requests": [{"name": "gpu", "exactly": {"deviceClassName": DRIVER_NAME,
                                                         "selectors": [{"cel": {"expression": "device.driver =="}}]}}]}}}))
    body = status_of(err)
    assert ("spec.devices.requests[0].exactly.selectors[0].cel.expression", "FieldValueInvalid") in causes(body)
    assert "compilation failed" in body["message"]
