"""The sandbox API server's REST semantics, driven by the official kubernetes client (and raw HTTP
where the client hides the wire): discovery, CRUD, conflicts, generation, status, patches, errors."""

from __future__ import annotations

import json
import stat
import urllib.error
import urllib.request
import uuid
from pathlib import Path
from typing import Any

import kubernetes.client as k
import pytest
from kubernetes.client.exceptions import ApiException

from dra_driver.defaults import DRIVER_NAME
from dra_sandbox.apiserver import ApiServer
from tests.kube_models import as_json, meta, name_of, resource_version
from tests.narrow import present

pytestmark = pytest.mark.apiserver(kube_version="1.35.2")


def raw(server: ApiServer, method: str, path: str, body: Any = None,
        content_type: str = "application/json", headers: dict[str, str] | None = None) -> tuple[int, Any, Any]:
    data = None if body is None else (body if isinstance(body, bytes) else json.dumps(body).encode())
    req = urllib.request.Request(server.url + path, data=data, method=method,
                                 headers={"Content-Type": content_type, **(headers or {})})
    try:
        with urllib.request.urlopen(req, timeout=10) as resp:
            return resp.status, json.loads(resp.read() or b"null"), resp.headers
    except urllib.error.HTTPError as err:
        return err.code, json.loads(err.read() or b"null"), err.headers


def unique(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


def a_slice(name: str, node: str = "node-1", driver: str = DRIVER_NAME, **spec: Any) -> dict[str, Any]:
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceSlice",
        "metadata": {"name": name},
        "spec": {"driver": driver, "nodeName": node, "pool": {"name": node, "generation": 1, "resourceSliceCount": 1},
                 "devices": [{"name": "gpu-0", "attributes": {"productName": {"string": "H100"}}}], **spec},
    }


def a_claim(name: str) -> dict[str, Any]:
    return {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim", "metadata": {"name": name},
            "spec": {"devices": {"requests": [{"name": "gpu", "exactly": {"deviceClassName": DRIVER_NAME}}]}}}


# -- discovery ----------------------------------------------------------------------------------


def test_version_reports_configured_release(api: k.ApiClient) -> None:
    info = k.VersionApi(api).get_code()
    assert (info.major, info.minor, info.git_version) == ("1", "35", "v1.35.2")


def test_discovery_lists_groups_kinds_and_subresources(server: ApiServer, api: k.ApiClient) -> None:
    groups = {g.name: g for g in k.ApisApi(api).get_api_versions().groups}
    for group in ("resource.k8s.io", "apiextensions.k8s.io", "coordination.k8s.io", "admissionregistration.k8s.io",
                  "events.k8s.io"):
        assert present(groups[group].preferred_version).group_version == f"{group}/v1"
    resources = {r.name: r for r in k.ResourceV1Api(api).get_api_resources().resources}
    assert resources["resourceslices"].kind == "ResourceSlice" and not resources["resourceslices"].namespaced
    assert resources["resourceclaims"].namespaced
    assert set(resources["resourceclaims/status"].verbs) == {"get", "patch", "update"}
    assert "watch" in resources["deviceclasses"].verbs
    core = {r.name: r for r in k.CoreV1Api(api).get_api_resources().resources}
    assert {"pods", "pods/status", "nodes", "nodes/status", "namespaces", "events", "configmaps"} <= set(core)
    status, body, _ = raw(server, "GET", "/api")
    assert status == 200 and body["versions"] == ["v1"]
    assert raw(server, "GET", "/apis/nope.example.com/v1")[0] == 404


# -- create / read ------------------------------------------------------------------------------


def test_create_sets_server_fields_and_get_returns_them(api: k.ApiClient) -> None:
    res = k.ResourceV1Api(api)
    name = unique("slice")
    created = res.create_resource_slice(k.V1ResourceSlice.model_validate(a_slice(name)))
    metadata = meta(created)
    assert metadata.uid and metadata.creation_timestamp and metadata.generation == 1
    assert resource_version(created) > 0
    got = res.read_resource_slice(name)
    assert meta(got).uid == metadata.uid and present(got.spec.devices)[0].name == "gpu-0"
    assert got.api_version == "resource.k8s.io/v1" and got.kind == "ResourceSlice"


