"""The sandbox API server refuses what kube-apiserver refuses, with its codes, reasons and messages.

Each test names the upstream source of the behaviour it holds; docs/sandbox.md's Fidelity table lists them.
"""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from typing import Any

import pytest

from dra_sandbox.apiserver import ApiServer

pytestmark = pytest.mark.apiserver(fresh=True)

BUILTIN_PATCH_TYPES = ("application/json-patch+json, application/merge-patch+json, "
                       "application/strategic-merge-patch+json, application/apply-patch+yaml")


def call(server: ApiServer, method: str, path: str, body: Any = None, *,
         content_type: str = "application/json", raw: bytes | None = None) -> tuple[int, Any]:
    data = raw if raw is not None else (None if body is None else json.dumps(body).encode())
    req = urllib.request.Request(server.url + path, data=data, method=method,
                                 headers={"Content-Type": content_type, "Accept": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=30) as resp:
            return resp.status, json.loads(resp.read() or b"null")
    except urllib.error.HTTPError as err:
        text = err.read()
        return err.code, json.loads(text) if text else None


def configmap(name: str, **data: str) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": name, "namespace": "default"},
            "data": data}


CM = "/api/v1/namespaces/default/configmaps"


# -- patch types (k8s.io/apiserver pkg/endpoints/handlers/patch.go, endpoints/installer.go) ---------------------


@pytest.mark.parametrize("content_type", ["application/json", "text/plain", "application/apply-patch+cbor"])
def test_an_unknown_patch_type_is_415_listing_the_accepted_ones(server: ApiServer, content_type: str) -> None:
    # Checked before the object is looked up: a missing object still gets the 415.
    code, body = call(server, "PATCH", f"{CM}/missing", {"data": {}}, content_type=content_type)
    assert (code, body["reason"]) == (415, "UnsupportedMediaType")
    assert body["message"] == ("the body of the request was in an unknown format - accepted media types include: "
                               + BUILTIN_PATCH_TYPES)


CRD = {
    "apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
    "metadata": {"name": "widgets.example.com"},
    "spec": {"group": "example.com", "scope": "Namespaced",
             "names": {"plural": "widgets", "singular": "widget", "kind": "Widget"},
             "versions": [{"name": "v1", "served": True, "storage": True,
                           "schema": {"openAPIV3Schema": {"type": "object", "x-kubernetes-preserve-unknown-fields": True}}}]},
}


def test_strategic_merge_on_a_custom_resource_is_415_without_it_in_the_list(server: ApiServer) -> None:
    assert call(server, "POST", "/apis/apiextensions.k8s.io/v1/customresourcedefinitions", CRD)[0] == 201
    path = "/apis/example.com/v1/namespaces/default/widgets"
    widget = {"apiVersion": "example.com/v1", "kind": "Widget", "metadata": {"name": "w"}, "spec": {"a": 1}}
    assert call(server, "POST", path, widget)[0] == 201
    code, body = call(server, "PATCH", f"{path}/w", {"spec": {"a": 2}},
                      content_type="application/strategic-merge-patch+json")
    assert (code, body["reason"]) == (415, "UnsupportedMediaType")
    assert body["message"] == ("the body of the request was in an unknown format - accepted media types include: "
                               "application/json-patch+json, application/merge-patch+json, application/apply-patch+yaml")
    code, merged = call(server, "PATCH", f"{path}/w", {"spec": {"b": 3}}, content_type="application/merge-patch+json")
    assert code == 200 and merged["spec"] == {"a": 1, "b": 3}


def test_server_side_apply_is_refused_never_faked(server: ApiServer) -> None:
    assert call(server, "POST", CM, configmap("ssa", a="1"))[0] == 201
    code, body = call(server, "PATCH", f"{CM}/ssa?fieldManager=me", raw=json.dumps(configmap("ssa", a="2")).encode(),
                      content_type="application/apply-patch+yaml")
    assert (code, body["reason"]) == (415, "UnsupportedMediaType")
    assert "server-side apply is not supported by the sandbox" in body["message"]
    assert call(server, "GET", f"{CM}/ssa")[1]["data"] == {"a": "1"}


