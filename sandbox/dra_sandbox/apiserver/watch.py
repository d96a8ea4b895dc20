"""WATCH streams: newline-delimited JSON events over a chunked response.

- Without resourceVersion (or with "0"), or with sendInitialEvents=true, the stream starts with a
  synthetic ADDED per existing object (sendInitialEvents=false from "" or "0": no initial state, events from
  now; with a bookmark-allowing watch-list the initial state ends with the `k8s.io/initial-events-end`
  bookmark); otherwise it replays history after the given version, or
  sends one ERROR event carrying a 410 Expired Status when that history is gone (as the apiserver's
  watch cache does: HTTP 200, then the error event).
- Selectors apply to transitions: an object that stops matching arrives as DELETED, one that starts
  matching as ADDED.
- BOOKMARK events (allowWatchBookmarks=true) come every `bookmark_interval` seconds and right before
  the server ends the watch at timeoutSeconds.

Snapshot, history replay and registration happen in one synchronous step on the event loop, so no
write can slip between them.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Final

from aiohttp import web

from . import errors
from .labelselector import LabelSelector
from .lifecycle import Resources, Target
from .selectors import FieldSelector
from .store import TooOldError, WatchEvent, meta

INITIAL_EVENTS_END: Final = "k8s.io/initial-events-end"


@dataclass(frozen=True)
class _Item:
    type: str
    obj: Mapping[str, Any]


@dataclass(frozen=True)
class WatchParams:
    resource_version: str  # "", "0" or a number
    timeout: float
    bookmarks: bool
    # sendInitialEvents: True/False as sent, or as defaulted (SetListOptionsDefaults: with the WatchList gate on, a
    # watch from "" or "0" that sets neither it nor resourceVersionMatch gets True); None: unset and not defaulted.
    send_initial_events: bool | None
    bookmark_interval: float


Encode = Callable[[Mapping[str, Any]], bytes]  # an object as served, JSON-encoded (the store's cached bytes)


class QueueWatcher:
    """Filters store events for one watch request and queues what the client should see."""

    def __init__(self, t: Target, labels: LabelSelector, fields: FieldSelector) -> None:
        self._t = t
        self._labels = labels
        self._fields = fields
        self.queue: asyncio.Queue[_Item | None] = asyncio.Queue()  # None: the server closed the watch

    def _matches(self, obj: Mapping[str, Any] | None) -> bool:
        if obj is None:
            return False
        if self._t.namespace and meta(obj).get("namespace") != self._t.namespace:
            return False
        return self._labels.matches(meta(obj).get("labels")) and self._fields.matches(obj, self._t.rt.field_labels)

    def deliver(self, event: WatchEvent) -> None:
        now, before = self._matches(event.obj), self._matches(event.prev)
        if event.type == "ADDED" and now:
            self.queue.put_nowait(_Item("ADDED", event.obj))
        elif event.type == "MODIFIED":
            if now and before:
                self.queue.put_nowait(_Item("MODIFIED", event.obj))
            elif now:
                self.queue.put_nowait(_Item("ADDED", event.obj))
            elif before and event.prev is not None:
                # Leaving the selector: the old state, stamped with this event's version.
                gone = dict(event.prev)
                gone["metadata"] = {**meta(event.prev), "resourceVersion": str(event.rv)}
                self.queue.put_nowait(_Item("DELETED", gone))
        elif event.type == "DELETED" and (before or now):
            self.queue.put_nowait(_Item("DELETED", event.obj))

    def close(self) -> None:
        self.queue.put_nowait(None)


def _line(event_type: str, obj: Mapping[str, Any]) -> bytes:
    return (json.dumps({"type": event_type, "object": obj}, separators=(",", ":")) + "\n").encode()


def _encoded_line(event_type: str, data: bytes) -> bytes:
    """`_line(event_type, obj)` for an object already encoded as `data`: the same bytes."""
    return b"".join((b'{"type":', json.dumps(event_type).encode(), b',"object":', data, b"}\n"))


TOO_LARGE_WAIT_SECONDS: Final = 3.0  # the watch cache's blockTimeout before "Too large resource version"


async def wait_for_version(res: Resources, rv: int) -> None:
    """A read at a version newer than any write waits, as the watch cache does (`waitUntilFreshAndBlock`), then
    gives up with 504 `Too large resource version`."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + TOO_LARGE_WAIT_SECONDS
    while res.store.resource_version < rv:
        if loop.time() >= deadline:
            raise errors.resource_version_too_large(rv, res.store.resource_version)
        await asyncio.sleep(0.05)  # writes run on this loop; yielding lets them land


