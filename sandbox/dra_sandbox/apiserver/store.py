"""In-memory object store with etcd's versioning model.

- One global, monotonically increasing resourceVersion for every write (create, update, delete),
  exactly as etcd's revision, so a LIST's resourceVersion orders against every later event.
- A bounded per-resource event history; watching from a version older than what it still holds is
  "too old" (the apiserver answers 410 Expired), like a compacted etcd / a full watch cache.
- Stored objects are never mutated after they are handed in: readers and watch events share them
  safely, and writers build a new dict for each change.

The store is not thread-safe: the API server touches it from its event loop only.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

from .encoding import EncodedObjects

ResourceKey = tuple[str, str]  # (group, plural)
ObjectKey = tuple[str, str]  # (namespace or "", name)
Obj = dict[str, Any]


@dataclass(frozen=True)
class WatchEvent:
    type: str  # ADDED, MODIFIED, DELETED
    rv: int
    obj: Mapping[str, Any]
    prev: Mapping[str, Any] | None = None  # the state before a MODIFIED/DELETED (selector transitions)


class Watcher(Protocol):
    def deliver(self, event: WatchEvent) -> None: ...

    def close(self) -> None: ...


class TooOldError(Exception):
    def __init__(self, requested: int, oldest: int) -> None:
        super().__init__(f"too old resource version: {requested} ({oldest})")
        self.requested = requested
        self.oldest = oldest


def meta(obj: Mapping[str, Any]) -> Mapping[str, Any]:
    m = obj.get("metadata")
    return m if isinstance(m, Mapping) else {}


def object_key(obj: Mapping[str, Any]) -> ObjectKey:
    m = meta(obj)
    return (str(m.get("namespace") or ""), str(m["name"]))


def _with_rv(obj: Mapping[str, Any], rv: int) -> Obj:
    out = dict(obj)
    out["metadata"] = {**meta(obj), "resourceVersion": str(rv)}
    return out


class Store:
    def __init__(self, history_size: int = 1000) -> None:
        if history_size < 1:
            raise ValueError("history_size must be at least 1")
        self._history_size = history_size
        self._rv = 0
        self._objects: dict[ResourceKey, dict[ObjectKey, Obj]] = {}
        self._history: dict[ResourceKey, deque[WatchEvent]] = {}
        self._floor: dict[ResourceKey, int] = {}
        self._watchers: dict[ResourceKey, set[Watcher]] = {}
        # owner uid -> dependents, for the garbage collector
        self._dependents: dict[str, set[tuple[ResourceKey, ObjectKey]]] = {}
        # Served JSON of live objects (LIST and watch reuse it); every write below drops the entry it outdates.
        self.encodings = EncodedObjects()

    @property
    def resource_version(self) -> int:
        return self._rv

    # -- reads ------------------------------------------------------------------------------

    def get(self, rkey: ResourceKey, namespace: str, name: str) -> Obj | None:
        return self._objects.get(rkey, {}).get((namespace, name))

    def objects(self, rkey: ResourceKey, namespace: str | None = None) -> list[Obj]:
        items = self._objects.get(rkey, {})
        keys = sorted(k for k in items if namespace is None or k[0] == namespace)
        return [items[k] for k in keys]

    def is_current(self, rkey: ResourceKey, obj: Mapping[str, Any]) -> bool:
        """`obj` is the very object the store holds under its key now (not an older revision or a copy)."""
        namespace, name = object_key(obj)
        return self.get(rkey, namespace, name) is obj

    def resource_keys(self) -> list[ResourceKey]:
        return [k for k, v in self._objects.items() if v]

    def in_namespace(self, namespace: str) -> Iterator[tuple[ResourceKey, Obj]]:
        for rkey, items in list(self._objects.items()):
            for (ns, _), obj in list(items.items()):
                if ns == namespace:
                    yield rkey, obj

    def dependents_of(self, uid: str) -> list[tuple[ResourceKey, ObjectKey]]:
        return sorted(self._dependents.get(uid, ()))

    # -- writes -----------------------------------------------------------------------------

    def _next_rv(self) -> int:
        self._rv += 1
        return self._rv

    def insert(self, rkey: ResourceKey, obj: Mapping[str, Any]) -> Obj:
        okey = object_key(obj)
        items = self._objects.setdefault(rkey, {})
        if okey in items:
            raise KeyError(okey)
        stored = _with_rv(obj, self._next_rv())
        items[okey] = stored
        self.encodings.forget(rkey, okey)  # nothing to drop unless an entry outlived its object's deletion
        self._index(rkey, okey, None, stored)
        self._emit(rkey, WatchEvent("ADDED", self._rv, stored))
        return stored

    def replace(self, rkey: ResourceKey, obj: Mapping[str, Any]) -> Obj:
        okey = object_key(obj)
        items = self._objects.setdefault(rkey, {})
        prev = items[okey]
        stored = _with_rv(obj, self._next_rv())
        items[okey] = stored
        self.encodings.forget(rkey, okey)
        self._index(rkey, okey, prev, stored)
        self._emit(rkey, WatchEvent("MODIFIED", self._rv, stored, prev))
        return stored

    def remove(self, rkey: ResourceKey, namespace: str, name: str) -> Obj:
        items = self._objects.get(rkey, {})
        prev = items.pop((namespace, name))
        self.encodings.forget(rkey, (namespace, name))
        # The DELETED event carries the last state stamped with the deletion's revision, as the
        # apiserver's watch does, so a watcher can resume from it.
        final = _with_rv(prev, self._next_rv())
        self._index(rkey, (namespace, name), prev, None)
        self._emit(rkey, WatchEvent("DELETED", self._rv, final, prev))
        return final

    def _index(self, rkey: ResourceKey, okey: ObjectKey, old: Mapping[str, Any] | None,
               new: Mapping[str, Any] | None) -> None:
        for obj, add in ((old, False), (new, True)):
            if obj is None:
                continue
            for ref in meta(obj).get("ownerReferences") or []:
                uid = ref.get("uid") if isinstance(ref, Mapping) else None
                if not isinstance(uid, str):
                    continue
                deps = self._dependents.setdefault(uid, set())
                if add:
                    deps.add((rkey, okey))
                else:
                    deps.discard((rkey, okey))
                    if not deps:
                        del self._dependents[uid]

    # -- watch ------------------------------------------------------------------------------

    def _emit(self, rkey: ResourceKey, event: WatchEvent) -> None:
        history = self._history.setdefault(rkey, deque())
        if len(history) >= self._history_size:
            evicted = history.popleft()
            self._floor[rkey] = evicted.rv
        history.append(event)
        for watcher in list(self._watchers.get(rkey, ())):
            watcher.deliver(event)

    def events_since(self, rkey: ResourceKey, rv: int) -> list[WatchEvent]:
        """Events after `rv` for one resource, or TooOldError if some of them were already dropped."""
        floor = self._floor.get(rkey, 0)
        if rv < floor:
            # The watch cache names the oldest version it can still serve from ("oldest-1" in watch_cache.go).
            raise TooOldError(rv, floor)
        return [e for e in self._history.get(rkey, ()) if e.rv > rv]

    def snapshot(self, rkey: ResourceKey, rv: int) -> list[Obj]:
        """The objects of one resource as they were at revision `rv` (etcd's read at a revision), sorted by key;
        TooOldError once the history back to `rv` is gone (a compacted revision)."""
        state = dict(self._objects.get(rkey, {}))
        for event in reversed(self.events_since(rkey, rv)):
            okey = object_key(event.obj)
            if event.type == "ADDED":
                state.pop(okey, None)
            elif event.prev is not None:
                state[okey] = dict(event.prev)
        return [state[k] for k in sorted(state)]

    def add_watcher(self, rkey: ResourceKey, watcher: Watcher) -> None:
        self._watchers.setdefault(rkey, set()).add(watcher)

    def remove_watcher(self, rkey: ResourceKey, watcher: Watcher) -> None:
        self._watchers.get(rkey, set()).discard(watcher)

    def close_watchers(self, rkey: ResourceKey | None = None) -> None:
        """End watches (server shutdown, or a CRD that stopped being served)."""
        keys = [rkey] if rkey is not None else list(self._watchers)
        for k in keys:
            for watcher in list(self._watchers.pop(k, ())):
                watcher.close()

    def compact(self, rkey: ResourceKey | None = None) -> None:
        """Forget all history (like an etcd compaction): older watches then get 410."""
        for k in [rkey] if rkey is not None else list(self._history):
            self._history.pop(k, None)
            self._floor[k] = self._rv