def test_resource_versions_come_from_one_global_counter(api: k.ApiClient) -> None:
    core, res = k.CoreV1Api(api), k.ResourceV1Api(api)
    first = core.create_namespaced_config_map("default", k.V1ConfigMap(metadata=k.V1ObjectMeta(name=unique("cm"))))
    second = res.create_resource_slice(k.V1ResourceSlice.model_validate(a_slice(unique("slice"))))
    assert resource_version(second) == resource_version(first) + 1
    listed = res.list_resource_slice()
    assert resource_version(listed) >= resource_version(second)


def test_duplicate_create_is_already_exists(server: ApiServer, api: k.ApiClient) -> None:
    name = unique("slice")
    k.ResourceV1Api(api).create_resource_slice(k.V1ResourceSlice.model_validate(a_slice(name)))
    status, body, _ = raw(server, "POST", "/apis/resource.k8s.io/v1/resourceslices", a_slice(name))
    assert status == 409
    assert body["kind"] == "Status" and body["status"] == "Failure" and body["reason"] == "AlreadyExists"
    assert body["details"] == {"name": name, "group": "resource.k8s.io", "kind": "resourceslices"}
    assert body["message"] == f'resourceslices.resource.k8s.io "{name}" already exists'


def test_get_missing_is_not_found_status(server: ApiServer) -> None:
    status, body, _ = raw(server, "GET", "/api/v1/namespaces/default/pods/nope")
    assert status == 404 and body["reason"] == "NotFound" and body["code"] == 404
    assert body["message"] == 'pods "nope" not found'


def test_generate_name(api: k.ApiClient) -> None:
    cm = k.CoreV1Api(api).create_namespaced_config_map(
        "default", k.V1ConfigMap(metadata=k.V1ObjectMeta(generate_name="gen-")))
    assert name_of(cm).startswith("gen-") and len(name_of(cm)) == len("gen-") + 5


def test_create_in_missing_namespace_is_not_found(api: k.ApiClient) -> None:
    with pytest.raises(ApiException) as err:
        k.CoreV1Api(api).create_namespaced_config_map("nowhere", k.V1ConfigMap(metadata=k.V1ObjectMeta(name="x")))
    assert err.value.status == 404
    assert json.loads(present(err.value.body))["message"] == 'namespaces "nowhere" not found'


def test_mismatched_api_version_is_bad_request(server: ApiServer) -> None:
    body = a_slice(unique("slice"))
    body["apiVersion"] = "resource.k8s.io/v1beta1"
    status, reply, _ = raw(server, "POST", "/apis/resource.k8s.io/v1/resourceslices", body)
    assert status == 400 and reply["reason"] == "BadRequest" and "does not match" in reply["message"]


def test_dry_run_stores_nothing(server: ApiServer, api: k.ApiClient) -> None:
    name = unique("slice")
    created = k.ResourceV1Api(api).create_resource_slice(k.V1ResourceSlice.model_validate(a_slice(name)), dry_run="All")
    assert name_of(created) == name
    assert raw(server, "GET", f"/apis/resource.k8s.io/v1/resourceslices/{name}")[0] == 404


# -- update / conflicts / generation -----------------------------------------------------------


def test_update_with_stale_resource_version_conflicts(api: k.ApiClient) -> None:
    res = k.ResourceV1Api(api)
    name = unique("slice")
    created = res.create_resource_slice(k.V1ResourceSlice.model_validate(a_slice(name)))
    body = a_slice(name)
    body["metadata"]["resourceVersion"] = meta(created).resource_version
    body["spec"]["pool"]["generation"] = 2
    updated = res.replace_resource_slice(name, k.V1ResourceSlice.model_validate(body))
    assert resource_version(updated) > resource_version(created)
    assert meta(updated).generation == 2
    body["spec"]["pool"]["generation"] = 3  # still carries the old resourceVersion
    with pytest.raises(ApiException) as err:
        res.replace_resource_slice(name, k.V1ResourceSlice.model_validate(body))
    assert err.value.status == 409
    status = json.loads(present(err.value.body))
    assert status["reason"] == "Conflict" and "the object has been modified" in status["message"]


