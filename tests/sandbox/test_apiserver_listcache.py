"""LIST and WATCH from each object's cached encoding (apiserver/encoding.py), and the KEP-3157 watch-list as the
reported version serves it (the WatchList gate, SetListOptionsDefaults, sendInitialEvents=false)."""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from typing import Any

import pytest

from dra_sandbox.apiserver import ApiServer
from dra_sandbox.apiserver.lifecycle import render
from dra_sandbox.apiserver.registry import Registry, builtin_types
from dra_sandbox.apiserver.settings import Settings, watch_list_default

pytestmark = pytest.mark.apiserver(fresh=True)

CM = "/api/v1/namespaces/default/configmaps"
CLASSES = "/apis/resource.k8s.io/{version}/deviceclasses"
INITIAL_EVENTS_END = {"k8s.io/initial-events-end": "true"}


def raw(server: ApiServer, method: str, path: str, body: Any = None) -> tuple[int, bytes]:
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(server.url + path, data=data, method=method,
                                 headers={"Content-Type": "application/json", "Accept": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=30) as resp:
            return resp.status, resp.read()
    except urllib.error.HTTPError as err:
        return err.code, err.read()


def call(server: ApiServer, method: str, path: str, body: Any = None) -> tuple[int, Any]:
    code, data = raw(server, method, path, body)
    return code, json.loads(data) if data else None


def events(server: ApiServer, path: str, count: int) -> list[dict[str, Any]]:
    """The first `count` event lines of a watch (fewer if the server ends it first)."""
    out: list[dict[str, Any]] = []
    with urllib.request.urlopen(server.url + path, timeout=30) as resp:
        while len(out) < count:
            line = resp.readline()
            if not line:
                break
            out.append(json.loads(line))
    return out


def configmap(name: str, **data: str) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "ConfigMap",
            "metadata": {"name": name, "namespace": "default", "labels": {"set": "lc"}}, "data": data}


def create(server: ApiServer, *names: str) -> None:
    for name in names:
        assert call(server, "POST", CM, configmap(name, v="1"))[0] == 201


# -- the cached LIST is the same bytes ---------------------------------------------------------------------------


def test_a_list_body_is_byte_for_byte_the_rendered_objects(server: ApiServer) -> None:
    create(server, "lc-a", "lc-b", "lc-c")
    for _ in range(2):  # the first LIST renders, the second is served from the cache: both the same bytes
        code, body = raw(server, "GET", f"{CM}?labelSelector=set%3Dlc")
        assert code == 200
        rt = Registry(builtin_types(Settings().kube_minor)).by_key(("", "configmaps"))
        assert rt is not None
        stored = server.snapshot("", "configmaps")
        expected = {"kind": "ConfigMapList", "apiVersion": "v1",
                    "metadata": {"resourceVersion": json.loads(body)["metadata"]["resourceVersion"]},
                    "items": [render(o, rt, "v1") for o in stored if o["metadata"]["name"].startswith("lc-")]}
        assert body == json.dumps(expected, separators=(",", ":")).encode()


def test_objects_are_rendered_once_per_resource_version(server: ApiServer) -> None:
    create(server, "once-a", "once-b", "once-c")
    call(server, "GET", CM)
    rendered = server.encodings_rendered
    for _ in range(3):
        assert call(server, "GET", CM)[0] == 200
        assert call(server, "GET", f"{CM}?resourceVersion=0")[0] == 200
    assert server.encodings_rendered == rendered  # nothing changed: every item came from the cache
    _code, obj = call(server, "GET", f"{CM}/once-b")
    obj["data"] = {"v": "2"}
    assert call(server, "PUT", f"{CM}/once-b", obj)[0] == 200
    _, listed = call(server, "GET", CM)
    assert server.encodings_rendered == rendered + 1  # only the written object is rendered again
    by_name = {i["metadata"]["name"]: i for i in listed["items"]}
    assert by_name["once-b"]["data"] == {"v": "2"}
    assert by_name["once-b"]["metadata"]["resourceVersion"] != obj["metadata"]["resourceVersion"]
    assert call(server, "DELETE", f"{CM}/once-c")[0] == 200
    assert "once-c" not in [i["metadata"]["name"] for i in call(server, "GET", CM)[1]["items"]]


def test_each_served_version_has_its_own_encoding(server: ApiServer) -> None:
    cls = {"metadata": {"name": "lc-class"}, "spec": {"selectors": [{"cel": {"expression": "true"}}]}}
    assert call(server, "POST", CLASSES.format(version="v1"), cls)[0] == 201
    for version in ("v1beta2", "v1", "v1beta1", "v1"):
        code, body = call(server, "GET", CLASSES.format(version=version))
        assert code == 200 and body["apiVersion"] == f"resource.k8s.io/{version}"
        item = next(i for i in body["items"] if i["metadata"]["name"] == "lc-class")
        assert item["apiVersion"] == f"resource.k8s.io/{version}" and item["kind"] == "DeviceClass"


