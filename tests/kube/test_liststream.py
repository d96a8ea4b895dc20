"""Reading a whole collection once (`dra_driver.k8s.liststream`): the watch-list of KEP-3157 against the sandbox API
server, the paged LIST, and every way a server can refuse or cut short the one or the other: 422/403 on the
watch-list, a stream without its initial-events-end bookmark, an ERROR event, a continue token gone (410)."""

from __future__ import annotations

import contextlib
import json
from collections.abc import Callable, Iterator
from typing import Any
from urllib.parse import parse_qs, urlsplit

import pytest

from dra_driver.commands.listing import list_all
from dra_driver.k8s.client import ApiError, KubeRest
from dra_driver.k8s.liststream import INITIAL_EVENTS_END, stream_collection
from dra_sandbox.apiserver import ApiServer
from tests.kube.localrest import QuietHandler, rest_serving

SLICES = "/apis/resource.k8s.io/v1/resourceslices"


def _slice(name: str) -> dict[str, Any]:
    return {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceSlice", "metadata": {"name": name},
            "spec": {"driver": "gpu.dra.dev", "pool": {"name": name, "generation": 1, "resourceSliceCount": 1},
                     "nodeName": name, "devices": []}}


@pytest.fixture(scope="module")
def server() -> Iterator[ApiServer]:
    with ApiServer(garbage_collection=False, kube_version="1.34.0") as srv, srv.rest() as client:
        for i in range(7):
            client.request("POST", SLICES, body=_slice(f"s-{i}"))
        yield srv


def _names(objects: Iterator[dict[str, Any]]) -> list[str]:
    return sorted(o["metadata"]["name"] for o in objects)


def test_the_watch_list_hands_out_every_object_and_stops_at_the_end_bookmark(server: ApiServer) -> None:
    with server.rest() as rest:
        before = server.request_log.count(verb="watch", resource="resourceslices")
        objects, via = stream_collection(rest, SLICES)
        assert _names(objects) == [f"s-{i}" for i in range(7)]  # returns: the open watch did not hang it
        assert via().how == "watch-list" and via().fallback == ""
        assert server.request_log.count(verb="watch", resource="resourceslices") == before + 1


def test_the_paged_list_follows_continue_tokens(server: ApiServer) -> None:
    with server.rest() as rest:
        before = server.request_log.count(verb="list", resource="resourceslices")
        objects, via = stream_collection(rest, SLICES, watch_list=False, page=3)
        assert _names(objects) == [f"s-{i}" for i in range(7)]
        assert via().how == "pages" and via().fallback == "not asked for"
        assert server.request_log.count(verb="list", resource="resourceslices") == before + 3  # 3 + 3 + 1


# --- a scripted server for what the sandbox does not do on its own ---------------------------------------------

Script = Callable[[dict[str, str]], tuple[int, bytes]]


@contextlib.contextmanager
def _scripted(script: Script) -> Iterator[tuple[KubeRest, list[dict[str, str]]]]:
    seen: list[dict[str, str]] = []

    class Handler(QuietHandler):
        def do_GET(self) -> None:
            query = {k: v[0] for k, v in parse_qs(urlsplit(self.path).query, keep_blank_values=True).items()}
            seen.append(query)
            status, body = script(query)
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.end_headers()  # no length: the body ends when the connection closes, as a watch's does
            self.wfile.write(body)

    with rest_serving(Handler) as rest:
        yield rest, seen


def _page(names: list[str], token: str = "") -> bytes:
    return json.dumps({"kind": "ResourceSliceList", "metadata": {"continue": token},
                       "items": [_slice(n) for n in names]}).encode()


def _events(names: list[str], *, end: bool = True, error: str = "") -> bytes:
    lines = [{"type": "ADDED", "object": _slice(n)} for n in names]
    if error:
        lines.append({"type": "ERROR", "object": {"kind": "Status", "code": 410, "message": error}})
    if end:
        lines.append({"type": "BOOKMARK", "object": {"kind": "ResourceSlice", "metadata": {
            "resourceVersion": "9", "annotations": {INITIAL_EVENTS_END: "true"}}}})
    return b"".join(json.dumps(line).encode() + b"\n" for line in lines)


def _pages_of(names: list[str]) -> Script:
    def script(query: dict[str, str]) -> tuple[int, bytes]:
        start = int(query.get("continue") or 0)
        size = int(query["limit"])
        rest_token = str(start + size) if start + size < len(names) else ""
        return 200, _page(names[start:start + size], rest_token)
    return script


