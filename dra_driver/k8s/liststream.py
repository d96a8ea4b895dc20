"""Reading a whole collection once, each object decoded as it arrives: the streaming watch-list of KEP-3157 where
the server offers it, else a LIST in pages.

`dra-driver explain` over a fleet reads every ResourceSlice (1000 nodes: 3,004 slices, 128 MB of JSON). Neither
way here holds the whole answer as bytes beside its decoded objects: a watch-list is one JSON line per object,
a paged LIST one page of PAGE objects at a time, and the caller gets each object as soon as it is decoded (and can
drop it at once: `explain` keeps only the slices of pools its claim can use).

Watch-list (KEP-3157, `sendInitialEvents=true`): `watch=true&sendInitialEvents=true&allowWatchBookmarks=true&
resourceVersionMatch=NotOlderThan&resourceVersion=` sends every object as an ADDED event, then a BOOKMARK whose
`metadata.annotations["k8s.io/initial-events-end"]` is "true" (the state at that resourceVersion is complete).
kube-apiserver's WatchList gate is beta and on by default in 1.34-1.37 (1.32 on, 1.33 off again:
staging/src/k8s.io/apiserver/pkg/features/kube_features.go); where it is off the server refuses the request
with 422 ("sendInitialEvents is forbidden for watch unless the WatchList feature gate is enabled", apimachinery
pkg/apis/meta/internalversion/validation), and a user whose role grants `list` but not `watch` gets 403: both
fall back to the paged LIST, as does a stream that ends before its end bookmark (docs/reference/api-requests.md).

Paged LIST: `limit`/`continue`, as client-go's pager. A continue token the server no longer holds (410 Expired:
the resourceVersion it pins was compacted) restarts the LIST from the first page, at most RESTARTS times; the
caller's `on_restart` is called first, so that it drops what it kept of the objects handed out before.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Final, TypedDict, Unpack, cast

import msgspec
import urllib3.exceptions

from dra_driver.k8s import sliceproto
from dra_driver.k8s.client import ApiError, JsonObject, KubeRest, decode_json

PAGE: Final = 500
RESTARTS: Final = 3
INITIAL_EVENTS_END: Final = "k8s.io/initial-events-end"
# Statuses of a watch-list request that mean "not offered here" (see the module doc), not "failed".
WATCH_LIST_REFUSED: Final = frozenset({400, 403, 405, 422})
WATCH_LIST_TIMEOUT_S: Final = 300
CHUNK: Final = 1 << 16


@dataclass(frozen=True)
class ListedVia:
    """How a collection was read: "watch-list" or "pages"; `fallback` says why watch-list was not used."""

    how: str
    fallback: str = ""
    restarts: int = 0


class _WatchListUnavailable(Exception):
    pass


class _Event(msgspec.Struct, frozen=True):
    type: str
    object: msgspec.Raw


class _ListMeta(msgspec.Struct, frozen=True):
    continue_: str | None = msgspec.field(default=None, name="continue")


class _Page(msgspec.Struct, frozen=True):
    items: list[msgspec.Raw] | None = None
    metadata: _ListMeta | None = None


_EVENT = msgspec.json.Decoder(_Event)
_PAGE = msgspec.json.Decoder(_Page)


class PageOptions(TypedDict, total=False):
    """How `stream_encoded` and `stream_pages` read a LIST (their defaults: `_paging`). `query`: added to each
    request. `on_restart`: called before objects are handed out again from the start (a paged LIST whose continue
    token expired, or a watch-list that broke off and falls back): the caller drops what it kept. `page`: objects
    per page of a LIST."""

    query: Mapping[str, str | int | bool] | None
    on_restart: Callable[[], None]
    page: int


class ReadOptions(PageOptions, total=False):
    """The options of `stream_encoded`, which `stream_collection` passes on (their defaults are its)."""

    watch_list: bool


def _paging(options: PageOptions) -> tuple[Mapping[str, str | int | bool] | None, Callable[[], None], int]:
    """(query, on_restart, page), with their defaults: no query, nothing to drop, PAGE."""
    return options.get("query"), options.get("on_restart", _nothing), options.get("page", PAGE)


def _nothing() -> None:
    pass


def stream_collection(
    rest: KubeRest, path: str, **options: Unpack[ReadOptions]
) -> tuple[Iterator[JsonObject], Callable[[], ListedVia]]:
    """As `stream_encoded`, each object decoded."""
    encoded, via = stream_encoded(rest, path, **options)
    return (_decoded(encoded, path), via)


def list_all(rest: KubeRest, path: str, query: Mapping[str, str | int | bool] | None = None) -> list[JsonObject]:
    """Every item of a LIST, fetched in pages of PAGE (a continue token that expired restarts it)."""
    items: list[JsonObject] = []
    listed, _ = stream_collection(rest, path, query=query, watch_list=False, on_restart=items.clear)
    items.extend(listed)
    return items


def _decoded(encoded: Iterator[bytes], path: str) -> Iterator[JsonObject]:
    for raw in encoded:
        try:
            yield decode_json(raw, strict=True)
        except ValueError as exc:
            raise ApiError(0, f"list {path}: an item that is not an object: {exc}") from exc


def stream_encoded(
    rest: KubeRest, path: str, *, watch_list: bool = True, **options: Unpack[PageOptions]
) -> tuple[Iterator[bytes], Callable[[], ListedVia]]:
    """(the collection's objects, each as its JSON bytes, undecoded; a function telling how they were read once the
    iterator is done). For a caller that decodes only part of most objects (`PoolSieve.add_encoded` in
    allocation/prune.py): only the envelope (event type, page's items and continue token) is decoded here.

    `watch_list`: False reads a paged LIST straight away; the other options: PageOptions."""
    query, on_restart, page = _paging(options)
    via: list[ListedVia] = [ListedVia("pages")]

    def objects() -> Iterator[bytes]:
        if watch_list:
            sent = 0
            try:
                for obj in _watch_list(rest, path, query):
                    sent += 1
                    yield obj
                via[0] = ListedVia("watch-list")
                return
            except _WatchListUnavailable as refused:
                if sent:
                    on_restart()
                fallback = str(refused)
        else:
            fallback = "not asked for"
        restarts = 0
        for obj, restarted in _pages(rest, path, query, page):
            if restarted:
                restarts += 1
                on_restart()
                continue
            yield obj
        via[0] = ListedVia("pages", fallback, restarts)

    return objects(), lambda: via[0]


def _pages(
    rest: KubeRest, path: str, query: Mapping[str, str | int | bool] | None, page: int
) -> Iterator[tuple[bytes, bool]]:
    """(object's bytes, False) per item; (b"", True) where the LIST starts again from its first page."""
    token = ""
    restarts = 0
    while True:
        page_query: dict[str, str | int | bool] = {**(query or {}), "limit": page}
        if token:
            page_query["continue"] = token
        try:
            body = rest.request_bytes("GET", path, query=page_query)
        except ApiError as exc:
            # 410 Expired: the continue token's resourceVersion is gone (upstream: "The provided continue parameter
            # is too old to display a consistent list result"); a consistent LIST needs a fresh start.
            if exc.status != 410 or not token or restarts >= RESTARTS:
                raise
            restarts += 1
            token = ""
            yield b"", True
            continue
        try:
            answer = _PAGE.decode(body)
        except msgspec.DecodeError as exc:
            raise ApiError(0, f"list {path}: not a list: {exc}") from exc
        for item in answer.items or ():
            yield bytes(item), False
        token = (answer.metadata.continue_ if answer.metadata else None) or ""
        if not token:
            return


def _watch_list(rest: KubeRest, path: str, query: Mapping[str, str | int | bool] | None) -> Iterator[bytes]:
    params: dict[str, str | int | bool] = {
        **(query or {}),
        "watch": True,
        "sendInitialEvents": True,
        "allowWatchBookmarks": True,
        "resourceVersionMatch": "NotOlderThan",
        "resourceVersion": "",
        "timeoutSeconds": WATCH_LIST_TIMEOUT_S,
    }
    response = rest.send_streaming("GET", path, query=params, timeout=WATCH_LIST_TIMEOUT_S + 15.0)
    try:
        if not 200 <= response.status < 300:
            body = decode_json(_read_all(response))
            error = ApiError(response.status, str(response.reason or ""), body)
            if response.status in WATCH_LIST_REFUSED:
                raise _WatchListUnavailable(f"watch-list refused: {error}")
            raise error
        for event in _lines(response, path):
            kind = event.type
            if kind == "ADDED":
                yield bytes(event.object)
                continue
            obj = decode_json(bytes(event.object))
            if kind == "BOOKMARK":
                annotations = (obj.get("metadata") or {}).get("annotations") or {}
                if annotations.get(INITIAL_EVENTS_END) == "true":
                    return
            elif kind == "ERROR":
                # A Status: 410 when the resourceVersion is too old, or the server gave up; a LIST still can answer.
                raise _WatchListUnavailable(f"watch-list ended with an error: {obj.get('message') or obj}")
            # MODIFIED/DELETED cannot come before the end bookmark (the initial events are ADDED); ignore others.
        raise _WatchListUnavailable("watch-list ended before its initial-events-end bookmark")
    except (urllib3.exceptions.HTTPError, OSError) as exc:
        raise _WatchListUnavailable(f"watch-list broke off: {exc}") from exc
    finally:
        with contextlib.suppress(Exception):
            response.shutdown()
        with contextlib.suppress(Exception):
            response.release_conn()


def _read_all(response: urllib3.BaseHTTPResponse) -> bytes:
    try:
        return response.read()
    except (urllib3.exceptions.HTTPError, OSError):
        return b""


def _lines(response: urllib3.BaseHTTPResponse, path: str) -> Iterator[_Event]:
    """The stream's JSON lines, each decoded once it is whole (without re-copying the buffer per chunk)."""
    buffer = bytearray()
    for chunk in response.stream(CHUNK, decode_content=True):
        start = 0
        buffer += chunk
        while True:
            end = buffer.find(b"\n", start)
            if end < 0:
                break
            if end > start:
                yield _event(bytes(buffer[start:end]), path)
            start = end + 1
        del buffer[:start]
    if buffer.strip():
        yield _event(bytes(buffer), path)


def _event(line: bytes, path: str) -> _Event:
    try:
        return _EVENT.decode(line)
    except msgspec.DecodeError as exc:
        raise ApiError(0, f"watch-list {path}: undecodable event: {exc}") from exc


# --- pages in either encoding, the next one fetched while this one is read --------------------------------------


@dataclass(frozen=True)
class Item:
    """One object of a LIST, undecoded: its JSON bytes, or (`protobuf`) its protobuf message bytes (no envelope)."""

    data: bytes
    protobuf: bool


def stream_pages(rest: KubeRest, path: str, *, protobuf: bool = True, **options: Unpack[PageOptions]) -> PageStream:
    """A paged LIST's objects, undecoded, as `stream_encoded(watch_list=False)` hands them out, with three
    differences.

    `protobuf`: each page is asked for as kube-apiserver's protobuf first (sliceproto.ACCEPT); a server that does
    not serve it for the resource answers JSON, and each page says which it is (`Item.protobuf`). kube-apiserver
    spends half the CPU on a page of ResourceSlices in protobuf that it spends on the same page in JSON
    (docs/benchmarks.md, "Fleet on kube-apiserver 1.37").

    The pages are fetched by a thread of their own (`PageStream`), which asks for the next page as soon as this
    one has arrived and its continue token is read, whatever the caller is doing: kube-apiserver encodes a page at
    a time, so the wait for the whole LIST is its encoding of every page, not that plus the caller's decoding of
    each. At most three pages are held (the caller's, one waiting for it, the one arriving).

    The first page is asked for at once, before the stream is iterated: a caller starts the LIST, then does its
    other requests and work while the server encodes (`dra-driver explain`)."""
    query, on_restart, page = _paging(options)
    accept = sliceproto.ACCEPT if protobuf else "application/json"
    return PageStream(_PageFetcher(rest, path, query, page, accept), on_restart)


_RESTART: Final = object()  # the fetcher's word that the LIST starts again from its first page
_END: Final = object()


class _Slot:
    """A hand-off of one entry at a time between the fetcher and the reader; `close` ends every wait."""

    def __init__(self) -> None:
        self._ready = threading.Condition()
        self._entries: list[object] = []
        self.closed = False

    def put(self, entry: object) -> bool:
        """Hands `entry` over once the previous one is taken; False when closed (the reader is gone)."""
        with self._ready:
            self._ready.wait_for(lambda: self.closed or not self._entries)
            if self.closed:
                return False
            self._entries.append(entry)
            self._ready.notify_all()
            return True

    def take(self) -> object:
        with self._ready:
            self._ready.wait_for(lambda: self.closed or bool(self._entries))
            if not self._entries:
                return _END
            entry = self._entries.pop()
            self._ready.notify_all()
            return entry

    def close(self) -> None:
        with self._ready:
            self.closed = True
            self._entries.clear()
            self._ready.notify_all()


class _PageFetcher(threading.Thread):
    """Fetches a LIST's pages one after the other into a `_Slot`: (items, protobuf) per page, _RESTART where an
    expired continue token starts it over, then _END, or the exception that ended it."""

    def __init__(self, rest: KubeRest, path: str, query: Mapping[str, str | int | bool] | None, page: int,
                 accept: str) -> None:
        super().__init__(name="list-pages", daemon=True)  # daemon: a reader that fails never waits on a fetch
        self.slot = _Slot()
        self._rest, self._path, self._query, self._page, self._accept = rest, path, query, page, accept

    def run(self) -> None:
        try:
            self._fetch()
        except BaseException as exc:  # handed to the reader, which raises it
            self.slot.put(exc)

    def _fetch(self) -> None:
        token = ""
        restarts = 0
        while not self.slot.closed:
            try:
                body = _get(self._rest, self._path, _page_query(self._query, self._page, token), self._accept)
            except ApiError as exc:
                # 410 Expired, as in `_pages`: the LIST starts again from its first page.
                if exc.status != 410 or not token or restarts >= RESTARTS:
                    raise
                restarts += 1
                token = ""
                if not self.slot.put(_RESTART):
                    return
                continue
            items, token, is_protobuf = _split_page(body, self._path)
            del body
            if not self.slot.put((items, is_protobuf)):
                return
            if not token:
                self.slot.put(_END)
                return


class PageStream:
    """The objects of a LIST that `_PageFetcher` reads in the background (started at once); iterate it once.
    `close()` (or leaving a `with` block, or the iteration's end) lets the fetcher stop."""

    def __init__(self, fetcher: _PageFetcher, on_restart: Callable[[], None]) -> None:
        self._fetcher = fetcher
        self._on_restart = on_restart
        fetcher.start()

    def __iter__(self) -> Iterator[Item]:
        slot = self._fetcher.slot
        try:
            while True:
                entry = slot.take()
                if entry is _END:
                    return
                if entry is _RESTART:
                    self._on_restart()
                    continue
                if isinstance(entry, BaseException):
                    raise entry
                items, is_protobuf = cast(tuple[list[bytes], bool], entry)
                for data in items:
                    yield Item(data, is_protobuf)
                del items, entry
        finally:
            slot.close()

    def set_on_restart(self, on_restart: Callable[[], None]) -> None:
        """What to call where the LIST starts again (PageOptions.on_restart), for a caller that started the stream
        before it had anything to drop."""
        self._on_restart = on_restart

    def close(self) -> None:
        self._fetcher.slot.close()

    def __enter__(self) -> PageStream:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()


def _page_query(query: Mapping[str, str | int | bool] | None, page: int, token: str) -> dict[str, str | int | bool]:
    out: dict[str, str | int | bool] = {**(query or {}), "limit": page}
    if token:
        out["continue"] = token
    return out


def _split_page(body: bytes, path: str) -> tuple[list[bytes], str, bool]:
    """(the page's items undecoded, its continue token, whether they are protobuf)."""
    if sliceproto.is_protobuf(body):
        try:
            items, token = sliceproto.list_page(body)
        except sliceproto.NotProtobuf as exc:
            raise ApiError(0, f"list {path}: not a list: {exc}") from exc
        return items, token, True
    try:
        answer = _PAGE.decode(body)
    except msgspec.DecodeError as exc:
        raise ApiError(0, f"list {path}: not a list: {exc}") from exc
    token = (answer.metadata.continue_ if answer.metadata else None) or ""
    return [bytes(item) for item in answer.items or ()], token, False


def _get(rest: KubeRest, path: str, query: Mapping[str, str | int | bool], accept: str) -> bytes:
    """A GET's body with our own Accept (KubeRest asks for JSON only); ApiError as KubeRest.request_bytes, the
    error's Status read from protobuf where the server answered in it."""
    params = [(k, str(v).lower() if isinstance(v, bool) else str(v)) for k, v in query.items()]
    try:
        response = rest.transport.send(
            "GET", path, query=params, headers={"Accept": accept, "User-Agent": rest.user_agent},
            timeout=rest.timeout,
        )
    except (urllib3.exceptions.HTTPError, OSError) as exc:
        raise ApiError(0, f"GET {path}: {exc}") from exc
    body = bytes(response.data or b"")
    if not 200 <= response.status < 300:
        status = sliceproto.status_of(body) if sliceproto.is_protobuf(body) else decode_json(body)
        raise ApiError(response.status, str(response.reason or ""), status)
    return body
