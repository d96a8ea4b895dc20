"""Pure parts of the sandbox API server: selectors, patch formats, the store's versioning, tables."""

from __future__ import annotations

from typing import Any

import pytest

from dra_sandbox.apiserver import patch
from dra_sandbox.apiserver.fieldlabels import builtin_rules
from dra_sandbox.apiserver.registry import version_priority
from dra_sandbox.apiserver.selectors import parse_field_selector
from dra_sandbox.apiserver.store import Store, TooOldError
from dra_sandbox.apiserver.tables import human_duration, json_path, wants_table

POD: dict[str, Any] = {"metadata": {"name": "p", "namespace": "ns"},
                       "spec": {"nodeName": "n1", "hostNetwork": True}, "status": {"phase": "Running"}}
POD_LABELS = builtin_rules("", "pods").labels


@pytest.mark.parametrize(
    ("selector", "matches"),
    [
        ("metadata.name=p", True),
        ("metadata.namespace==ns", True),
        ("spec.nodeName=n1,status.phase!=Pending", True),
        ("spec.nodeName!=n1", False),
        ("spec.hostNetwork=true", True),
        ("spec.schedulerName=", True),  # absent reads as empty
        ("metadata.name=p\\,q", False),
    ],
)
def test_field_selector_matching(selector: str, matches: bool) -> None:
    assert parse_field_selector(selector).matches(POD, POD_LABELS) is matches


def test_merge_patch_rfc7386() -> None:
    doc = {"a": {"b": 1, "c": 2}, "l": [1, 2], "x": 1}
    assert patch.merge_patch(doc, {"a": {"b": None, "d": 3}, "l": [3], "x": None}) == {"a": {"c": 2, "d": 3},
                                                                                       "l": [3]}
    assert doc == {"a": {"b": 1, "c": 2}, "l": [1, 2], "x": 1}  # input untouched


def test_json_patch_rfc6902() -> None:
    doc = {"a": [1, 2], "b": {"c": "d"}, "e/f": 1}
    out = patch.json_patch(doc, [
        {"op": "add", "path": "/a/-", "value": 3},
        {"op": "add", "path": "/a/0", "value": 0},
        {"op": "move", "from": "/b/c", "path": "/moved"},
        {"op": "copy", "from": "/moved", "path": "/copied"},
        {"op": "replace", "path": "/e~1f", "value": 2},
        {"op": "test", "path": "/a/3", "value": 3},
        {"op": "remove", "path": "/a/1"},
    ])
    assert out == {"a": [0, 2, 3], "b": {}, "e/f": 2, "moved": "d", "copied": "d"}
    with pytest.raises(patch.PatchError, match="testing value"):
        patch.json_patch(doc, [{"op": "test", "path": "/b/c", "value": "x"}])
    with pytest.raises(patch.PatchError, match="missing"):
        patch.json_patch(doc, [{"op": "replace", "path": "/nope", "value": 1}])
    with pytest.raises(patch.PatchError) as err:
        patch.json_patch(doc, {"op": "add"})
    assert err.value.code == 400


def test_strategic_merge_patch_directives() -> None:
    pod = {"metadata": {"finalizers": ["a", "b"], "labels": {"x": "1"}},
           "spec": {"containers": [{"name": "c1", "image": "i1", "env": [{"name": "A", "value": "1"}]},
                                   {"name": "c2", "image": "i2"}],
                    "tolerations": [{"key": "t1"}]}}
    out = patch.strategic_merge_patch(pod, {
        "metadata": {"$deleteFromPrimitiveList/finalizers": ["a"], "finalizers": ["c"]},
        "spec": {"containers": [{"name": "c2", "$patch": "delete"},
                                {"name": "c1", "env": [{"name": "B", "value": "2"}]},
                                {"name": "c3", "image": "i3"}],
                 "tolerations": [{"key": "t2"}]}}, "Pod")
    assert out["metadata"]["finalizers"] == ["b", "c"]
    assert [c["name"] for c in out["spec"]["containers"]] == ["c1", "c3"]
    assert out["spec"]["containers"][0]["env"] == [{"name": "A", "value": "1"}, {"name": "B", "value": "2"}]
    assert out["spec"]["tolerations"] == [{"key": "t2"}]  # atomic list: replaced
    replaced = patch.strategic_merge_patch(pod, {"metadata": {"labels": {"$patch": "replace", "y": "2"}}}, "Pod")
    assert replaced["metadata"]["labels"] == {"y": "2"}
    retained = patch.strategic_merge_patch(pod, {"spec": {"$retainKeys": ["containers"]}}, "Pod")
    assert set(retained["spec"]) == {"containers"}