def test_merge_patch_null_deletes_and_objects_merge(server: ApiServer) -> None:
    # RFC 7386, as evanphx/json-patch MergePatch applies it.
    assert call(server, "POST", CM, configmap("merge", a="1", b="2"))[0] == 201
    code, body = call(server, "PATCH", f"{CM}/merge", {"data": {"a": None, "c": "3"}},
                      content_type="application/merge-patch+json")
    assert code == 200 and body["data"] == {"b": "2", "c": "3"}


def test_json_patch_of_more_than_10000_operations_is_413(server: ApiServer) -> None:
    assert call(server, "POST", CM, configmap("ops"))[0] == 201
    ops = [{"op": "add", "path": f"/data/k{i}", "value": "v"} for i in range(10001)]
    code, body = call(server, "PATCH", f"{CM}/ops", ops, content_type="application/json-patch+json")
    assert (code, body["reason"]) == (413, "RequestEntityTooLarge")
    assert body["message"] == ("Request entity too large: The allowed maximum operations in a JSON patch is 10000, "
                               "got 10001")
    assert not call(server, "GET", f"{CM}/ops")[1].get("data")


def test_json_patch_test_failure_is_422_and_changes_nothing(server: ApiServer) -> None:
    assert call(server, "POST", CM, configmap("jt", a="1"))[0] == 201
    ops = [{"op": "replace", "path": "/data/a", "value": "2"}, {"op": "test", "path": "/data/a", "value": "1"}]
    code, body = call(server, "PATCH", f"{CM}/jt", ops, content_type="application/json-patch+json")
    assert code == 422 and body["reason"] == "Invalid"
    assert call(server, "GET", f"{CM}/jt")[1]["data"] == {"a": "1"}


# -- sizes (handlers/rest.go limitedReadBody; etcd --max-request-bytes) ---------------------------------------------


def test_a_body_over_3_mib_is_413_with_the_limit(server: ApiServer) -> None:
    big = configmap("big", a="x" * (3 * 1024 * 1024))
    code, body = call(server, "POST", CM, big)
    assert (code, body["reason"], body["message"]) == (413, "RequestEntityTooLarge",
                                                       "Request entity too large: limit is 3145728")


def test_an_object_over_etcds_limit_is_a_reasonless_500_and_not_stored(server: ApiServer) -> None:
    code, body = call(server, "POST", CM, configmap("huge", a="x" * (1600 * 1024)))
    assert code == 500 and body["message"] == "etcdserver: request is too large" and "reason" not in body
    assert call(server, "GET", f"{CM}/huge")[0] == 404
    assert call(server, "POST", CM, configmap("huge", a="x" * (1400 * 1024)))[0] == 201


# -- optimistic concurrency (apimachinery pkg/api/errors NewConflict; registry/generic/registry/store.go) ---------


def test_a_stale_resource_version_is_409_conflict_with_the_apiserver_text(server: ApiServer) -> None:
    code, created = call(server, "POST", CM, configmap("occ", a="1"))
    assert code == 201
    stale = created["metadata"]["resourceVersion"]
    assert call(server, "PUT", f"{CM}/occ", {**configmap("occ", a="2"),
                                             "metadata": {**created["metadata"]}})[0] == 200
    code, body = call(server, "PUT", f"{CM}/occ", {**configmap("occ", a="3"),
                                                   "metadata": {**created["metadata"], "resourceVersion": stale}})
    assert (code, body["reason"]) == (409, "Conflict")
    assert body["message"] == ('Operation cannot be fulfilled on configmaps "occ": the object has been modified; '
                               "please apply your changes to the latest version and try again")
    assert body["details"] == {"name": "occ", "group": "", "kind": "configmaps"}


# -- resourceVersion on lists (apimachinery meta/internalversion/validation ValidateListOptions;
#    apiserver pkg/storage/etcd3/store.go GetList; pkg/storage/cacher watch_cache.go) -------------------------------


