"""The ResourceSlice publisher: the only writer of this node's ResourceSlices.

A reconcile lists the pool's slices (field selectors `spec.nodeName` and `spec.driver`), compares them
with the desired slices and writes only the difference:
- the content we want is unchanged since our last publish → drift repair at the SAME generation (a slice
  someone deleted or edited is put back; nothing else is touched);
- the content changed (new inventory, health taint, …) → every slice is rewritten at generation + 1, then
  leftovers are deleted. Consumers use only the newest generation and skip a pool until all its slices
  are there, so they never see a half-old, half-new pool;
- nothing differs → zero writes.
A watch on the same selectors wakes the loop when someone else touches a slice; API errors and conflicts
are retried with jittered exponential backoff.
"""

from __future__ import annotations

import copy
import random
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import structlog

from dra_driver.k8s.client import ApiError, JsonObject, KubeRest, WatchStream

log = structlog.get_logger(__name__)

SLICES_PATH = "/apis/resource.k8s.io/v1/resourceslices"
# Desired slices for a generation: the caller builds them (pure builder) for the generation asked for.
DesiredSlices = Callable[[int], list[JsonObject]]


@dataclass(frozen=True)
class ReconcileResult:
    generation: int
    created: int = 0
    updated: int = 0
    deleted: int = 0

    @property
    def writes(self) -> int:
        return self.created + self.updated + self.deleted


def _comparable(obj: JsonObject) -> JsonObject:
    """What we own in a slice: spec (minus server-set taint times), labels and owner references."""
    spec = copy.deepcopy(obj.get("spec") or {})
    for device in spec.get("devices") or []:
        for taint in device.get("taints") or []:
            taint.pop("timeAdded", None)
    meta = obj.get("metadata") or {}
    return {
        "spec": spec,
        "labels": meta.get("labels") or {},
        "owners": meta.get("ownerReferences") or [],
    }


def _content(slices: list[JsonObject]) -> list[JsonObject]:
    """Slices without their generation: equal when only the generation differs."""
    out = []
    for obj in slices:
        c = _comparable(obj)
        c["spec"].get("pool", {}).pop("generation", None)
        c["name"] = obj["metadata"]["name"]
        out.append(c)
    return out


