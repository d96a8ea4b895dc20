"""Custom resources are pruned and validated against their CRD's schema (dra_sandbox.apiserver.crschema)."""

from __future__ import annotations

from typing import Any

import pytest

from dra_driver.k8s.client import ApiError
from dra_sandbox.apiserver import ApiServer
from dra_sandbox.apiserver.crschema import check, prune, validate

SCHEMA: dict[str, Any] = {
    "type": "object",
    "required": ["spec"],
    "properties": {
        "spec": {"type": "object", "required": ["size"], "properties": {
            "size": {"type": "integer", "minimum": 1, "maximum": 10},
            "mode": {"type": "string", "enum": ["a", "b"]},
            "tags": {"type": "array", "maxItems": 2, "items": {"type": "string", "minLength": 1}},
            "limit": {"x-kubernetes-int-or-string": True, "anyOf": [{"type": "integer"}, {"type": "string"}]},
            "labels": {"type": "object", "additionalProperties": {"type": "string"}},
            "free": {"type": "object", "x-kubernetes-preserve-unknown-fields": True},
        }},
        "status": {"type": "object", "properties": {"ok": {"type": "boolean"}}},
    },
}


def test_prune_drops_undeclared_fields_and_keeps_preserved_ones() -> None:
    obj = {"apiVersion": "x/v1", "kind": "K", "metadata": {"name": "n"},
           "spec": {"size": 1, "typo": 2, "free": {"any": {"thing": 1}}, "labels": {"k": "v"}}, "extra": 1}
    pruned, dropped = prune(obj, SCHEMA)
    assert dropped == ["spec.typo", "extra"]
    assert pruned == {"apiVersion": "x/v1", "kind": "K", "metadata": {"name": "n"},
                      "spec": {"size": 1, "free": {"any": {"thing": 1}}, "labels": {"k": "v"}}}


@pytest.mark.parametrize(("spec", "field", "words"), [
    ({"size": 11}, "spec.size", "spec.size in body should be less than or equal to 10"),
    ({"size": 0}, "spec.size", "should be greater than or equal to 1"),
    ({"size": "3"}, "spec.size", 'must be of type integer: "string"'),
    ({"size": 1, "mode": "c"}, "spec.mode", 'supported values: "a", "b"'),
    ({"size": 1, "tags": ["x", "y", "z"]}, "spec.tags", "at most 2 items"),
    ({"size": 1, "tags": [""]}, "spec.tags[0]", "at least 1 chars long"),
    ({"size": 1, "limit": True}, "spec.limit", "integer-or-string"),
    ({"size": 1, "labels": {"k": 1}}, "spec.labels[k]", "must be of type string"),
    ({}, "spec.size", "Required value"),
])
def test_validate_names_the_field_in_the_apiservers_words(spec: dict[str, Any], field: str, words: str) -> None:
    [error] = check({"spec": spec}, SCHEMA)
    assert error.field == field
    assert words in str(error)


def test_status_is_checked_only_on_its_own() -> None:
    obj = {"spec": {"size": 1}, "status": {"ok": "yes"}}
    assert check(obj, SCHEMA, skip=("status",)) == []
    [error] = check(obj, SCHEMA, only="status")
    assert error.field == "status.ok"
    assert validate({"size": 5, "limit": "1Gi"}, SCHEMA["properties"]["spec"], "spec") == []


def test_the_server_refuses_and_prunes_custom_resources() -> None:
    crd = {"apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
           "metadata": {"name": "widgets.example.com"},
           "spec": {"group": "example.com", "scope": "Cluster", "names": {"plural": "widgets", "kind": "Widget"},
                    "versions": [{"name": "v1", "served": True, "storage": True, "subresources": {"status": {}},
                                  "schema": {"openAPIV3Schema": SCHEMA}}]}}
    with ApiServer() as srv, srv.rest() as rest:
        rest.request("POST", "/apis/apiextensions.k8s.io/v1/customresourcedefinitions", body=crd)
        path = "/apis/example.com/v1/widgets"
        with pytest.raises(ApiError) as err:
            rest.request("POST", path, body={"apiVersion": "example.com/v1", "kind": "Widget",
                                             "metadata": {"name": "w"}, "spec": {"size": 99}})
        assert err.value.status == 422
        assert [c["field"] for c in err.value.body["details"]["causes"]] == ["spec.size"]
        made = rest.request("POST", path, body={"apiVersion": "example.com/v1", "kind": "Widget",
                                                "metadata": {"name": "w"}, "spec": {"size": 2, "typo": 1}})
        assert made["spec"] == {"size": 2}
        with pytest.raises(ApiError) as err:
            rest.request("PATCH", f"{path}/w/status", body={"status": {"ok": 3}},
                         content_type="application/merge-patch+json")
        assert err.value.status == 422
        with pytest.raises(ApiError):
            rest.request("PATCH", f"{path}/w", body={"spec": {"mode": "z"}},
                         content_type="application/merge-patch+json")
        stored = rest.get(f"{path}/w")
        assert stored is not None and stored["spec"] == {"size": 2}