@pytest.mark.parametrize("status", [422, 403])
def test_a_refused_watch_list_falls_back_to_the_paged_list(status: int) -> None:
    pages = _pages_of(["a", "b", "c"])

    def script(query: dict[str, str]) -> tuple[int, bytes]:
        if query.get("watch") == "true":
            message = "ListOptions.meta.k8s.io \"\" is invalid: sendInitialEvents: Forbidden: sendInitialEvents is " \
                      "forbidden for watch unless the WatchList feature gate is enabled"
            return status, json.dumps({"kind": "Status", "code": status, "message": message}).encode()
        return pages(query)

    with _scripted(script) as (rest, seen):
        objects, via = stream_collection(rest, SLICES, page=2)
        assert _names(objects) == ["a", "b", "c"]
    assert via().how == "pages" and f"HTTP {status}" in via().fallback
    assert seen[0]["sendInitialEvents"] == "true" and seen[0]["resourceVersionMatch"] == "NotOlderThan"
    assert seen[0]["allowWatchBookmarks"] == "true" and seen[0]["resourceVersion"] == ""
    assert [q.get("continue", "") for q in seen[1:]] == ["", "2"]


@pytest.mark.parametrize("cut", ["no bookmark", "error event"])
def test_a_watch_list_cut_short_restarts_as_a_paged_list(cut: str) -> None:
    pages = _pages_of(["a", "b", "c"])

    def script(query: dict[str, str]) -> tuple[int, bytes]:
        if query.get("watch") == "true":
            return 200, _events(["a", "b"], end=False, error="too old resource version" if cut == "error event" else "")
        return pages(query)

    restarts: list[int] = []
    with _scripted(script) as (rest, _):
        objects, via = stream_collection(rest, SLICES, on_restart=lambda: restarts.append(1))
        handed = [o["metadata"]["name"] for o in objects]
    # The two handed out by the broken stream, a restart, then the whole LIST.
    assert handed == ["a", "b", "a", "b", "c"] and restarts == [1]
    assert via().how == "pages" and via().fallback


def test_a_watch_list_error_that_is_not_a_refusal_is_raised() -> None:
    def script(query: dict[str, str]) -> tuple[int, bytes]:
        return 500, json.dumps({"kind": "Status", "code": 500, "message": "etcd is down"}).encode()

    with _scripted(script) as (rest, _), pytest.raises(ApiError, match="etcd is down"):
        list(stream_collection(rest, SLICES)[0])


def test_an_expired_continue_token_restarts_the_list_from_its_first_page() -> None:
    names = ["a", "b", "c", "d"]
    pages = _pages_of(names)
    expired: list[str] = []

    def script(query: dict[str, str]) -> tuple[int, bytes]:
        if query.get("continue") == "2" and not expired:
            expired.append("2")
            return 410, json.dumps({"kind": "Status", "code": 410, "reason": "Expired", "message":
                                    "The provided continue parameter is too old to display a consistent list result. "
                                    "You can start a new list without the continue parameter."}).encode()
        return pages(query)

    restarts: list[int] = []
    with _scripted(script) as (rest, seen):
        objects, via = stream_collection(rest, SLICES, watch_list=False, page=2, on_restart=lambda: restarts.append(1))
        handed = [o["metadata"]["name"] for o in objects]
        assert [q.get("continue", "") for q in seen] == ["", "2", "", "2"]
    assert handed == ["a", "b", "a", "b", "c", "d"] and restarts == [1] and via().restarts == 1


def test_list_all_keeps_each_object_once_across_a_restart() -> None:
    names = [f"n-{i:04d}" for i in range(1001)]  # three pages of 500 (commands/listing.py's PAGE)
    pages = _pages_of(names)
    expired: list[int] = []

    def script(query: dict[str, str]) -> tuple[int, bytes]:
        if query.get("continue") and not expired:
            expired.append(1)
            return 410, json.dumps({"kind": "Status", "code": 410, "message": "too old"}).encode()
        return pages(query)

    with _scripted(script) as (rest, seen):
        assert [o["metadata"]["name"] for o in list_all(rest, SLICES)] == names
    assert len(seen) == 5 and expired == [1]  # the first page, the expired second, the three pages again


def test_a_continue_token_that_keeps_expiring_is_an_error() -> None:
    def script(query: dict[str, str]) -> tuple[int, bytes]:
        if query.get("continue"):
            return 410, json.dumps({"kind": "Status", "code": 410, "message": "too old"}).encode()
        return 200, _page(["a"], "1")

    with _scripted(script) as (rest, seen), pytest.raises(ApiError, match="too old"):
        list_all(rest, SLICES)
    assert len(seen) == 8  # the first try and three restarts, two requests each