def _future_version(resource_version: str) -> int | None:
    try:
        return int(resource_version)
    except ValueError:
        return None


async def serve_watch(request: web.Request, resources: Resources, t: Target, labels: LabelSelector,
                      fields: FieldSelector, params: WatchParams, encode: Encode,
                      started: Callable[[], None]) -> web.StreamResponse:
    """Stream events until timeout, server shutdown or client disconnect; `started` runs once the
    watch is registered (the request log records watches then, so tests can wait for them)."""
    store = resources.store
    rt = t.rt
    watcher = QueueWatcher(t, labels, fields)
    initial: list[Mapping[str, Any]] = []
    failure: errors.ApiError | None = None  # sent as the watch's one ERROR event (HTTP 200), as the cacher does
    wanted = _future_version(params.resource_version)
    if wanted is not None and wanted > store.resource_version:
        try:  # the cacher waits for its cache to reach the version first
            await wait_for_version(resources, wanted)
        except errors.ApiError as exc:
            failure = exc
    legacy_start = params.resource_version in ("", "0")
    if failure is None and (params.send_initial_events or (params.send_initial_events is None and legacy_start)):
        initial = list(resources.list_objects(t, labels, fields).items)
    elif failure is None and legacy_start:
        pass  # sendInitialEvents=false from "" or "0": from now on, no initial state (watch_cache.go)
    elif failure is None:
        try:
            for event in store.events_since(rt.key, int(params.resource_version)):
                watcher.deliver(event)
        except TooOldError as exc:
            failure = errors.expired(str(exc))
    start_rv = store.resource_version
    if failure is None:
        store.add_watcher(rt.key, watcher)
    started()
    resp = web.StreamResponse(status=200, headers={"Content-Type": "application/json"})
    resp.enable_chunked_encoding()
    try:
        await resp.prepare(request)
        if failure is not None:
            await resp.write(_line("ERROR", failure.status()))
            return resp
        for obj in initial:
            await resp.write(_encoded_line("ADDED", encode(obj)))
        if params.send_initial_events and params.bookmarks:
            await resp.write(_line("BOOKMARK", _bookmark(t, start_rv, initial_end=True)))
        await _pump(resp, watcher, t, params, encode, lambda: store.resource_version)
    except ConnectionError:
        pass  # the client went away
    finally:
        store.remove_watcher(rt.key, watcher)
    return resp


def _bookmark(t: Target, rv: int, *, initial_end: bool = False) -> dict[str, Any]:
    m: dict[str, Any] = {"resourceVersion": str(rv)}
    if initial_end:
        m["annotations"] = {INITIAL_EVENTS_END: "true"}
    return {"kind": t.rt.kind, "apiVersion": t.rt.api_version(t.version), "metadata": m}


async def _pump(resp: web.StreamResponse, watcher: QueueWatcher, t: Target, params: WatchParams, encode: Encode,
                current_rv: Callable[[], int]) -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + params.timeout
    next_bookmark = loop.time() + params.bookmark_interval

    async def flush_and_bookmark() -> bool:
        # Everything queued so far precedes the bookmark's version, so send it first.
        closed = False
        pending: list[_Item] = []
        while not watcher.queue.empty():
            queued = watcher.queue.get_nowait()
            if queued is None:
                closed = True
                break
            pending.append(queued)
        rv = current_rv()
        for p in pending:
            await resp.write(_encoded_line(p.type, encode(p.obj)))
        if not closed:
            await resp.write(_line("BOOKMARK", _bookmark(t, rv)))
        return closed

    while True:
        now = loop.time()
        if now >= deadline:
            if params.bookmarks:
                await flush_and_bookmark()
            return
        wait = deadline - now
        if params.bookmarks:
            wait = min(wait, max(next_bookmark - now, 0.0))
        try:
            item = await asyncio.wait_for(watcher.queue.get(), timeout=wait)
        except TimeoutError:
            if params.bookmarks and loop.time() >= next_bookmark and loop.time() < deadline:
                if await flush_and_bookmark():
                    return
                next_bookmark = loop.time() + params.bookmark_interval
            continue
        if item is None:
            return
        await resp.write(_encoded_line(item.type, encode(item.obj)))
