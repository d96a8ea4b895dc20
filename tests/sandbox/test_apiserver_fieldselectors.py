"""Field selectors as upstream serves them, per kind and per reported Kubernetes version: the syntax of
apimachinery's `pkg/fields/selector.go`, each kind's field label conversion function (`pkg/apis/*/conversion.go`)
and its refusal text, answered `400 BadRequest` on list, watch and deletecollection (fieldlabels.py)."""

from __future__ import annotations

import json
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterator
from typing import Any

import pytest

from dra_sandbox.apiserver import ApiServer
from dra_sandbox.apiserver.fieldlabels import BUILTIN, DEFAULT_RULES, SUPPORTED_MINORS
from dra_sandbox.apiserver.selectors import SelectorError, parse_field_selector

SLICES = "/apis/resource.k8s.io/v1/resourceslices"


def _slice(name: str, node: str, pool: str) -> dict[str, Any]:
    return {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceSlice", "metadata": {"name": name},
            "spec": {"driver": "gpu.example.com", "nodeName": node,
                     "pool": {"name": pool, "generation": 1, "resourceSliceCount": 1}, "devices": []}}


@pytest.fixture(scope="module", params=["1.34.0", "1.37.0", "1.38.0"])
def server(request: pytest.FixtureRequest) -> Iterator[ApiServer]:
    with ApiServer(kube_version=request.param, garbage_collection=False) as srv:
        rest = srv.rest()
        rest.request("POST", SLICES, body=_slice("s-a", "node-a", "pool-a"))
        rest.request("POST", SLICES, body=_slice("s-b", "node-b", "pool-b"))
        rest.request("POST", "/api/v1/nodes", body={"apiVersion": "v1", "kind": "Node", "metadata": {"name": "n1"}})
        yield srv


def _get(srv: ApiServer, path: str, selector: str, **extra: str) -> tuple[int, dict[str, Any]]:
    query = urllib.parse.urlencode({"fieldSelector": selector, **extra})
    request = urllib.request.Request(f"{srv.url}{path}?{query}")
    try:
        with urllib.request.urlopen(request, timeout=10) as resp:
            return resp.status, json.loads(resp.read().splitlines()[0] if extra.get("watch") else resp.read())
    except urllib.error.HTTPError as err:
        return err.code, json.loads(err.read())


def _minor(srv: ApiServer) -> int:
    return srv.settings.kube_minor


def _names(body: dict[str, Any]) -> list[str]:
    return sorted(i["metadata"]["name"] for i in body["items"])


def test_resourceslices_select_by_node_and_driver_on_every_version(server: ApiServer) -> None:
    assert _names(_get(server, SLICES, "spec.nodeName=node-a")[1]) == ["s-a"]
    assert _names(_get(server, SLICES, "spec.driver=gpu.example.com,spec.nodeName!=node-a")[1]) == ["s-b"]
    assert _names(_get(server, SLICES, "metadata.name==s-b")[1]) == ["s-b"]
    assert _get(server, SLICES, "spec.nodeName=")[1]["items"] == []  # no slice without a node here


@pytest.mark.parametrize("verb", ["list", "watch", "deletecollection"])
def test_pool_name_is_refused_as_upstream_until_1_38(server: ApiServer, verb: str) -> None:
    for version in ("v1", "v1beta2", "v1beta1"):
        path = f"/apis/resource.k8s.io/{version}/resourceslices"
        if verb == "deletecollection":
            query = urllib.parse.urlencode({"fieldSelector": "spec.pool.name=none-such", "dryRun": "All"})
            request = urllib.request.Request(f"{server.url}{path}?{query}", method="DELETE")
            try:
                with urllib.request.urlopen(request, timeout=10) as resp:
                    code, body = resp.status, json.loads(resp.read())
            except urllib.error.HTTPError as err:
                code, body = err.code, json.loads(err.read())
        else:
            extra = {"watch": "true", "timeoutSeconds": "1"} if verb == "watch" else {}
            code, body = _get(server, path, "spec.pool.name=pool-a", **extra)
        if _minor(server) >= 38:
            assert code == 200, body
            if verb == "list":
                assert _names(body) == ["s-a"]
            continue
        assert code == 400
        assert body["reason"] == "BadRequest" and body["kind"] == "Status" and body["status"] == "Failure"
        assert body["message"] == (f"field label not supported for resource.k8s.io/{version}, Kind=ResourceSlice: "
                                   "spec.pool.name")


