"""The controller's view of the cluster for policy status counts and slice hygiene: the driver's ResourceSlices,
the allocated ResourceClaims and the Nodes, fed by one paged LIST per resource and then its watch (`informer.py`,
started by `operator.py` on the leader), read by the policies' counters and the janitor (`hygiene.py`). Nothing
is counted or swept before every feed's first LIST is in (`synced`).

Counting is debounced by design: events only update this view (cheap) and wake the policies' counters
(`operator.keep_counts`), which recount shortly after a change and at most once per interval, so a thousand
slice events make at most one status patch per policy and interval. Per-slice match results are memoised by
the slice's resourceVersion, so a changed slice costs one re-evaluation, not all of them.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from dra_driver.allocation.model import ParseCache
from dra_driver.cel.environment import DraCelEnvironment
from dra_driver.policy.counts import (
    Counts,
    SliceDevices,
    claim_classes,
    current_slices,
    matching_nodes,
    slice_devices,
    tally,
)

DELETED = "DELETED"
# The view's feeds (informer.Feed names): it is synced once each has had its first LIST.
FEEDS = ("slices", "claims", "nodes")


@dataclass(frozen=True)
class SliceEntry:
    uid: str
    resource_version: str
    devices: SliceDevices


@dataclass
class _Memo:
    version: int = -1
    counts: Counts | None = None
    per_slice: dict[str, tuple[str, list[str | None]]] = field(default_factory=dict)  # uid -> (rv, nodes)


def _meta(body: Mapping[str, Any]) -> Mapping[str, Any]:
    meta = body.get("metadata")
    return meta if isinstance(meta, Mapping) else {}


class ClusterView:
    """Thread-safe: each feed runs in a thread of its own, the counters in kopf's executor. `feeds`: the feed
    names `synced` waits for."""

    def __init__(self, driver: str, cel: DraCelEnvironment, feeds: Sequence[str] = FEEDS) -> None:
        self.driver = driver
        self.cel = cel
        self._lock = threading.Lock()
        self._version = 0
        self._slices: dict[str, SliceEntry] = {}
        self._claims: dict[str, frozenset[str]] = {}  # uid -> classes of its allocated devices
        self._nodes: set[str] = set()
        self._memo: dict[tuple[tuple[str, ...], str], _Memo] = {}
        self._parse_lock = threading.Lock()
        self._listeners: list[Callable[[], None]] = []
        self._parse_cache = ParseCache()  # the fleet's devices share their parsed capacities and counters
        self._synced: set[str] = set()  # the feeds whose first LIST is in (informer.py)
        self._feeds = frozenset(feeds)

    # -- the initial sync ---------------------------------------------------------------------
    def mark_synced(self, feed: str) -> None:
        """`feed`'s first LIST is in the view (informer.Reflector calls this after each LIST; later ones change
        nothing here)."""
        with self._lock:
            first = feed not in self._synced
            self._synced.add(feed)
        if first:
            self.notify()

    @property
    def synced(self) -> bool:
        """Every feed's first LIST is in: counts read now are the cluster's, not a part of it."""
        with self._lock:
            return self._feeds <= self._synced

    # -- events -------------------------------------------------------------------------------
    def on_slice(self, event_type: str | None, body: Mapping[str, Any]) -> None:
        """A slice added, changed or (DELETED; only its uid is read) gone. Only what counting needs of it is kept
        (`SliceDevices`), never the object."""
        spec = body.get("spec")
        uid = str(_meta(body).get("uid") or "")
        if not uid:
            return
        if event_type != DELETED and (not isinstance(spec, Mapping) or spec.get("driver") != self.driver):
            return
        parsed = None
        if event_type != DELETED:
            with self._parse_lock:  # the parse cache is not thread-safe; parses are short
                parsed = slice_devices(body, self._parse_cache)

        def change() -> bool:
            if parsed is None:
                return self._slices.pop(uid, None) is not None
            entry = SliceEntry(uid, str(_meta(body).get("resourceVersion") or ""), parsed)
            changed = self._slices.get(uid) != entry
            self._slices[uid] = entry
            return changed

        self._apply(change)

    def on_claim(self, event_type: str | None, body: Mapping[str, Any]) -> None:
        uid = str(_meta(body).get("uid") or "")
        if not uid:
            return
        classes = frozenset() if event_type == DELETED else claim_classes(body)

        def change() -> bool:
            before = self._claims.pop(uid, frozenset())
            if classes:
                self._claims[uid] = classes
            return before != classes

        self._apply(change)

    def on_node(self, event_type: str | None, body: Mapping[str, Any]) -> None:
        name = str(_meta(body).get("name") or "")
        if not name:
            return
        with self._lock:
            if event_type == DELETED:
                self._nodes.discard(name)
            else:
                self._nodes.add(name)

    def _apply(self, change: Callable[[], bool]) -> None:
        """`change` (True: the view changed) under the lock; a change counts as a new version and is notified."""
        with self._lock:
            changed = change()
            if changed:
                self._version += 1
        if changed:
            self.notify()

    # -- change notification ------------------------------------------------------------------
    def subscribe(self, callback: Callable[[], None]) -> Callable[[], None]:
        """Call `callback` (from the thread of the event, without locks held) after each change that can
        change counts, or when `notify()` is called; returns the unsubscribe function."""
        with self._lock:
            self._listeners.append(callback)

        def unsubscribe() -> None:
            with self._lock:
                if callback in self._listeners:
                    self._listeners.remove(callback)

        return unsubscribe

    def notify(self) -> None:
        with self._lock:
            listeners = list(self._listeners)
        for callback in listeners:
            callback()

    @property
    def version(self) -> int:
        """Grows with every change that can change counts."""
        with self._lock:
            return self._version

    # -- reads --------------------------------------------------------------------------------
    def counts(self, selectors: Sequence[str], class_name: str) -> Counts:
        """The policy's counts; recomputed only when the view changed since the last call for this class."""
        key = (tuple(selectors), class_name)
        with self._lock:
            memo = self._memo.setdefault(key, _Memo())
            if memo.counts is not None and memo.version == self._version:
                return memo.counts
            version = self._version
            slices = list(self._slices.values())
            claims = sum(1 for classes in self._claims.values() if class_name in classes)
        current = {id(s) for s in current_slices(e.devices for e in slices)}
        per_slice: dict[str, tuple[str, list[str | None]]] = {}
        for entry in slices:
            if id(entry.devices) not in current:
                continue
            old = memo.per_slice.get(entry.uid)
            if old is not None and old[0] == entry.resource_version:
                per_slice[entry.uid] = old
            else:
                per_slice[entry.uid] = (entry.resource_version, matching_nodes(self.cel, key[0], entry.devices))
        result = tally((nodes for _, nodes in per_slice.values()), claims)
        with self._lock:
            memo.version, memo.counts, memo.per_slice = version, result, per_slice
        return result

    def forget(self, selectors: Sequence[str], class_name: str) -> None:
        with self._lock:
            self._memo.pop((tuple(selectors), class_name), None)

    def nodes(self) -> frozenset[str]:
        with self._lock:
            return frozenset(self._nodes)

    def slices_by_node(self) -> dict[str, list[tuple[str, str]]]:
        """node name -> [(slice name, uid)] of the driver's slices bound to one node."""
        out: dict[str, list[tuple[str, str]]] = {}
        with self._lock:
            for entry in self._slices.values():
                if entry.devices.node is not None:
                    out.setdefault(entry.devices.node, []).append((entry.devices.name, entry.uid))
        return out