def test_patch_with_stale_resource_version_conflicts(api: k.ApiClient) -> None:
    core = k.CoreV1Api(api)
    cm = core.create_namespaced_config_map("default", k.V1ConfigMap(metadata=k.V1ObjectMeta(name=unique("cm"))))
    stale = meta(cm).resource_version
    core.patch_namespaced_config_map(name_of(cm), "default", {"data": {"a": "1"}})
    with pytest.raises(ApiException) as err:
        core.patch_namespaced_config_map(name_of(cm), "default",
                                         {"metadata": {"resourceVersion": stale}, "data": {"a": "2"}})
    assert err.value.status == 409


def test_noop_update_keeps_resource_version(api: k.ApiClient) -> None:
    res = k.ResourceV1Api(api)
    name = unique("slice")
    created = res.create_resource_slice(k.V1ResourceSlice.model_validate(a_slice(name)))
    same = res.replace_resource_slice(name, res.read_resource_slice(name))
    assert meta(same).resource_version == meta(created).resource_version
    patched = res.patch_resource_slice(name, {"metadata": {"labels": {}}})
    assert meta(patched).resource_version == meta(created).resource_version


def test_metadata_change_does_not_bump_generation(api: k.ApiClient) -> None:
    res = k.ResourceV1Api(api)
    name = unique("slice")
    res.create_resource_slice(k.V1ResourceSlice.model_validate(a_slice(name)))
    labelled = res.patch_resource_slice(name, {"metadata": {"labels": {"a": "b"}}})
    assert meta(labelled).generation == 1
    respec = res.patch_resource_slice(name, {"spec": {"pool": {"generation": 7}}})
    assert meta(respec).generation == 2


def test_status_subresource_semantics(api: k.ApiClient) -> None:
    res = k.ResourceV1Api(api)
    name = unique("claim")
    body = a_claim(name)
    body["status"] = {"allocation": {"devices": {"results": []}}}
    created = res.create_namespaced_resource_claim("default", k.ResourceV1ResourceClaim.model_validate(body))
    assert created.status is None or created.status.allocation is None  # status dropped on create
    status_patch = {"status": {"allocation": {"devices": {"results": [
        {"request": "gpu", "driver": DRIVER_NAME, "pool": "node-1", "device": "gpu-0"}]}}}}
    main = res.patch_namespaced_resource_claim(name, "default", status_patch)
    assert main.status is None or main.status.allocation is None  # main endpoint ignores status
    after_status = res.patch_namespaced_resource_claim_status(name, "default", status_patch)
    assert present(present(present(present(after_status.status).allocation).devices).results)[0].device == "gpu-0"
    assert meta(after_status).generation == 1  # status never bumps generation
    with_labels = res.patch_namespaced_resource_claim_status(
        name, "default", {"metadata": {"labels": {"ignored": "yes"}}, "status": {"reservedFor": [
            {"resource": "pods", "name": "p", "uid": "u-1"}]}})
    assert not (meta(with_labels).labels or {}).get("ignored")  # status endpoint changes only status
    assert present(present(with_labels.status).reserved_for)[0].uid == "u-1"


def test_claim_spec_is_immutable(api: k.ApiClient) -> None:
    res = k.ResourceV1Api(api)
    name = unique("claim")
    res.create_namespaced_resource_claim("default", k.ResourceV1ResourceClaim.model_validate(a_claim(name)))
    with pytest.raises(ApiException) as err:
        res.patch_namespaced_resource_claim(name, "default", {"spec": {"devices": {"requests": [
            {"name": "gpu", "exactly": {"deviceClassName": "other"}}]}}})
    assert err.value.status == 422 and "field is immutable" in present(err.value.body)


def test_claim_defaults_are_filled(api: k.ApiClient) -> None:
    claim = k.ResourceV1ResourceClaim.model_validate(a_claim(unique("claim")))
    created = k.ResourceV1Api(api).create_namespaced_resource_claim("default", claim)
    exactly = present(present(present(present(created.spec).devices).requests)[0].exactly)
    assert (exactly.allocation_mode, exactly.count) == ("ExactCount", 1)


# -- patch formats -------------------------------------------------------------------------------