@pytest.mark.parametrize(
    ("query", "message"),
    [
        ("resourceVersionMatch=Exact", "resourceVersionMatch: Forbidden: resourceVersionMatch is forbidden unless "
                                       "resourceVersion is provided"),
        ("resourceVersion=0&resourceVersionMatch=Exact", 'resourceVersionMatch: Forbidden: resourceVersionMatch '
                                                         '"exact" is forbidden for resourceVersion "0"'),
        ("resourceVersion=1&resourceVersionMatch=Newest", 'resourceVersionMatch: Unsupported value: "Newest": '
                                                          'supported values: "Exact", "NotOlderThan", ""'),
        ("sendInitialEvents=true", "sendInitialEvents: Forbidden: sendInitialEvents is forbidden for list"),
        ("watch=1&sendInitialEvents=true", "resourceVersionMatch: Forbidden: sendInitialEvents requires setting "
                                           "resourceVersionMatch to NotOlderThan"),
        ("watch=1&resourceVersion=1&resourceVersionMatch=NotOlderThan",
         "resourceVersionMatch: Forbidden: resourceVersionMatch is forbidden for watch unless sendInitialEvents is "
         "provided"),
    ],
)
def test_list_options_are_validated_as_upstream(server: ApiServer, query: str, message: str) -> None:
    code, body = call(server, "GET", f"{CM}?{query}")
    assert (code, body["reason"]) == (422, "Invalid")
    assert body["message"] == f'ListOptions.meta.k8s.io "" is invalid: {message}'


def test_resource_version_and_continue_do_not_mix(server: ApiServer) -> None:
    for name in ("a", "b", "c"):
        assert call(server, "POST", CM, configmap(f"rvc-{name}"))[0] == 201
    code, page = call(server, "GET", f"{CM}?limit=1")
    token = page["metadata"]["continue"]
    code, body = call(server, "GET", f"{CM}?limit=1&continue={token}&resourceVersion=5")
    assert (code, body["message"]) == (400, "specifying resource version is not allowed when using continue")
    code, body = call(server, "GET", f"{CM}?limit=1&continue=not-a-token")
    assert code == 400 and body["message"].startswith("invalid continue token: continue key is not valid: ")


def test_continue_pages_are_one_consistent_snapshot(server: ApiServer) -> None:
    for name in ("a", "b", "c"):
        assert call(server, "POST", CM, configmap(f"snap-{name}", v="1"))[0] == 201
    first = call(server, "GET", f"{CM}?limit=1")[1]
    listed_at = first["metadata"]["resourceVersion"]
    # Writes after the first page: a change, a delete and a create the later pages must not show.
    assert call(server, "PATCH", f"{CM}/snap-b", {"data": {"v": "2"}},
                content_type="application/merge-patch+json")[0] == 200
    assert call(server, "DELETE", f"{CM}/snap-c")[0] == 200
    assert call(server, "POST", CM, configmap("snap-d"))[0] == 201
    rest = call(server, "GET", f"{CM}?limit=10&continue={first['metadata']['continue']}")[1]
    assert rest["metadata"]["resourceVersion"] == listed_at
    assert [(i["metadata"]["name"], i["data"]["v"]) for i in rest["items"]] == [("snap-b", "1"), ("snap-c", "1")]


def test_an_expired_continue_token_is_410_with_a_fresh_token(server: ApiServer) -> None:
    for name in ("a", "b"):
        assert call(server, "POST", CM, configmap(f"exp-{name}"))[0] == 201
    token = call(server, "GET", f"{CM}?limit=1")[1]["metadata"]["continue"]
    assert call(server, "POST", CM, configmap("exp-c"))[0] == 201
    server.compact()  # etcd compacted past the token's revision
    code, body = call(server, "GET", f"{CM}?limit=1&continue={token}")
    assert (code, body["reason"]) == (410, "Expired")
    assert body["message"].startswith("The provided continue parameter is too old to display a consistent list "
                                      "result.")
    code, rest = call(server, "GET", f"{CM}?limit=10&continue={body['metadata']['continue']}")
    # The fresh token continues after the same key at the latest revision: later writes show.
    assert code == 200 and [i["metadata"]["name"] for i in rest["items"]] == ["exp-b", "exp-c"]


