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
from collections.abc import Callable, Iterator, Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Final, TypedDict, Unpack

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


def stream_pages(rest: KubeRest, path: str, *, protobuf: bool = True, **options: Unpack[PageOptions]) -> Iterator[Item]:
    """A paged LIST's objects, undecoded, as `stream_encoded(watch_list=False)` hands them out, with two differences.

    `protobuf`: each page is asked for as kube-apiserver's protobuf first (sliceproto.ACCEPT); a server that does
    not serve it for the resource answers JSON, and each page says which it is (`Item.protobuf`). kube-apiserver
    spends half the CPU on a page of ResourceSlices in protobuf that it spends on the same page in JSON
    (docs/benchmarks.md, "Fleet on kube-apiserver 1.37").

    The next page is requested, from a thread, as soon as this page's continue token is read, so that the server
    encodes it while the caller decodes this one: on a machine where both run, the wait is the longer of the two
    instead of their sum. At most two pages are held (this one's objects, the next one's body)."""
    query, on_restart, page = _paging(options)
    accept = sliceproto.ACCEPT if protobuf else "application/json"
    with ThreadPoolExecutor(1, thread_name_prefix="list-prefetch") as fetcher:
        token = ""
        restarts = 0
        pending: Future[bytes] = fetcher.submit(_get, rest, path, _page_query(query, page, ""), accept)
        while True:
            try:
                body = pending.result()
            except ApiError as exc:
                # 410 Expired, as in `_pages`: the LIST starts again from its first page.
                if exc.status != 410 or not token or restarts >= RESTARTS:
                    raise
                restarts += 1
                token = ""
                on_restart()
                pending = fetcher.submit(_get, rest, path, _page_query(query, page, ""), accept)
                continue
            items, token, is_protobuf = _split_page(body, path)
            if token:
                pending = fetcher.submit(_get, rest, path, _page_query(query, page, token), accept)
            for data in items:
                yield Item(data, is_protobuf)
            del items, body
            if not token:
                return


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