def test_a_continue_token_reads_its_revision_not_the_cached_current_object(server: ApiServer) -> None:
    create(server, "page-a", "page-b", "page-c")
    code, first = call(server, "GET", f"{CM}?labelSelector=set%3Dlc&limit=1")
    call(server, "GET", f"{CM}?labelSelector=set%3Dlc")  # the current objects are now cached
    code, obj = call(server, "GET", f"{CM}/page-c")
    obj["data"] = {"v": "changed"}
    assert call(server, "PUT", f"{CM}/page-c", obj)[0] == 200
    call(server, "GET", f"{CM}?labelSelector=set%3Dlc")  # ... and the changed one too
    code, rest = call(server, "GET", f"{CM}?labelSelector=set%3Dlc&continue={first['metadata']['continue']}")
    assert code == 200 and rest["metadata"]["resourceVersion"] == first["metadata"]["resourceVersion"]
    assert [(i["metadata"]["name"], i["data"]) for i in rest["items"]] == [("page-b", {"v": "1"}),
                                                                           ("page-c", {"v": "1"})]
    code, now = call(server, "GET", f"{CM}/page-c")
    assert now["data"] == {"v": "changed"}


def test_watch_events_carry_the_same_bytes_as_the_list(server: ApiServer) -> None:
    create(server, "w-a")
    _, body = raw(server, "GET", f"{CM}?labelSelector=set%3Dlc")
    listed = json.loads(body)["items"]
    got = events(server, f"{CM}?watch=1&labelSelector=set%3Dlc&sendInitialEvents=true"
                          "&resourceVersionMatch=NotOlderThan&allowWatchBookmarks=true&timeoutSeconds=5", 2)
    assert [e["type"] for e in got] == ["ADDED", "BOOKMARK"]
    assert got[0]["object"] == listed[0]
    assert got[1]["object"]["metadata"]["annotations"] == INITIAL_EVENTS_END


# -- watch-list (KEP-3157) by version ----------------------------------------------------------------------------


@pytest.mark.parametrize(("version", "enabled"), [((1, 27), False), ((1, 31), False), ((1, 32), True),
                                                  ((1, 33), False), ((1, 34), True), ((1, 37), True)])
def test_the_watch_list_gate_defaults_as_upstream(version: tuple[int, int], enabled: bool) -> None:
    assert watch_list_default(version) is enabled


WATCH_LIST = "watch=1&sendInitialEvents=true&resourceVersionMatch=NotOlderThan&timeoutSeconds=1"


@pytest.mark.apiserver(fresh=True, feature_gates={"WatchList": False})
def test_send_initial_events_without_the_gate_is_422_with_upstreams_message(server: ApiServer) -> None:
    code, body = call(server, "GET", f"{CM}?{WATCH_LIST}")
    assert (code, body["reason"]) == (422, "Invalid")
    assert body["message"] == ('ListOptions.meta.k8s.io "" is invalid: sendInitialEvents: Forbidden: '
                               "sendInitialEvents is forbidden for watch unless the WatchList feature gate is enabled")


@pytest.mark.apiserver(fresh=True, feature_gates={"WatchList": False})
def test_without_the_gate_a_watch_from_now_has_no_initial_events_end_bookmark(server: ApiServer) -> None:
    create(server, "gate-a")
    got = events(server, f"{CM}?watch=1&labelSelector=set%3Dlc&allowWatchBookmarks=true&timeoutSeconds=1", 10)
    assert [e["type"] for e in got][:1] == ["ADDED"]
    assert all("annotations" not in e["object"]["metadata"] for e in got if e["type"] == "BOOKMARK")


def test_with_the_gate_a_legacy_watch_with_bookmarks_is_a_watch_list(server: ApiServer) -> None:
    # SetListOptionsDefaults: resourceVersion "" or "0" and neither sendInitialEvents nor resourceVersionMatch.
    create(server, "legacy-a", "legacy-b")
    for rv in ("", "&resourceVersion=0"):
        got = events(server, f"{CM}?watch=1&labelSelector=set%3Dlc&allowWatchBookmarks=true&timeoutSeconds=5{rv}", 3)
        assert [e["type"] for e in got] == ["ADDED", "ADDED", "BOOKMARK"]
        assert got[2]["object"]["metadata"]["annotations"] == INITIAL_EVENTS_END


def test_send_initial_events_false_starts_from_now(server: ApiServer) -> None:
    create(server, "now-a")
    with urllib.request.urlopen(server.url + f"{CM}?watch=1&labelSelector=set%3Dlc&sendInitialEvents=false"
                                             "&resourceVersionMatch=NotOlderThan&timeoutSeconds=10", timeout=30) as resp:
        create(server, "now-b")
        first = json.loads(resp.readline())
    assert (first["type"], first["object"]["metadata"]["name"]) == ("ADDED", "now-b")


def test_send_initial_events_on_a_list_is_refused(server: ApiServer) -> None:
    code, body = call(server, "GET", f"{CM}?sendInitialEvents=true&resourceVersionMatch=NotOlderThan"
                                     "&resourceVersion=0")
    assert (code, body["reason"]) == (422, "Invalid")
    assert "sendInitialEvents: Forbidden: sendInitialEvents is forbidden for list" in body["message"]