def test_exact_lists_read_the_past_until_it_is_compacted(server: ApiServer) -> None:
    code, created = call(server, "POST", CM, configmap("past", v="1"))
    then = created["metadata"]["resourceVersion"]
    assert call(server, "PATCH", f"{CM}/past", {"data": {"v": "2"}},
                content_type="application/merge-patch+json")[0] == 200
    code, body = call(server, "GET", f"{CM}?resourceVersion={then}&resourceVersionMatch=Exact")
    assert code == 200 and body["metadata"]["resourceVersion"] == then
    assert [i["data"]["v"] for i in body["items"]] == ["1"]
    code, body = call(server, "GET", f"{CM}?resourceVersion={then}&resourceVersionMatch=NotOlderThan")
    assert [i["data"]["v"] for i in body["items"]] == ["2"]
    server.compact()
    code, body = call(server, "GET", f"{CM}?resourceVersion={then}&resourceVersionMatch=Exact")
    assert (code, body["reason"], body["message"]) == (410, "Expired",
                                                       "The resourceVersion for the provided list is too old.")


def test_a_list_at_a_future_version_times_out_with_504(server: ApiServer) -> None:
    future = server.resource_version + 1000
    code, body = call(server, "GET", f"{CM}?resourceVersion={future}")
    assert (code, body["reason"]) == (504, "Timeout")
    assert body["message"] == f"Timeout: Too large resource version: {future}, current: {server.resource_version}"
    assert body["details"]["causes"] == [{"reason": "ResourceVersionTooLarge", "message": "Too large resource version"}]
    assert body["details"]["retryAfterSeconds"] == 1


def test_resource_version_zero_lists_are_served(server: ApiServer) -> None:
    assert call(server, "POST", CM, configmap("zero"))[0] == 201
    code, body = call(server, "GET", f"{CM}?resourceVersion=0")
    assert code == 200 and "zero" in [i["metadata"]["name"] for i in body["items"]]


# -- ResourceClaim strategy (pkg/registry/resource/resourceclaim/strategy.go;
#    pkg/apis/resource/validation/validation.go ValidateResourceClaimUpdate / ...StatusUpdate) ----------------------

CLAIMS = "/apis/resource.k8s.io/v1/namespaces/default/resourceclaims"
ALLOCATION = {"devices": {"results": [{"request": "gpu", "driver": "gpu.dra.dev", "pool": "node-1",
                                       "device": "gpu-0"}]},
              "nodeSelector": {"nodeSelectorTerms": [{"matchFields": [
                  {"key": "metadata.name", "operator": "In", "values": ["node-1"]}]}]}}


def claim(name: str) -> dict[str, Any]:
    return {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
            "metadata": {"name": name, "namespace": "default"},
            "spec": {"devices": {"requests": [{"name": "gpu", "exactly": {"deviceClassName": "gpu.dra.dev"}}]}},
            "status": {"allocation": ALLOCATION}}


def test_claim_create_defaults_the_request_and_drops_status(server: ApiServer) -> None:
    code, body = call(server, "POST", CLAIMS, claim("c-create"))
    assert code == 201 and "status" not in body
    assert body["spec"]["devices"]["requests"][0]["exactly"] == {
        "deviceClassName": "gpu.dra.dev", "allocationMode": "ExactCount", "count": 1}
    assert body["metadata"]["generation"] == 1


def test_claim_spec_is_immutable_after_create(server: ApiServer) -> None:
    assert call(server, "POST", CLAIMS, claim("c-spec"))[0] == 201
    code, body = call(server, "PATCH", f"{CLAIMS}/c-spec",
                      {"spec": {"devices": {"requests": [{"name": "gpu", "exactly": {
                          "deviceClassName": "other.dra.dev"}}]}}}, content_type="application/merge-patch+json")
    assert (code, body["reason"]) == (422, "Invalid")
    assert "spec: Invalid value:" in body["message"] and "field is immutable" in body["message"]


def test_claim_main_resource_ignores_status_and_status_ignores_spec_and_metadata(server: ApiServer) -> None:
    assert call(server, "POST", CLAIMS, claim("c-split"))[0] == 201
    code, body = call(server, "PATCH", f"{CLAIMS}/c-split", {"status": {"allocation": ALLOCATION}},
                      content_type="application/merge-patch+json")
    assert code == 200 and "status" not in body
    code, body = call(server, "PATCH", f"{CLAIMS}/c-split/status",
                      {"metadata": {"labels": {"x": "y"}, "finalizers": ["example.com/f"]},
                       "spec": {"devices": {"requests": []}}, "status": {"allocation": ALLOCATION}},
                      content_type="application/merge-patch+json")
    assert code == 200
    assert body["status"]["allocation"]["devices"]["results"][0]["device"] == "gpu-0"
    assert "labels" not in body["metadata"] and "finalizers" not in body["metadata"]  # ResetObjectMetaForStatus
    assert body["spec"]["devices"]["requests"][0]["name"] == "gpu"
    assert body["metadata"]["generation"] == 1  # status writes never bump generation