def test_json_patch_and_merge_patch(server: ApiServer, api: k.ApiClient) -> None:
    core = k.CoreV1Api(api)
    name = unique("cm")
    core.create_namespaced_config_map("default", k.V1ConfigMap(metadata=k.V1ObjectMeta(name=name),
                                                               data={"a": "1", "b": "2"}))
    patched = core.patch_namespaced_config_map(name, "default", [{"op": "replace", "path": "/data/a", "value": "9"},
                                                                 {"op": "remove", "path": "/data/b"}])
    assert patched.data == {"a": "9"}
    status, body, _ = raw(server, "PATCH", f"/api/v1/namespaces/default/configmaps/{name}",
                          {"data": {"a": None, "c": "3"}}, "application/merge-patch+json")
    assert status == 200 and body["data"] == {"c": "3"}
    status, body, _ = raw(server, "PATCH", f"/api/v1/namespaces/default/configmaps/{name}",
                          [{"op": "test", "path": "/data/c", "value": "nope"}], "application/json-patch+json")
    assert status == 422


def test_strategic_merge_patch_merges_keyed_lists(api: k.ApiClient) -> None:
    core = k.CoreV1Api(api)
    name = unique("pod")
    core.create_namespaced_pod("default", k.V1Pod.model_validate({
        "metadata": {"name": name, "finalizers": ["example.com/a"]},
        "spec": {"containers": [{"name": "a", "image": "x"}, {"name": "b", "image": "y"}]}}))
    patched = core.patch_namespaced_pod(name, "default", {
        "metadata": {"finalizers": ["example.com/b"]},
        "spec": {"containers": [{"name": "b", "image": "y2"}]}})
    assert [(c.name, c.image) for c in present(patched.spec).containers] == [("a", "x"), ("b", "y2")]
    assert meta(patched).finalizers == ["example.com/a", "example.com/b"]  # merge list of strings
    cleared = core.patch_namespaced_pod(name, "default", {"metadata": {"finalizers": None}})
    assert not meta(cleared).finalizers


def test_apply_patch_is_unsupported_media_type(server: ApiServer, api: k.ApiClient) -> None:
    name = unique("cm")
    k.CoreV1Api(api).create_namespaced_config_map("default", k.V1ConfigMap(metadata=k.V1ObjectMeta(name=name)))
    status, body, _ = raw(server, "PATCH", f"/api/v1/namespaces/default/configmaps/{name}",
                          b"data: {a: '1'}", "application/apply-patch+yaml")
    assert status == 415 and body["reason"] == "UnsupportedMediaType" and "server-side apply" in body["message"]


# -- unknown fields ----------------------------------------------------------------------------


def test_unknown_fields_are_dropped_with_a_warning_or_refused_when_strict(server: ApiServer) -> None:
    body = a_slice(unique("slice"), nodename="typo")
    status, reply, headers = raw(server, "POST", "/apis/resource.k8s.io/v1/resourceslices", body)
    assert status == 201 and "nodename" not in reply["spec"]
    assert 'unknown field \\"spec.nodename\\"' in headers.get("Warning", "")
    body = a_slice(unique("slice"), nodename="typo")
    status, reply, _ = raw(server, "POST", "/apis/resource.k8s.io/v1/resourceslices?fieldValidation=Strict", body)
    # The create handler's transformDecodeError words it (k8s.io/apiserver handlers/rest.go), at the URL's version.
    assert status == 400 and reply["message"] == ('ResourceSlice in version "v1" cannot be handled as a ResourceSlice: '
                                                  'strict decoding error: unknown field "spec.nodename"')
    body["apiVersion"] = "resource.k8s.io/v1beta2"
    status, reply, _ = raw(server, "POST", "/apis/resource.k8s.io/v1beta2/resourceslices?fieldValidation=Strict", body)
    assert status == 400 and reply["message"].startswith('ResourceSlice in version "v1beta2" cannot be handled as')


# -- HTTP-level errors ---------------------------------------------------------------------------


def test_method_and_path_errors_are_statuses(server: ApiServer) -> None:
    status, body, _ = raw(server, "POST", "/api/v1/namespaces/default/configmaps/x", {"metadata": {"name": "x"}})
    assert status == 405 and body["reason"] == "MethodNotAllowed"
    status, body, _ = raw(server, "GET", "/apis/resource.k8s.io/v1/nothings")
    assert status == 404 and body["kind"] == "Status"
    status, body, _ = raw(server, "POST", "/api/v1/namespaces/default/configmaps", b"{not json")
    assert status == 400 and body["reason"] == "BadRequest"
    status, body, _ = raw(server, "PUT", "/apis/resource.k8s.io/v1/resourceslices/x/status", {})
    assert status == 404  # ResourceSlices have no status subresource


