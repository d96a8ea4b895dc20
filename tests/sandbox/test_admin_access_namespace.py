"""Admin access only in a namespace labelled resource.kubernetes.io/admin-access=true, as kube-apiserver's claim and
template strategies check it (found by the differential suite, docs/differential.md)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from dra_driver.k8s.client import ApiError, KubeRest
from dra_sandbox.apiserver import ApiServer

RS = "/apis/resource.k8s.io/v1"
MESSAGE = ("admin access to devices requires the `resource.kubernetes.io/admin-access: true` label on the containing "
           "namespace")


@pytest.fixture(scope="module")
def rest() -> Iterator[KubeRest]:
    with ApiServer(kube_version="1.37.0") as server:
        client = server.rest()
        for name, labels in (("plain", {}), ("admin", {"resource.kubernetes.io/admin-access": "true"})):
            client.request("POST", "/api/v1/namespaces", body={"apiVersion": "v1", "kind": "Namespace",
                                                               "metadata": {"name": name, "labels": labels}})
        yield client


def _spec(admin: bool) -> dict[str, Any]:
    return {"devices": {"requests": [
        {"name": "plain", "exactly": {"deviceClassName": "gpu.dra.dev"}},
        {"name": "admin", "exactly": {"deviceClassName": "gpu.dra.dev", "adminAccess": admin}}]}}


def _claim(namespace: str, name: str, admin: bool) -> dict[str, Any]:
    return {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
            "metadata": {"name": name, "namespace": namespace}, "spec": _spec(admin)}


def test_a_claim_asking_admin_access_needs_the_namespace_label(rest: KubeRest) -> None:
    with pytest.raises(ApiError) as refused:
        rest.request("POST", f"{RS}/namespaces/plain/resourceclaims", body=_claim("plain", "c", admin=True))
    assert refused.value.status == 422
    body = refused.value.body
    assert body["reason"] == "Invalid"
    assert [(c["field"], c["reason"]) for c in body["details"]["causes"]] == [
        ("spec.devices.requests[1].adminAccess", "FieldValueForbidden")]
    assert body["message"] == f'ResourceClaim.resource.k8s.io "c" is invalid: spec.devices.requests[1].adminAccess: ' \
                              f"Forbidden: {MESSAGE}"
    rest.request("POST", f"{RS}/namespaces/plain/resourceclaims", body=_claim("plain", "off", admin=False))
    rest.request("POST", f"{RS}/namespaces/admin/resourceclaims", body=_claim("admin", "c", admin=True))


def test_a_template_asking_admin_access_needs_the_namespace_label(rest: KubeRest) -> None:
    template = {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaimTemplate",
                "metadata": {"name": "t"}, "spec": {"spec": _spec(admin=True)}}
    with pytest.raises(ApiError) as refused:
        rest.request("POST", f"{RS}/namespaces/plain/resourceclaimtemplates", body=template)
    assert [c["field"] for c in refused.value.body["details"]["causes"]] == ["spec.devices.requests[1].adminAccess"]
    rest.request("POST", f"{RS}/namespaces/admin/resourceclaimtemplates", body=template)


def test_a_status_granting_admin_access_needs_the_namespace_label(rest: KubeRest) -> None:
    rest.request("POST", f"{RS}/namespaces/plain/resourceclaims", body=_claim("plain", "s", admin=False))
    allocation = {"devices": {"results": [
        {"request": "plain", "driver": "gpu.dra.dev", "pool": "n", "device": "gpu-0"},
        {"request": "admin", "driver": "gpu.dra.dev", "pool": "n", "device": "gpu-1", "adminAccess": True}]}}
    with pytest.raises(ApiError) as refused:
        rest.request("PATCH", f"{RS}/namespaces/plain/resourceclaims/s/status",
                     body={"status": {"allocation": allocation}}, content_type="application/merge-patch+json")
    assert [c["field"] for c in refused.value.body["details"]["causes"]] == [
        "status.allocation.devices.results[1].adminAccess"]
