"""Stored objects' JSON encodings, each rendered once per object resourceVersion and served version.

A real kube-apiserver serves a LIST with resourceVersion="0" (and, since 1.31's ConsistentListFromCache, one
with resourceVersion="" too) from its watch cache, and encodes a watch event once for all its watchers
(`cachingObject` in k8s.io/apiserver pkg/storage/cacher/caching_object.go); its encoders write a list item by
item (KEP-5116 streaming list encoders). The sandbox keeps the same economy: the bytes of each stored object as
served at one version are computed once and reused by every LIST page and watch event until a write replaces
the object, and a list body is assembled from them. The bytes are exactly what `json.dumps(render(obj),
separators=(",", ":"))` gives, so the wire does not change.

Entries are keyed by the stored object's identity (the store never mutates an object after it is handed in,
and every write stores a new one): an old revision read from history (a continue token, resourceVersionMatch
=Exact) or a DELETED event's final state is encoded afresh and not kept. Writes drop the entry of the object
they replace (`forget`), so the cache holds at most one entry per live object.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Mapping
from typing import Any

ResourceKey = tuple[str, str]  # (group, plural)
ObjectKey = tuple[str, str]  # (namespace or "", name)
Variant = tuple[str, str]  # (apiVersion, kind) as served
Render = Callable[[Mapping[str, Any]], Mapping[str, Any]]


def dumps(doc: Any) -> bytes:
    """The server's one JSON encoding (compact separators, ASCII escapes: json.dumps's defaults otherwise)."""
    return json.dumps(doc, separators=(",", ":")).encode()


class EncodedObjects:
    """Per live object: the object it was computed for and its bytes per served variant. Not thread-safe (the
    server touches it from its event loop only)."""

    def __init__(self) -> None:
        self._entries: dict[tuple[ResourceKey, ObjectKey], tuple[Mapping[str, Any], dict[Variant, bytes]]] = {}
        self.renders = 0  # encodings computed (a test and the bench read it: hits are the LIST's items minus these)

    def encoded(self, rkey: ResourceKey, okey: ObjectKey, obj: Mapping[str, Any], variant: Variant,
                render: Render, *, current: bool) -> bytes:
        """The bytes of `obj` (stored under `okey`) rendered for `variant`. `current`: `obj` is the object the
        store holds now (only those are kept)."""
        key = (rkey, okey)
        entry = self._entries.get(key)
        if entry is not None and entry[0] is obj:
            cached = entry[1].get(variant)
            if cached is not None:
                return cached
        self.renders += 1
        data = dumps(render(obj))
        if current:
            if entry is None or entry[0] is not obj:
                entry = (obj, {})
                self._entries[key] = entry
            entry[1][variant] = data
        return data

    def forget(self, rkey: ResourceKey, okey: ObjectKey) -> None:
        self._entries.pop((rkey, okey), None)

    def __len__(self) -> int:
        return len(self._entries)


def list_body(head: Mapping[str, Any], items: Iterable[bytes]) -> bytes:
    """A list object whose `items` are already encoded: the bytes `dumps({**head, "items": [...]})` gives."""
    opening = dumps(dict(head))
    return b"".join((opening[:-1], b',"items":[', b",".join(items), b"]}"))
