"""Rules the sandbox API server missed until the differential suite sent the same requests to kube-apiserver 1.37.2
(docs/differential.md): an exact request's count 0 is defaulted to 1 (Go's unset int64), and an Event lives in its
object's namespace, or in "default" for a cluster-scoped object."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from dra_driver.k8s.client import ApiError, KubeRest
from dra_sandbox.apiserver import ApiServer


@pytest.fixture(scope="module")
def rest() -> Iterator[KubeRest]:
    with ApiServer(kube_version="1.37.0") as server:
        client = server.rest()
        client.request("POST", "/api/v1/namespaces", body={"apiVersion": "v1", "kind": "Namespace",
                                                           "metadata": {"name": "ns"}})
        yield client


def test_an_exact_count_of_zero_is_defaulted_to_one(rest: KubeRest) -> None:
    claim = {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim", "metadata": {"name": "zero"},
             "spec": {"devices": {"requests": [{"name": "gpu", "exactly": {"deviceClassName": "gpu.dra.dev",
                                                                          "count": 0}}]}}}
    created = rest.request("POST", "/apis/resource.k8s.io/v1/namespaces/ns/resourceclaims", body=claim)
    assert created["spec"]["devices"]["requests"][0]["exactly"] == {
        "deviceClassName": "gpu.dra.dev", "allocationMode": "ExactCount", "count": 1}


def _event(name: str, namespace: str, involved: dict[str, Any], **extra: Any) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Event", "metadata": {"name": name, "namespace": namespace},
            "involvedObject": involved, "reason": "Test", "message": "m", "type": "Normal", **extra}


@pytest.mark.parametrize(("namespace", "involved", "event_time", "refused"), [
    ("ns", {"kind": "Node", "name": "n"}, False, True),  # a Node's old-style Event outside "default"
    ("default", {"kind": "Node", "name": "n"}, False, False),
    ("kube-system", {"kind": "Node", "name": "n"}, True, False),  # a new-style one may live in kube-system
    ("ns", {"kind": "Node", "name": "n"}, True, True),
    ("default", {"kind": "Pod", "name": "p", "namespace": "ns"}, False, True),  # not its object's namespace
    ("ns", {"kind": "Pod", "name": "p", "namespace": "ns"}, False, False),
])
def test_an_event_lives_in_its_objects_namespace(rest: KubeRest, namespace: str, involved: dict[str, Any],
                                                 event_time: bool, refused: bool) -> None:
    name = f"e-{namespace}-{involved['kind'].lower()}-{int(event_time)}"
    extra: dict[str, Any] = {}
    if event_time:
        extra = {"eventTime": "2026-01-01T00:00:00.000000Z", "reportingComponent": "c", "reportingInstance": "i",
                 "action": "Test"}
    path = f"/api/v1/namespaces/{namespace}/events"
    if not refused:
        rest.request("POST", path, body=_event(name, namespace, involved, **extra))
        return
    with pytest.raises(ApiError) as error:
        rest.request("POST", path, body=_event(name, namespace, involved, **extra))
    assert error.value.status == 422
    assert [c["field"] for c in error.value.body["details"]["causes"]] == ["involvedObject.namespace"]
    assert "does not match event.namespace" in error.value.body["message"]


def test_a_bad_finalizer_is_named_on_the_list_and_a_bare_name_on_its_entry(rest: KubeRest) -> None:
    """A built-in kind: apimachinery's qualified-name error on `metadata.finalizers`, core's standard-name error on
    the entry; a custom resource gets only the first (tests/differential's `template patch bad finalizer`)."""
    config: dict[str, Any] = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "f", "finalizers": ["no slash"]}}
    with pytest.raises(ApiError) as error:
        rest.request("POST", "/api/v1/namespaces/ns/configmaps", body=config)
    assert [c["field"] for c in error.value.body["details"]["causes"]] == [
        "metadata.finalizers", "metadata.finalizers[0]"]
    config["metadata"]["finalizers"] = ["orphan", "example.com/mine"]
    rest.request("POST", "/api/v1/namespaces/ns/configmaps", body=config)


def test_a_lease_duration_must_be_positive(rest: KubeRest) -> None:
    lease: dict[str, Any] = {"apiVersion": "coordination.k8s.io/v1", "kind": "Lease", "metadata": {"name": "l"},
             "spec": {"holderIdentity": "a", "leaseDurationSeconds": 0}}
    with pytest.raises(ApiError) as error:
        rest.request("POST", "/apis/coordination.k8s.io/v1/namespaces/ns/leases", body=lease)
    assert [c["field"] for c in error.value.body["details"]["causes"]] == ["spec.leaseDurationSeconds"]
    lease["spec"]["leaseDurationSeconds"] = 15
    rest.request("POST", "/apis/coordination.k8s.io/v1/namespaces/ns/leases", body=lease)