def test_strategic_merge_learns_keys_from_set_element_order() -> None:
    doc = {"spec": {"things": [{"id": "a", "v": 1}, {"id": "b", "v": 2}]}}
    out = patch.strategic_merge_patch(doc, {"spec": {"$setElementOrder/things": [{"id": "b"}, {"id": "a"}],
                                                     "things": [{"id": "a", "v": 9}]}}, "Thing")
    assert out["spec"]["things"] == [{"id": "b", "v": 2}, {"id": "a", "v": 9}]


def test_claim_reserved_for_merges_by_uid() -> None:
    claim = {"status": {"reservedFor": [{"resource": "pods", "name": "a", "uid": "1"}]}}
    out = patch.strategic_merge_patch(claim, {"status": {"reservedFor": [
        {"resource": "pods", "name": "b", "uid": "2"}]}}, "ResourceClaim")
    assert [r["uid"] for r in out["status"]["reservedFor"]] == ["1", "2"]


def test_store_versions_and_history_window() -> None:
    store = Store(history_size=2)
    key = ("", "configmaps")
    first = store.insert(key, {"metadata": {"name": "a", "namespace": "ns"}})
    assert first["metadata"]["resourceVersion"] == "1"
    store.replace(key, {"metadata": {"name": "a", "namespace": "ns"}, "data": {"x": "1"}})
    gone = store.remove(key, "ns", "a")
    assert gone["metadata"]["resourceVersion"] == "3" and store.resource_version == 3
    assert [e.type for e in store.events_since(key, 1)] == ["MODIFIED", "DELETED"]
    with pytest.raises(TooOldError, match="too old resource version: 0"):
        store.events_since(key, 0)
    assert store.events_since(("", "pods"), 0) == []  # a resource without writes has nothing to miss
    store.compact()
    with pytest.raises(TooOldError):
        store.events_since(key, 2)


def test_version_priority_matches_kubernetes() -> None:
    versions = ["v1alpha1", "v2", "foo", "v1beta2", "v1", "v1beta1", "v10alpha3"]
    assert sorted(versions, key=version_priority) == ["v2", "v1", "v1beta2", "v1beta1", "v10alpha3", "v1alpha1",
                                                       "foo"]


@pytest.mark.parametrize(("seconds", "text"), [(5, "5s"), (119, "119s"), (125, "2m5s"), (600, "10m"),
                                               (3 * 3600 + 60, "3h1m"), (30 * 3600, "30h"),
                                               (3 * 86400 + 3600, "3d1h"), (400 * 86400, "400d"),
                                               (3 * 365 * 86400, "3y")])
def test_human_duration(seconds: int, text: str) -> None:
    assert human_duration(seconds) == text


def test_json_path_and_table_negotiation() -> None:
    node = {"status": {"conditions": [{"type": "Ready", "status": "True"}], "addresses": [{"address": "1.2.3.4"}]}}
    assert json_path(node, '.status.conditions[?(@.type=="Ready")].status') == "True"
    assert json_path(node, ".status.addresses[0].address") == "1.2.3.4"
    assert json_path(node, ".status.missing.x") is None
    assert wants_table("application/json;as=Table;v=v1;g=meta.k8s.io,application/json")
    assert not wants_table("application/json")
