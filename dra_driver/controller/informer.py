"""What feeds the controller's view (`clusterview.py`): per resource one paged LIST, then a watch from that LIST's
resourceVersion, in a thread of its own (docs/architecture.md "The controller's start").

kopf delivers an initial LIST as one event per object through its whole handler pipeline; for a fleet's slices
(3,004 at 1,000 nodes, 128 MB of JSON) that took 86 s to the first policy counts. Here the LIST is read a page at
a time (limit/continue, the next page fetched while this one is parsed), each object is handed to the view, which
keeps only what counting needs of it, and the page is dropped: no copy of the whole LIST is held beside its parse.

Then the watch (`allowWatchBookmarks`, so a quiet resource's resume point stays fresh) resumes from the newest
resourceVersion seen whenever it ends (server timeout, connection lost). A resume point the server no longer has
(410 Gone: an HTTP 410, or an ERROR event carrying code 410, as client-go's reflector treats both) starts over
with a new LIST; objects the new LIST lacks are handed to the view as DELETED, so a deletion missed while the
watch was down is not kept forever. This is the informer contract of client-go's reflector
(staging/src/k8s.io/client-go/tools/cache/reflector.go: ListAndWatch, relist on `IsExpired`/`IsGone`).

Only the leader runs these (operator.py starts them with the reconciling operator): a new leader LISTs afresh.
"""

from __future__ import annotations

import concurrent.futures
import gc
import logging
import random
import threading
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from dra_driver.backoff import Backoff, Retries
from dra_driver.k8s.client import ApiError, JsonObject, WatchStream

log = logging.getLogger(__name__)

FEED_SLICES = "/apis/resource.k8s.io/v1/resourceslices"
FEED_CLAIMS = "/apis/resource.k8s.io/v1/resourceclaims"
FEED_NODES = "/api/v1/nodes"
# Objects per LIST page: client-go's pager default (staging/src/k8s.io/client-go/tools/pager/pager.go).
PAGE = 500
# A fleet's ResourceSlices are large (a dgx-h100's MIG slice: ~40 kB of JSON, ~7x that decoded): 100 per page keep
# the two pages held at once (one parsed, the next arriving) to ~50 MB where 500 would be ~250 MB beside the view
# (RSS measured in docs/benchmarks.md "Controller start").
SLICE_PAGE = 100
# One page may be large (500 slices of a fleet of H100 nodes: ~20 MB of JSON); the client's 10 s default is for
# single objects.
PAGE_TIMEOUT_S = 120.0
ADDED, DELETED = "ADDED", "DELETED"


Query = dict[str, str | int | bool]
# One LIST page (the query carries limit/continue) and one watch (query, timeoutSeconds) of a resource. The callers
# spell the path out (operator.feeds): tests/chart/test_rbac.py derives the controller's RBAC from literal paths.
PageRequest = Callable[[Query], JsonObject]
WatchRequest = Callable[[Query, int], WatchStream]


@dataclass(frozen=True)
class Feed:
    """One resource the view follows: how to LIST a page of it and watch it, what to hand each object to, how to
    name an object (its uid; a Node by name, as the view keeps it) and how to build the DELETED object for one
    the view holds and a relist no longer has."""

    name: str  # for logs
    list_page: PageRequest
    watch: WatchRequest
    apply: Callable[[str, JsonObject], None]
    query: Mapping[str, str] | None = None
    by_name: bool = False
    page: int = 0  # objects per LIST page; 0: PAGE

    def key(self, obj: Mapping[str, Any]) -> str:
        meta = obj.get("metadata")
        if not isinstance(meta, Mapping):
            return ""
        return str(meta.get("name" if self.by_name else "uid") or "")

    def gone(self, key: str) -> JsonObject:
        return {"metadata": {"name" if self.by_name else "uid": key}}


def list_pages(
    list_page: PageRequest, query: Mapping[str, str] | None = None, *, page_size: int = 0
) -> Iterator[tuple[list[JsonObject], str]]:
    """A LIST a page at a time: (the page's objects, the LIST's resourceVersion). The next page is requested as
    soon as this one's continue token is known, so the server renders and sends it while the caller works on this
    one. Every page of one LIST is the same snapshot (the continue token carries its resourceVersion). Raises
    ApiError; 410 when a continue token expired (start the LIST over)."""

    def fetch(token: str) -> JsonObject:
        page_query: Query = {**(query or {}), "limit": page_size or PAGE}
        if token:
            page_query["continue"] = token
        return list_page(page_query)

    with concurrent.futures.ThreadPoolExecutor(max_workers=1, thread_name_prefix="list-page") as pool:
        pending: concurrent.futures.Future[JsonObject] | None = pool.submit(fetch, "")
        while pending is not None:
            page = pending.result()
            meta = page.get("metadata") or {}
            token = str(meta.get("continue") or "")
            pending = pool.submit(fetch, token) if token else None
            items = [i for i in page.pop("items", None) or () if isinstance(i, dict)]
            del page
            yield items, str(meta.get("resourceVersion") or "")