class SlicePublisher:
    def __init__(
        self,
        rest: KubeRest,
        *,
        driver_name: str,
        node_name: str,
        desired: DesiredSlices,
        rng: random.Random | None = None,
        resync_seconds: float = 300.0,
        max_backoff: float = 30.0,
    ) -> None:
        self._rest = rest
        self.driver_name = driver_name
        self.node_name = node_name
        self._desired = desired
        self._rng = rng or random.Random()  # noqa: S311 - jitter, not crypto
        self._resync = resync_seconds
        self._max_backoff = max_backoff
        self._published: list[JsonObject] | None = None  # content of our last successful publish
        self._generation = 0
        self._owner: JsonObject | None = None
        self._trigger = threading.Event()
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []
        self._stream: WatchStream | None = None
        self._own_versions: list[str] = []
        self._own_deletes: set[str] = set()
        self._own_lock = threading.Lock()
        self.last_result: ReconcileResult | None = None
        self.reconciled = threading.Condition()
        self.reconcile_count = 0

    # --- one reconcile -----------------------------------------------------------------------------

    def _selector(self) -> dict[str, str]:
        return {"fieldSelector": f"spec.nodeName={self.node_name},spec.driver={self.driver_name}"}

    def list_slices(self) -> tuple[list[JsonObject], str]:
        listing = self._rest.request("GET", SLICES_PATH, query=self._selector())
        items = [
            s for s in listing.get("items") or [] if (s.get("spec") or {}).get("pool", {}).get("name") == self.node_name
        ]
        return items, str((listing.get("metadata") or {}).get("resourceVersion", ""))

    def _owner_references(self) -> list[JsonObject]:
        if self._owner is None:
            node = self._rest.get(f"/api/v1/nodes/{self.node_name}")
            if node is None:
                return []  # published without an owner; added once the Node exists
            self._owner = {
                "apiVersion": "v1",
                "kind": "Node",
                "name": self.node_name,
                "uid": node["metadata"]["uid"],
                "controller": True,
            }
        return [self._owner]

    def _desired_at(self, generation: int) -> list[JsonObject]:
        owners = self._owner_references()
        slices = self._desired(generation)
        for obj in slices:
            if owners:
                obj["metadata"]["ownerReferences"] = owners
        return slices

    def reconcile(self) -> ReconcileResult:
        existing, _ = self.list_slices()
        by_name = {s["metadata"]["name"]: s for s in existing}
        generation = max((int(s["spec"]["pool"].get("generation", 0)) for s in existing), default=0)
        generation = max(generation, self._generation)
        desired = self._desired_at(generation)
        wanted = _content(desired)
        if self._published is not None and wanted == self._published and existing:
            pass  # same content as our last publish: repair drift at this generation
        elif existing and {n: _comparable(o) for n, o in by_name.items()} == {
            d["metadata"]["name"]: _comparable(d) for d in desired
        }:
            self._published, self._generation = wanted, generation
            return self._done(ReconcileResult(generation))
        else:
            generation += 1  # new content (or nothing there): a new generation, never a mixed pool
            desired = self._desired_at(generation)
        created = updated = 0
        for obj in desired:
            name = obj["metadata"]["name"]
            current = by_name.get(name)
            if current is None:
                self._remember(self._rest.request("POST", SLICES_PATH, body=obj))
                created += 1
            elif _comparable(current) != _comparable(obj):
                body = copy.deepcopy(obj)
                body["metadata"]["resourceVersion"] = current["metadata"]["resourceVersion"]
                _keep_taint_times(current, body)
                self._remember(self._rest.request("PUT", f"{SLICES_PATH}/{name}", body=body))
                updated += 1
        wanted_names = {d["metadata"]["name"] for d in desired}
        deleted = 0
        for name in sorted(set(by_name) - wanted_names):
            with self._own_lock:
                self._own_deletes.add(name)
            try:
                self._rest.request("DELETE", f"{SLICES_PATH}/{name}")
            except ApiError as exc:
                if not exc.not_found:
                    raise
            deleted += 1
        self._published, self._generation = _content(desired), generation
        result = ReconcileResult(generation, created, updated, deleted)
        if result.writes:
            log.info(
                "published resource slices",
                node=self.node_name,
                generation=generation,
                slices=len(desired),
                created=created,
                updated=updated,
                deleted=deleted,
            )
        return self._done(result)

    def _remember(self, written: JsonObject) -> None:
        """Our own writes come back as watch events; they need no reconcile."""
        version = str((written.get("metadata") or {}).get("resourceVersion", ""))
        with self._own_lock:
            self._own_versions.append(version)
            del self._own_versions[:-256]

    def _is_own_event(self, event: JsonObject) -> bool:
        meta = (event.get("object") or {}).get("metadata") or {}
        with self._own_lock:
            if event.get("type") == "DELETED" and meta.get("name") in self._own_deletes:
                self._own_deletes.discard(meta.get("name"))
                return True
            return str(meta.get("resourceVersion", "")) in self._own_versions

    def _done(self, result: ReconcileResult) -> ReconcileResult:
        with self.reconciled:
            self.last_result = result
            self.reconcile_count += 1
            self.reconciled.notify_all()
        return result

    # --- the loop ----------------------------------------------------------------------------------

    def trigger(self) -> None:
        """Ask for a reconcile soon (inventory changed, SIGHUP, watch event)."""
        self._trigger.set()

    def start(self) -> None:
        for target, name in ((self._run, "slice-publisher"), (self._watch, "slice-watch")):
            thread = threading.Thread(target=target, name=name, daemon=True)
            thread.start()
            self._threads.append(thread)

    def stop(self) -> None:
        self._stop.set()
        self._trigger.set()
        if self._stream is not None:
            self._stream.close()
        for thread in self._threads:
            thread.join(timeout=5.0)

    def wait_for_reconciles(self, count: int, timeout: float) -> bool:
        with self.reconciled:
            return self.reconciled.wait_for(lambda: self.reconcile_count >= count, timeout=timeout)

    def _backoff(self, attempt: int) -> float:
        base = min(self._max_backoff, 0.2 * (2**attempt))
        return float(base * (0.5 + self._rng.random() / 2))

    def _run(self) -> None:
        attempt = 0
        while not self._stop.is_set():
            self._trigger.clear()
            try:
                self.reconcile()
                attempt = 0
                self._trigger.wait(self._resync)
            except ApiError as exc:
                delay = self._backoff(attempt)
                attempt += 1
                log.warning("publishing resource slices failed; retrying", error=str(exc), retry_in=round(delay, 2))
                self._stop.wait(delay)
            except Exception:
                delay = self._backoff(attempt)
                attempt += 1
                log.exception("publishing resource slices failed unexpectedly; retrying")
                self._stop.wait(delay)

    def _watch(self) -> None:
        attempt = 0
        while not self._stop.is_set():
            try:
                _, version = self.list_slices()
                query: dict[str, Any] = {**self._selector(), "allowWatchBookmarks": "true"}
                if version:
                    query["resourceVersion"] = version
                stream = self._rest.watch(SLICES_PATH, query=query, timeout_seconds=60)
                self._stream = stream
                if self._stop.is_set():
                    stream.close()
                for event in stream:
                    attempt = 0
                    if self._stop.is_set():
                        return
                    if event.get("type") in ("ADDED", "MODIFIED", "DELETED") and not self._is_own_event(event):
                        self._trigger.set()
                    elif event.get("type") == "ERROR":
                        break  # e.g. 410 Gone: list again
            except ApiError as exc:
                delay = self._backoff(attempt)
                attempt += 1
                log.debug("slice watch interrupted", error=str(exc), retry_in=round(delay, 2))
                self._stop.wait(delay)


def _keep_taint_times(current: JsonObject, body: JsonObject) -> None:
    """Carry the server-set `timeAdded` of unchanged taints over, so an update does not reset them."""
    old = {
        d["name"]: {(t.get("key"), t.get("value"), t.get("effect")): t.get("timeAdded") for t in d.get("taints") or []}
        for d in (current.get("spec") or {}).get("devices") or []
    }
    for device in (body.get("spec") or {}).get("devices") or []:
        times = old.get(device["name"], {})
        for taint in device.get("taints") or []:
            added = times.get((taint.get("key"), taint.get("value"), taint.get("effect")))
            if added and "timeAdded" not in taint:
                taint["timeAdded"] = added


def wait_until(predicate: Callable[[], bool], timeout: float, interval: float = 0.02) -> bool:
    """Poll `predicate` until true or timeout (for callers that must not sleep blindly)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(interval)
    return predicate()
