"""WATCH over real HTTP: kubernetes.watch.Watch, kubernetes.aio and raw streams; resume, 410, bookmarks,
selectors, initial events, many concurrent watchers."""

from __future__ import annotations

import asyncio
import json
import threading
import time
import urllib.request
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import aiohttp
import kubernetes.client as k
import pytest
from kubernetes import watch
from kubernetes.client.exceptions import ApiException

from dra_driver.defaults import DRIVER_NAME
from dra_sandbox.apiserver import ApiServer
from tests.kube_models import meta, resource_version
from tests.polling import wait_for

pytestmark = pytest.mark.apiserver(bookmark_interval=0.2)


def unique(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


def cm(name: str, **labels: str) -> k.V1ConfigMap:
    return k.V1ConfigMap(metadata=k.V1ObjectMeta(name=name, labels=labels or None))


def raw_events(server: ApiServer, path: str, count: int | None = None, timeout: float = 10.0) -> list[dict[str, Any]]:
    """Decoded event lines of a watch stream: the first `count`, or all until the server ends it."""
    with urllib.request.urlopen(server.url + path, timeout=timeout) as resp:
        assert resp.status == 200
        assert resp.headers.get("Transfer-Encoding") == "chunked"
        events: list[dict[str, Any]] = []
        while count is None or len(events) < count:
            line = resp.readline()
            if not line:
                break
            events.append(json.loads(line))
        return events


class Watch(watch.Watch):
    """kubernetes.watch.Watch with the annotations the package leaves out (kubernetes.watch is unannotated)."""

    def __init__(self) -> None:
        super().__init__()  # type: ignore[no-untyped-call]

    def stream(self, func: Callable[..., Any], *args: Any, **kwargs: Any) -> Iterator[dict[str, Any]]:
        events: Iterator[dict[str, Any]] = super().stream(func, *args, **kwargs)  # type: ignore[no-untyped-call]
        return events

    def stop(self) -> None:
        super().stop()  # type: ignore[no-untyped-call]


def take(stream: Iterator[dict[str, Any]], w: Watch, n: int) -> list[dict[str, Any]]:
    """The first n events of a Watch stream, then stop it (no waiting for timeoutSeconds)."""
    out = []
    for event in stream:
        out.append(event)
        if len(out) == n:
            w.stop()
    return out


def test_live_added_modified_deleted(server: ApiServer, api: k.ApiClient) -> None:
    core = k.CoreV1Api(api)
    label = unique("live")
    events: list[tuple[str, Any]] = []
    w = Watch()

    def consume() -> None:
        for event in w.stream(core.list_namespaced_config_map, "default", label_selector=f"test={label}",
                              timeout_seconds=10):
            events.append((event["type"], event["object"]))
            if len(events) == 3:
                w.stop()

    before = server.request_log.count(verb="watch", resource="configmaps")
    thread = threading.Thread(target=consume)
    thread.start()
    wait_for(lambda: server.request_log.count(verb="watch", resource="configmaps") > before, 5.0, "watch start")
    name = unique("cm")
    created = core.create_namespaced_config_map("default", cm(name, test=label))
    core.patch_namespaced_config_map(name, "default", {"data": {"k": "v"}})
    core.delete_namespaced_config_map(name, "default")
    thread.join(10)
    assert not thread.is_alive()
    assert [t for t, _ in events] == ["ADDED", "MODIFIED", "DELETED"]
    assert isinstance(events[0][1], k.V1ConfigMap) and meta(events[0][1]).uid == meta(created).uid
    versions = [resource_version(o) for _, o in events]
    assert versions == sorted(versions) and len(set(versions)) == 3
    assert events[1][1].data == {"k": "v"}


def test_resume_from_resource_version_replays_history(server: ApiServer, api: k.ApiClient) -> None:
    res = k.ResourceV1Api(api)
    start = meta(res.list_resource_slice()).resource_version
    name = unique("slice")
    res.create_resource_slice(k.V1ResourceSlice.model_validate({"metadata": {"name": name}, "spec": {
        "driver": DRIVER_NAME, "nodeName": "n1", "pool": {"name": "n1", "generation": 1, "resourceSliceCount": 1}}}))
    res.patch_resource_slice(name, {"spec": {"pool": {"generation": 2}}})
    w = Watch()
    seen = [(e["type"], e["object"].spec.pool.generation)
            for e in take(w.stream(res.list_resource_slice, resource_version=start, timeout_seconds=5,
                                   field_selector=f"metadata.name={name}"), w, 2)]
    assert seen == [("ADDED", 1), ("MODIFIED", 2)]


def test_watch_without_resource_version_starts_with_current_objects(server: ApiServer, api: k.ApiClient) -> None:
    core = k.CoreV1Api(api)
    label = unique("init")
    for i in range(3):
        core.create_namespaced_config_map("default", cm(f"{label}-{i}", test=label))
    events = raw_events(server, f"/api/v1/namespaces/default/configmaps?watch=true&labelSelector=test%3D{label}"
                                "&timeoutSeconds=5", count=3)
    assert [(e["type"], e["object"]["metadata"]["name"]) for e in events] == [
        ("ADDED", f"{label}-0"), ("ADDED", f"{label}-1"), ("ADDED", f"{label}-2")]
    assert events[0]["object"]["kind"] == "ConfigMap" and events[0]["object"]["apiVersion"] == "v1"


def test_send_initial_events_ends_with_marked_bookmark(server: ApiServer, api: k.ApiClient) -> None:
    core = k.CoreV1Api(api)
    label = unique("si")
    core.create_namespaced_config_map("default", cm(label, test=label))
    events = raw_events(server, f"/api/v1/namespaces/default/configmaps?watch=1&labelSelector=test%3D{label}"
                                "&sendInitialEvents=true&allowWatchBookmarks=true"
                                "&resourceVersionMatch=NotOlderThan&timeoutSeconds=5", count=2)
    assert events[0]["type"] == "ADDED"
    assert events[1]["type"] == "BOOKMARK"
    assert events[1]["object"]["metadata"]["annotations"] == {"k8s.io/initial-events-end": "true"}


def test_selector_transitions_become_added_and_deleted(server: ApiServer, api: k.ApiClient) -> None:
    core = k.CoreV1Api(api)
    start = meta(core.list_namespaced_config_map("default")).resource_version
    name = unique("sel")
    core.create_namespaced_config_map("default", cm(name, tier="gold"))
    core.patch_namespaced_config_map(name, "default", {"metadata": {"labels": {"tier": "silver"}}})
    core.patch_namespaced_config_map(name, "default", {"data": {"ignored": "yes"}})  # not matching: unseen
    core.patch_namespaced_config_map(name, "default", {"metadata": {"labels": {"tier": "gold"}}})
    core.delete_namespaced_config_map(name, "default")
    w = Watch()
    events = [(e["type"], e["object"].metadata.labels["tier"])
              for e in take(w.stream(core.list_namespaced_config_map, "default", resource_version=start,
                                     label_selector="tier in (gold)", timeout_seconds=5), w, 4)]
    assert events == [("ADDED", "gold"), ("DELETED", "gold"), ("ADDED", "gold"), ("DELETED", "gold")]


def test_field_selector_applies_to_watches(server: ApiServer, api: k.ApiClient) -> None:
    res = k.ResourceV1Api(api)
    start = meta(res.list_resource_slice()).resource_version
    node = unique("node")
    for n in ("elsewhere", node):  # a broken filter would show "elsewhere" first
        res.create_resource_slice(k.V1ResourceSlice.model_validate({"metadata": {"generateName": "s-"}, "spec": {
            "driver": DRIVER_NAME, "nodeName": n, "pool": {"name": n, "generation": 1, "resourceSliceCount": 1}}}))
    w = Watch()
    seen = [e["object"].spec.node_name for e in take(w.stream(
        res.list_resource_slice, resource_version=start, field_selector=f"spec.nodeName={node}", timeout_seconds=5),
        w, 1)]
    assert seen == [node]


def test_too_old_resource_version_is_410() -> None:
    with ApiServer(watch_history=3) as srv, srv.api_client() as api:
        core = k.CoreV1Api(api)
        start = meta(core.list_namespaced_config_map("default")).resource_version
        for i in range(5):
            core.create_namespaced_config_map("default", cm(f"c{i}"))
        with pytest.raises(ApiException) as err:
            list(Watch().stream(core.list_namespaced_config_map, "default", resource_version=start,
                                      timeout_seconds=2))
        assert err.value.status == 410
        events = raw_events(srv, f"/api/v1/namespaces/default/configmaps?watch=1&resourceVersion={start}"
                                 "&timeoutSeconds=2")
        assert len(events) == 1 and events[0]["type"] == "ERROR"
        status = events[0]["object"]
        assert (status["kind"], status["code"], status["reason"]) == ("Status", 410, "Expired")
        assert status["message"].startswith(f"too old resource version: {start}")
        # A version inside the retained window still works.
        recent = meta(core.list_namespaced_config_map("default")).resource_version
        core.create_namespaced_config_map("default", cm("after"))
        w = Watch()
        after = take(w.stream(core.list_namespaced_config_map, "default", resource_version=recent,
                              timeout_seconds=5), w, 1)
        assert [(e["type"], e["object"].metadata.name) for e in after] == [("ADDED", "after")]


def test_a_watch_at_a_future_version_waits_then_ends_with_one_504_error_event() -> None:
    """The cacher blocks up to 3 s for its cache to reach the version, then sends one ERROR event (HTTP 200) with
    `storage.NewTooLargeResourceVersionError` (504 Timeout, retryAfterSeconds 1), as upstream's cacher tests expect."""
    with ApiServer() as srv, srv.api_client() as api:
        core = k.CoreV1Api(api)
        current = int(str(meta(core.list_namespaced_config_map("default")).resource_version))
        future = current + 1000
        began = time.monotonic()
        events = raw_events(srv, f"/api/v1/namespaces/default/configmaps?watch=1&resourceVersion={future}"
                                 "&timeoutSeconds=30")
        waited = time.monotonic() - began
        assert 2.9 <= waited < 10, waited
        assert len(events) == 1 and events[0]["type"] == "ERROR"
        status = events[0]["object"]
        assert (status["code"], status["reason"]) == (504, "Timeout")
        assert status["message"] == f"Timeout: Too large resource version: {future}, current: {current}"
        assert status["details"]["retryAfterSeconds"] == 1
        assert status["details"]["causes"][0]["reason"] == "ResourceVersionTooLarge"


def test_a_watch_just_ahead_of_the_store_starts_once_the_version_is_reached() -> None:
    with ApiServer() as srv, srv.api_client() as api:
        core = k.CoreV1Api(api)
        current = int(str(meta(core.list_namespaced_config_map("default")).resource_version))
        timer = threading.Timer(0.5, lambda: [core.create_namespaced_config_map("default", cm(f"w{i}"))
                                              for i in range(2)])
        timer.start()
        try:
            events = raw_events(srv, f"/api/v1/namespaces/default/configmaps?watch=1&resourceVersion={current + 1}"
                                     "&timeoutSeconds=5", count=1)
        finally:
            timer.join()
        # Events after the requested version only: the first create (at current + 1) is not replayed.
        assert [(e["type"], e["object"]["metadata"]["name"]) for e in events] == [("ADDED", "w1")]


def test_compaction_expires_every_older_version(server: ApiServer, api: k.ApiClient) -> None:
    with ApiServer() as srv, srv.api_client() as client:
        core = k.CoreV1Api(client)
        core.create_namespaced_config_map("default", cm("a"))
        start = meta(core.list_namespaced_config_map("default")).resource_version
        core.create_namespaced_config_map("default", cm("b"))
        srv.compact()
        events = raw_events(srv, f"/api/v1/namespaces/default/configmaps?watch=1&resourceVersion={start}"
                                 "&timeoutSeconds=5")
        assert len(events) == 1 and events[0]["type"] == "ERROR" and events[0]["object"]["code"] == 410


def test_bookmarks_are_periodic_and_sent_at_timeout(server: ApiServer, api: k.ApiClient) -> None:
    core = k.CoreV1Api(api)
    name = unique("bm")
    created = core.create_namespaced_config_map("default", cm(name))
    base = f"/api/v1/namespaces/default/configmaps?watch=1&fieldSelector=metadata.name%3D{name}&timeoutSeconds=1"
    streams: dict[str, list[dict[str, Any]]] = {}
    readers = [threading.Thread(target=lambda q=q: streams.__setitem__(q, raw_events(server, base + q)))
               for q in ("&allowWatchBookmarks=true", "")]
    for reader in readers:
        reader.start()
    for reader in readers:
        reader.join(10)
    events = streams["&allowWatchBookmarks=true"]
    types = [e["type"] for e in events]
    assert types[0] == "ADDED" and types[-1] == "BOOKMARK"
    assert types.count("BOOKMARK") >= 2, types  # 0.2 s interval over 1 s, plus the one at timeout
    for bookmark in (e for e in events if e["type"] == "BOOKMARK"):
        assert bookmark["object"]["kind"] == "ConfigMap"
        assert int(bookmark["object"]["metadata"]["resourceVersion"]) >= resource_version(created)
    assert [e["type"] for e in streams[""]] == ["ADDED"]  # no bookmarks unless asked for


def test_bookmarks_advance_the_python_watch(server: ApiServer, api: k.ApiClient) -> None:
    core = k.CoreV1Api(api)
    w = Watch()
    start = meta(core.list_namespaced_config_map("default")).resource_version
    first = take(w.stream(core.list_namespaced_config_map, "default", field_selector="metadata.name=none-such",
                          allow_watch_bookmarks=True, resource_version=start, timeout_seconds=5), w, 1)
    assert [e["type"] for e in first] == ["BOOKMARK"]
    assert w.resource_version is not None and int(w.resource_version) > 0


def test_invalid_selector_on_watch_is_bad_request(server: ApiServer, api: k.ApiClient) -> None:
    with pytest.raises(ApiException) as err:
        list(Watch().stream(k.ResourceV1Api(api).list_resource_slice, field_selector="spec.color=red",
                                  timeout_seconds=1))
    assert err.value.status == 400


def test_kubernetes_aio_watch(server: ApiServer, api: k.ApiClient) -> None:
    from kubernetes.aio import client as aclient
    from kubernetes.aio import watch as awatch

    core = k.CoreV1Api(api)
    label = unique("aio")
    start = meta(core.list_namespaced_config_map("default")).resource_version
    core.create_namespaced_config_map("default", cm(label, test=label))
    core.patch_namespaced_config_map(label, "default", {"data": {"x": "1"}})

    async def run() -> list[tuple[str, str]]:
        config = aclient.Configuration(host=server.url)
        async with aclient.ApiClient(config) as client:
            acore = aclient.CoreV1Api(client)
            seen: list[tuple[str, str]] = []
            async with awatch.Watch() as w:  # type: ignore[no-untyped-call]  # kubernetes.aio.watch is unannotated
                async for event in w.stream(acore.list_namespaced_config_map, "default", resource_version=start,
                                            label_selector=f"test={label}", timeout_seconds=2):
                    seen.append((event["type"], event["object"].metadata.name))
                    if len(seen) == 2:
                        w.stop()
            return seen

    assert asyncio.run(run()) == [("ADDED", label), ("MODIFIED", label)]


def test_many_concurrent_watches_all_see_each_event(server: ApiServer, api: k.ApiClient) -> None:
    watchers = 100
    label = unique("many")

    async def run() -> list[str]:
        before = server.request_log.count(verb="watch", resource="configmaps")
        url = (f"{server.url}/api/v1/namespaces/default/configmaps?watch=1&labelSelector=test%3D{label}"
               "&timeoutSeconds=10")
        async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as session:
            responses = await asyncio.gather(*(session.get(url) for _ in range(watchers)))
            try:
                # The server runs on its own thread and loop: nothing on this loop needs to run meanwhile.
                wait_for(lambda: server.request_log.count(verb="watch", resource="configmaps") >= before + watchers,
                         10, "all watches to start")
                loop = asyncio.get_running_loop()
                await loop.run_in_executor(None, lambda: k.CoreV1Api(api).create_namespaced_config_map(
                    "default", cm(label, test=label)))
                lines = await asyncio.wait_for(asyncio.gather(*(r.content.readline() for r in responses)), 10)
            finally:
                for r in responses:
                    r.close()
        return [json.loads(line)["object"]["metadata"]["name"] for line in lines]

    assert asyncio.run(run()) == [label] * watchers


def test_stop_ends_open_watches_promptly() -> None:
    srv = ApiServer().start()
    started = time.monotonic()
    result: list[int] = []

    def consume() -> None:
        with urllib.request.urlopen(srv.url + "/api/v1/namespaces/default/configmaps?watch=1&timeoutSeconds=60",
                                    timeout=30) as resp:
            result.append(len(resp.read().splitlines()))

    thread = threading.Thread(target=consume)
    thread.start()
    wait_for(lambda: srv.request_log.count(verb="watch") == 1, 5.0, "watch start")
    srv.stop()
    thread.join(10)
    assert not thread.is_alive() and result == [0]
    assert time.monotonic() - started < 10