def test_claim_allocation_cannot_change_once_set_only_be_cleared(server: ApiServer) -> None:
    assert call(server, "POST", CLAIMS, claim("c-alloc"))[0] == 201
    assert call(server, "PATCH", f"{CLAIMS}/c-alloc/status", {"status": {"allocation": ALLOCATION}},
                content_type="application/merge-patch+json")[0] == 200
    moved = {"status": {"allocation": {"devices": {"results": [{"device": "gpu-1", "request": "gpu",
                                                                "driver": "gpu.dra.dev", "pool": "node-1"}]}}}}
    code, body = call(server, "PATCH", f"{CLAIMS}/c-alloc/status", moved, content_type="application/merge-patch+json")
    assert (code, body["reason"]) == (422, "Invalid")
    assert "status.allocation: Invalid value:" in body["message"] and "field is immutable" in body["message"]
    code, body = call(server, "PATCH", f"{CLAIMS}/c-alloc/status", {"status": {"allocation": None}},
                      content_type="application/merge-patch+json")
    assert code == 200 and "allocation" not in body.get("status", {})


def test_claim_reserved_for_needs_an_allocation(server: ApiServer) -> None:
    assert call(server, "POST", CLAIMS, claim("c-res"))[0] == 201
    code, body = call(server, "PATCH", f"{CLAIMS}/c-res/status",
                      {"status": {"reservedFor": [{"resource": "pods", "name": "p", "uid": "u1"}]}},
                      content_type="application/merge-patch+json")
    assert (code, body["reason"]) == (422, "Invalid")
    assert "status.reservedFor: Forbidden: may not be specified when `allocated` is not set" in body["message"]


def test_claim_reserved_for_is_capped_at_256(server: ApiServer) -> None:
    assert call(server, "POST", CLAIMS, claim("c-cap"))[0] == 201
    too_many = [{"resource": "pods", "name": f"p{i}", "uid": f"u{i}"} for i in range(257)]
    code, body = call(server, "PATCH", f"{CLAIMS}/c-cap/status",
                      {"status": {"allocation": ALLOCATION, "reservedFor": too_many}},
                      content_type="application/merge-patch+json")
    assert (code, body["reason"]) == (422, "Invalid")
    assert "status.reservedFor: Too many: 257: must have at most 256 items" in body["message"]


# -- object metadata (apimachinery pkg/api/validation/objectmeta.go ValidateObjectMeta, ValidateAnnotations) ---------


@pytest.mark.parametrize(
    ("path", "obj", "message"),
    [
        (CM, {"metadata": {"namespace": "default"}}, "metadata.name: Required value: name or generateName is required"),
        (CM, configmap("x" * 254), f'metadata.name: Invalid value: "{"x" * 254}": must be no more than 253 characters'),
        ("/api/v1/namespaces", {"metadata": {"name": "n" * 64}},
         f'metadata.name: Invalid value: "{"n" * 64}": must be no more than 63 characters'),
        (CM, {**configmap("notes"), "metadata": {"name": "notes", "namespace": "default",
                                                 "annotations": {"a": "x" * (256 * 1024)}}},
         "metadata.annotations: Too long: may not be more than 262144 bytes"),
    ],
)
def test_metadata_limits(server: ApiServer, path: str, obj: dict[str, Any], message: str) -> None:
    code, body = call(server, "POST", path, obj)
    assert (code, body["reason"]) == (422, "Invalid")
    assert message in body["message"]


def test_generate_name_keeps_58_characters_and_adds_5(server: ApiServer) -> None:
    # names.SimpleNameGenerator: maxGeneratedNameLength = 63 - 5.
    code, body = call(server, "POST", CM, {"metadata": {"generateName": "g" * 70, "namespace": "default"}})
    name = body["metadata"]["name"]
    assert code == 201 and len(name) == 63 and name[:58] == "g" * 58