class Reflector:
    """LIST then watch one Feed until `stop` is set (run it in a thread: `run`)."""

    def __init__(
        self,
        feed: Feed,
        stop: threading.Event,
        *,
        watch_timeout_seconds: int,
        on_synced: Callable[[str], None],
        rng: random.Random | None = None,
    ) -> None:
        self.feed = feed
        self.stop = stop
        self.watch_timeout_seconds = watch_timeout_seconds
        self.on_synced = on_synced
        self.rng = rng or random.Random()  # noqa: S311 - jitter, not security
        self._known: set[str] = set()  # keys of the objects handed to the view and not deleted since
        self._stream: WatchStream | None = None
        self._lock = threading.Lock()
        self.lists = 0  # LISTs done (the first sync and every relist), for tests and logs

    def close(self) -> None:
        """Ends a watch blocked in another thread (after `stop` is set)."""
        with self._lock:
            stream = self._stream
        if stream is not None:
            stream.close()

    def run(self) -> None:
        version: str | None = None  # None: LIST first
        retries = Retries(Backoff(1.0, 30.0, jitter=0.5), self.rng)
        while not self.stop.is_set():
            try:
                if version is None:
                    version = self.relist()
                    self.on_synced(self.feed.name)
                version = self.watch(version)
                retries.reset()
            except ApiError as exc:
                if exc.status == 410:
                    log.info("%s: resume point expired (410); listing again", self.feed.name)
                    version = None
                    continue
                delay = retries.next()
                log.warning("%s: %s; again in %.1f s", self.feed.name, exc, delay)
                self.stop.wait(delay)
            except Exception:
                log.exception("%s: LIST/watch failed; listing again", self.feed.name)
                version = None
                self.stop.wait(1.0)

    def relist(self) -> str:
        """One paged LIST handed to the view; objects it held that the LIST lacks are handed over as DELETED.
        Returns the LIST's resourceVersion."""
        seen: set[str] = set()
        version = ""
        for items, listed in list_pages(self.feed.list_page, self.feed.query, page_size=self.feed.page):
            version = listed
            for obj in items:
                key = self.feed.key(obj)
                if key:
                    seen.add(key)
                    self.feed.apply(ADDED, obj)
            if self.stop.is_set():
                raise ApiError(0, f"{self.feed.name}: stopped while listing")
        for key in self._known - seen:
            self.feed.apply(DELETED, self.feed.gone(key))
        self._known = seen
        self.lists += 1
        return version

    def watch(self, version: str) -> str:
        """Events from `version` until the server ends the watch; returns the newest resourceVersion seen."""
        query: Query = {
            **(self.feed.query or {}),
            "allowWatchBookmarks": True,
            "resourceVersion": version,
        }
        # Jittered, as client-go's reflector does, so the watches of several resources do not end in step.
        timeout = max(1, round(self.watch_timeout_seconds * (1 + self.rng.random())))
        stream = self.feed.watch(query, timeout)
        with self._lock:
            self._stream = stream
        try:
            if self.stop.is_set():
                return version
            for event in stream:
                if self.stop.is_set():
                    break
                kind = event.get("type")
                obj = event.get("object")
                if not isinstance(obj, dict):
                    continue
                if kind == "ERROR":  # a Status; 410 Gone when the resume point has expired
                    raise ApiError(int(obj.get("code") or 500), str(obj.get("reason") or "watch error"), obj)
                version = str((obj.get("metadata") or {}).get("resourceVersion") or version)
                if kind not in (ADDED, "MODIFIED", DELETED):
                    continue  # BOOKMARK: only the version
                key = self.feed.key(obj)
                if not key:
                    continue
                if kind == DELETED:
                    self._known.discard(key)
                else:
                    self._known.add(key)
                self.feed.apply(str(kind), obj)
        finally:
            with self._lock:
                self._stream = None
            stream.close()
        return version


class Feeds:
    """The view's Reflectors, one thread each. `start()`, then `stop()` (blocking: run it in an executor).

    The cyclic garbage collector is paused from `start()` until every feed's first LIST is in, then the heap
    built so far is frozen (`gc.freeze`): the initial sync allocates a fleet's worth of small objects that all
    stay alive, and each collection would rescan them (40 % of the LIST's CPU at 100 nodes, measured). The view
    holds no reference cycles (frozen dataclasses, dicts and tuples), so reference counting alone frees what a
    later change drops. Nothing is paused if the collector was off already."""

    def __init__(self, feeds: list[Feed], *, watch_timeout_seconds: int,
                 on_synced: Callable[[str], None]) -> None:
        self._stop = threading.Event()
        self._on_synced = on_synced
        self._pending = {f.name for f in feeds}
        self._lock = threading.Lock()
        self._gc_paused = False
        self.reflectors = [
            Reflector(f, self._stop, watch_timeout_seconds=watch_timeout_seconds, on_synced=self._synced)
            for f in feeds
        ]
        self._threads = [
            threading.Thread(target=r.run, name=f"feed-{r.feed.name}", daemon=True) for r in self.reflectors
        ]

    def start(self) -> None:
        with self._lock:
            if self._pending and gc.isenabled():
                gc.disable()
                self._gc_paused = True
        for thread in self._threads:
            thread.start()

    def _synced(self, name: str) -> None:
        with self._lock:
            self._pending.discard(name)
            if not self._pending:
                self._resume_gc(freeze=True)
        self._on_synced(name)

    def _resume_gc(self, *, freeze: bool) -> None:
        if self._gc_paused:
            self._gc_paused = False
            if freeze:
                gc.freeze()
            gc.enable()

    def stop(self, timeout: float = 10.0) -> None:
        self._stop.set()
        with self._lock:
            self._resume_gc(freeze=False)
        for reflector in self.reflectors:
            reflector.close()
        for thread in self._threads:
            if thread.is_alive():
                thread.join(timeout)