def test_nodes_refuse_metadata_namespace_but_kinds_without_a_conversion_function_accept_it(server: ApiServer) -> None:
    code, body = _get(server, "/api/v1/nodes", "metadata.namespace=x")
    assert (code, body["message"]) == (400, "field label not supported: metadata.namespace")
    assert _names(_get(server, "/api/v1/nodes", "spec.unschedulable=false")[1]) == ["n1"]
    # DeviceClasses have no conversion function: DefaultMetaV1FieldSelectorConversion serves both meta fields.
    assert _get(server, "/apis/resource.k8s.io/v1/deviceclasses", "metadata.namespace=x")[0] == 200
    code, body = _get(server, "/apis/resource.k8s.io/v1/resourceclaims", "spec.devices=x")
    assert (code, body["message"]) == (400, '"spec.devices" is not a known field selector: only "metadata.name", '
                                            '"metadata.namespace"')


def test_pods_keep_the_legacy_spec_host_name(server: ApiServer) -> None:
    assert _get(server, "/api/v1/pods", "spec.host=n1")[0] == 200
    code, body = _get(server, "/api/v1/pods", "spec.nodeName>n1")
    assert (code, body["message"]) == (400, "invalid selector: 'spec.nodeName>n1'; can't understand 'spec.nodeName>n1'")


@pytest.mark.parametrize(
    ("selector", "message"),
    [
        ("spec.nodeName in (a)", "invalid selector: 'spec.nodeName in (a)'; can't understand 'spec.nodeName in (a)'"),
        ("spec.nodeName", "invalid selector: 'spec.nodeName'; can't understand 'spec.nodeName'"),
        ("a=b,!c", "invalid selector: 'a=b,!c'; can't understand '!c'"),
        ("spec.nodeName=a=b", "invalid field selector: unescaped character in value: 61"),
        ("spec.nodeName=a\\n", "invalid field selector: invalid escape sequence: \\n"),
        ("spec.nodeName=a\\", "invalid field selector: invalid escape sequence: \\"),
    ],
)
def test_syntax_errors_carry_apimachinerys_text(selector: str, message: str) -> None:
    with pytest.raises(SelectorError) as err:
        parse_field_selector(selector)
    assert str(err.value) == message


def test_terms_are_sorted_and_the_left_side_is_taken_as_written() -> None:
    sel = parse_field_selector("spec.nodeName==b,metadata.name!=a\\,b,,")
    assert [(r.field, r.op, r.value) for r in sel.requirements] == [
        ("metadata.name", "!=", "a,b"), ("spec.nodeName", "=", "b")]
    # No trimming: the label is "spec.nodeName " and no kind serves it.
    rules = BUILTIN[("resource.k8s.io", "resourceslices")]
    with pytest.raises(SelectorError, match=r"Kind=ResourceSlice: spec\.nodeName $"):
        parse_field_selector("spec.nodeName =a").check_supported(rules, 35, group="resource.k8s.io", version="v1",
                                                                 kind="ResourceSlice")
    # The first unsupported term in sorted order is the one named.
    with pytest.raises(SelectorError, match=r": a\.b$"):
        parse_field_selector("z.z=1,a.b=2").check_supported(rules, 35, group="resource.k8s.io", version="v1",
                                                            kind="ResourceSlice")


def test_the_table_dates_pool_name_after_every_supported_version() -> None:
    slices = BUILTIN[("resource.k8s.io", "resourceslices")]
    for minor in SUPPORTED_MINORS:
        assert set(slices.supported(minor)) == {"metadata.name", "spec.nodeName", "spec.driver"}
    assert "spec.pool.name" in slices.supported(38)
    assert set(DEFAULT_RULES.supported(34)) == {"metadata.name", "metadata.namespace"}


def test_custom_resources_serve_meta_fields_and_selectable_fields() -> None:
    crd = {
        "apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
        "metadata": {"name": "widgets.example.com"},
        "spec": {"group": "example.com", "scope": "Cluster",
                 "names": {"plural": "widgets", "singular": "widget", "kind": "Widget", "listKind": "WidgetList"},
                 "versions": [{"name": "v1", "served": True, "storage": True,
                               "selectableFields": [{"jsonPath": ".spec.color"}],
                               "schema": {"openAPIV3Schema": {"type": "object", "properties": {
                                   "spec": {"type": "object", "properties": {"color": {"type": "string"}}}}}}}]},
    }
    with ApiServer(garbage_collection=False) as srv:
        rest = srv.rest()
        rest.request("POST", "/apis/apiextensions.k8s.io/v1/customresourcedefinitions", body=crd)
        path = "/apis/example.com/v1/widgets"
        from tests.polling import wait_for

        wait_for(lambda: _get(srv, path, "metadata.name=x")[0] == 200, 10, "the CRD served")
        assert _get(srv, path, "spec.color=red")[0] == 200
        code, body = _get(srv, path, "metadata.namespace=x")  # cluster-scoped: not served
        assert (code, body["message"]) == (400, "field label not supported: metadata.namespace")