def test_broken_or_unknown_protobuf_bodies_are_refused_with_a_reason(server: ApiServer) -> None:
    status, body, _ = raw(server, "POST", "/api/v1/namespaces", b"k8s\x00\n\x0f", "application/vnd.kubernetes.protobuf")
    assert status == 415 and "protobuf body could not be read" in body["message"]
    status, body, _ = raw(server, "POST", "/api/v1/namespaces", b"{}", "application/cbor")
    assert status == 415 and "application/cbor" in body["message"]


def test_custom_resource_update_needs_resource_version(server: ApiServer, api: k.ApiClient) -> None:
    crd = {"apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
           "metadata": {"name": "widgets.crud.example.com"},
           "spec": {"group": "crud.example.com", "scope": "Namespaced",
                    "names": {"plural": "widgets", "singular": "widget", "kind": "Widget"},
                    "versions": [{"name": "v1", "served": True, "storage": True,
                                  "schema": {"openAPIV3Schema": {"type": "object",
                                                                 "x-kubernetes-preserve-unknown-fields": True}}}]}}
    k.ApiextensionsV1Api(api).create_custom_resource_definition(k.V1CustomResourceDefinition.model_validate(crd))
    custom = k.CustomObjectsApi(api)
    custom.create_namespaced_custom_object("crud.example.com", "v1", "default", "widgets",
                                           {"apiVersion": "crud.example.com/v1", "kind": "Widget",
                                            "metadata": {"name": "w"}, "spec": {"size": 1}})
    status, body, _ = raw(server, "PUT", "/apis/crud.example.com/v1/namespaces/default/widgets/w",
                          {"apiVersion": "crud.example.com/v1", "kind": "Widget", "metadata": {"name": "w"},
                           "spec": {"size": 2}})
    assert status == 422 and body["details"]["causes"][0]["field"] == "metadata.resourceVersion"
    status, body, _ = raw(server, "PATCH", "/apis/crud.example.com/v1/namespaces/default/widgets/w",
                          {"spec": {"size": 3}}, "application/strategic-merge-patch+json")
    assert status == 415
    merged = as_json(custom.patch_namespaced_custom_object("crud.example.com", "v1", "default", "widgets", "w",
                                                           {"spec": {"size": 4}}))
    assert merged["spec"]["size"] == 4 and merged["metadata"]["generation"] == 2


def test_written_kubeconfig_works_with_kubernetes_config(server: ApiServer, tmp_path: Path) -> None:
    from kubernetes import config

    path = server.write_kubeconfig(tmp_path / "nested" / "config", namespace="kube-system")
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    # kubernetes.config is unannotated
    client = config.new_client_from_config(config_file=str(path))  # type: ignore[no-untyped-call]
    try:
        names = [name_of(n) for n in k.CoreV1Api(client).list_namespace().items]
    finally:
        client.close()
    assert names == ["default", "kube-node-lease", "kube-public", "kube-system"]
    _, active = config.list_kube_config_contexts(config_file=str(path))  # type: ignore[no-untyped-call]
    assert active["context"]["namespace"] == "kube-system"


def test_list_pages_with_limit_and_continue(api: k.ApiClient) -> None:
    core = k.CoreV1Api(api)
    label = unique("page")
    for i in range(5):
        core.create_namespaced_config_map("default", k.V1ConfigMap(metadata=k.V1ObjectMeta(
            name=f"{label}-{i}", labels={"page": label})))
    names: list[str] = []
    token = None
    pages = 0
    while True:
        page = core.list_namespaced_config_map("default", label_selector=f"page={label}", limit=2, _continue=token)
        names += [name_of(c) for c in page.items]
        pages += 1
        token = meta(page)._continue
        if not token:
            break
        assert meta(page).remaining_item_count == 5 - len(names)
    assert pages == 3 and names == [f"{label}-{i}" for i in range(5)]
