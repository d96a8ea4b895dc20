"""The ResourceSlice publisher: the only writer of this node's ResourceSlices.

How the scheduler reads a pool (k8s.io/dynamic-resource-allocation/structured, `GatherPools`): per (driver, pool
name) only the slices of the HIGHEST `pool.generation` count, older ones are ignored; if fewer slices than
`resourceSliceCount` carry that generation the pool is "incomplete" (an `allocationMode: All` request fails on it;
ExactCount requests see only the devices of the slices that are there). So a slice written at a new generation
hides every slice of the old one at once, and a half-written new generation hides devices.

A reconcile lists the pool (field selectors `spec.nodeName`, `spec.driver`; pool name = node name), plans with
`plan_publish` (pure) and writes only the difference:
- nothing differs → zero writes;
- the content we want is what this generation already holds (a slice deleted or edited by someone, a pass that
  stopped half-way, a plugin restarted mid-pass) → repaired / completed at the SAME generation;
- the content changed → a NEW generation, written beside the old one: first every slice of the new generation
  (new objects, `generateName`), then the old generation's slices are deleted. If the new generation cannot be
  completed, the slices written at it are deleted again, so the old, complete generation is the newest again
  (a rollback); the next pass reuses the same generation number for the same content.
The generation moves only when the content moves: never because a request or a pass failed.

Slices are found by their fields, never by name: they are created with `generateName` and any slice of this
driver, node and pool is adopted (also those of older plugin versions, which used fixed names). So nobody can
block publishing by taking a name first.

Every request is retried on its own (jittered exponential backoff, bounded attempts) on connection errors,
429, 5xx and 409; a 409 on an update or delete re-reads the object first. A create that failed ambiguously (the
server may have stored it: no response, 500, 502, 504) looks for the stored slice before sending it again, so a
lost response never duplicates a slice. A pass that still fails is retried whole with a longer backoff; until a
request succeeds again, each pass sends one probe request without retries. A watch
on the same selectors wakes the loop on foreign changes (its own writes are recognised and ignored, also when
their event arrives before the write's answer).

Requests of a node at steady state: one LIST per resync (`resync_seconds`, 5 min) and one WATCH per watch
timeout (`watch_timeout_seconds`, 5 min, jittered up to twice that); nothing else. The watch resumes from the
newest resourceVersion it saw (bookmarks keep it fresh) instead of listing again, and starts from the LIST of
a pass instead of its own: a first publish is one LIST, one GET of the Node, the creates and one WATCH
(bench/publish_fleet_bench.py counts them).
"""

from __future__ import annotations

import json
import random
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

import structlog

from dra_driver.backoff import Backoff, Retries
from dra_driver.k8s.client import ApiError, JsonObject, KubeRest, WatchStream
from dra_driver.observability.metrics import PluginMetrics
from dra_driver.slices.builder import SliceSettings, name_prefix

log = structlog.get_logger(__name__)

SLICES_PATH = "/apis/resource.k8s.io/v1/resourceslices"
# The desired slices (pure builder), built for the generation asked for; the publisher asks for 1 and sets the
# generation its plan chooses. Names are ignored: slices are created with generateName.
DesiredSlices = Callable[[int], list[JsonObject]]

# Worth sending the same request again: not reached / timed out (0), conflict (after a re-read), throttled,
# server-side failures. Every other 4xx (invalid, forbidden by RBAC or the admission policy) is final.
RETRIABLE = frozenset({0, 409, 429, 500, 502, 503, 504})
# A create that failed with one of these may nevertheless have been stored (the answer was lost).
AMBIGUOUS = frozenset({0, 500, 502, 504})

T = TypeVar("T")


class RetriesExhausted(ApiError):
    """A request that failed on every attempt. Raised through an enclosing retry loop at once: a re-read inside
    an update that gave up must not be retried again by the update's own loop (attempts would multiply)."""


@dataclass(frozen=True)
class RequestRetries:
    """Retries of ONE request inside a pass: quick first retries for blips, bounded so that an outage ends the
    pass (which then backs off as a whole) instead of holding it forever. Defaults: 6 attempts, waits of
    25, 50, 100, 200, 400 ms, each jittered down to half: a request gives up after 0.4 to 0.8 s of failures."""

    attempts: int = 6
    base_seconds: float = 0.025
    cap_seconds: float = 1.0

    def delay(self, retry: int, rng: random.Random) -> float:
        return Backoff(self.base_seconds, self.cap_seconds, jitter=0.5).delay(retry, rng)


@dataclass(frozen=True)
class ReconcileResult:
    generation: int
    created: int = 0
    updated: int = 0
    deleted: int = 0

    @property
    def writes(self) -> int:
        return self.created + self.updated + self.deleted


@dataclass(frozen=True)
class Attempt:
    """The generation this publisher last wrote (or found) its content at, and that content."""

    generation: int
    keys: frozenset[str]


@dataclass(frozen=True)
class Write:
    body: JsonObject  # the slice as it must be stored (target generation, no name)
    reuse: JsonObject | None  # an existing slice to overwrite in place; None: create a new one


@dataclass(frozen=True)
class Plan:
    generation: int
    # True when `generation` is above every existing slice: the old generation stays untouched until the new one
    # is complete, and a failure rolls the new one back.
    new_generation: bool
    writes: tuple[Write, ...]
    deletes: tuple[JsonObject, ...]
    keys: frozenset[str]


# --- pure planning -------------------------------------------------------------------------------------


def generation_of(obj: JsonObject) -> int:
    return int(((obj.get("spec") or {}).get("pool") or {}).get("generation", 0))


def content_key(obj: JsonObject) -> str:
    """What we own in a slice, without its name and generation: spec (minus the server-set taint times),
    labels, annotations and owner references. Two slices with equal keys are interchangeable. (Copies only what it
    strips: this runs for every slice on every pass.)"""
    spec = dict(obj.get("spec") or {})
    pool = dict(spec.get("pool") or {})
    pool.pop("generation", None)
    spec["pool"] = pool
    devices = spec.get("devices") or []
    if any(d.get("taints") for d in devices):
        spec["devices"] = [
            {**d, "taints": [{k: v for k, v in t.items() if k != "timeAdded"} for t in d["taints"]]}
            if d.get("taints")
            else d
            for d in devices
        ]
    meta = obj.get("metadata") or {}
    owned = {"spec": spec, "labels": meta.get("labels") or {}, "annotations": meta.get("annotations") or {},
             "owners": meta.get("ownerReferences") or []}
    return json.dumps(owned, sort_keys=True, separators=(",", ":"))


def _identity(obj: JsonObject) -> frozenset[str]:
    """Device and counter-set names: which existing slice is the closest one to overwrite."""
    spec = obj.get("spec") or {}
    names = {f"d/{d.get('name')}" for d in spec.get("devices") or []}
    return frozenset(names | {f"c/{c.get('name')}" for c in spec.get("sharedCounters") or []})


def _at_generation(obj: JsonObject, generation: int) -> JsonObject:
    """A copy to write: own metadata and pool, no name (the API server generates it); devices are shared."""
    spec = dict(obj["spec"])
    spec["pool"] = {**spec["pool"], "generation": generation}
    meta = {k: v for k, v in (obj.get("metadata") or {}).items() if k != "name"}
    return {**obj, "metadata": meta, "spec": spec}


def target_generation(
    existing: Sequence[JsonObject],
    keys: frozenset[str],
    last: Attempt | None,
    existing_keys: dict[int, str] | None = None,
) -> int:
    """The generation to publish `keys` at. It moves only when the content moves.

    Desired keys are unique: device and counter-set names are unique in a pool, and an empty pool is one slice.
    `existing_keys` (id(slice) -> content_key) saves computing them again.
    """
    if not existing:  # nothing there (first start, or wiped): same content → same generation as before
        if last is None:
            return 1
        return last.generation if last.keys == keys else last.generation + 1
    newest = max(generation_of(s) for s in existing)
    known = existing_keys or {}
    current = [known.get(id(s)) or content_key(s) for s in existing if generation_of(s) == newest]
    fits = len(set(current)) == len(current) and set(current) <= keys
    if last is not None and last.generation == newest:
        # We wrote this generation: same content → repair drift in place; other content → next generation.
        return newest if last.keys == keys else newest + 1
    if fits:
        # Every slice of the newest generation is one we want: a pass (or a plugin) stopped half-way. Complete it.
        return newest
    if last is not None and last.generation > newest and last.keys == keys:
        return last.generation  # our earlier attempt at this content was rolled back: same number again
    return max(newest, last.generation if last is not None else 0) + 1


def plan_publish(existing: Sequence[JsonObject], desired: Sequence[JsonObject], last: Attempt | None) -> Plan:
    """Which writes turn `existing` (this pool's slices in the API) into `desired` (any generation; names are
    ignored), and in which generation."""
    desired_keys = [content_key(d) for d in desired]
    keys = frozenset(desired_keys)
    existing_keys = {id(s): content_key(s) for s in existing}
    generation = target_generation(existing, keys, last, existing_keys)
    newest = max((generation_of(s) for s in existing), default=0)
    targets = [_at_generation(d, generation) for d in desired]
    matched: set[int] = set()  # id() of existing slices that already hold a target
    todo: list[JsonObject] = []
    if existing and generation == newest:
        for body, key in zip(targets, desired_keys, strict=True):
            hit = next(
                (
                    s
                    for s in existing
                    if id(s) not in matched and generation_of(s) == generation and existing_keys[id(s)] == key
                ),
                None,
            )
            if hit is None:
                todo.append(body)
            else:
                matched.add(id(hit))
        # Anything not matched may be overwritten: a foreign edit (an update puts it right in one atomic
        # write), or a slice of an older generation (ignored by the scheduler anyway).
        free = [s for s in existing if id(s) not in matched]
    else:
        todo = targets
        # The newest generation must stay intact until the new one is complete (rollback); only slices that
        # are already obsolete may be reused.
        free = [s for s in existing if generation_of(s) < newest]
    # Overwrite the closest free slice (most device / counter-set names in common) first, then any free one.
    reuse: dict[int, JsonObject] = {}  # index in todo -> existing slice
    reused: set[int] = set()
    for closest_only in (True, False):
        for i, body in enumerate(todo):
            want = _identity(body)
            scored = [(len(want & _identity(s)), n, s) for n, s in enumerate(free) if id(s) not in reused]
            scored = [t for t in scored if t[0] > 0 or not closest_only]
            if i not in reuse and scored:
                best = max(scored, key=lambda t: (t[0], -t[1]))[2]
                reuse[i] = best
                reused.add(id(best))
    writes = [Write(body, reuse.get(i)) for i, body in enumerate(todo)]
    deletes = tuple(s for s in existing if id(s) not in matched and id(s) not in reused)
    return Plan(generation, generation > newest or not existing, tuple(writes), deletes, keys)


def taint_times(slices: Iterable[JsonObject]) -> dict[tuple[Any, ...], str]:
    """(device, key, value, effect) → the server-set `timeAdded`, from every existing slice: a taint keeps its
    time through updates and new generations (tolerationSeconds count from it)."""
    out: dict[tuple[Any, ...], str] = {}
    for obj in slices:
        for device in (obj.get("spec") or {}).get("devices") or []:
            for taint in device.get("taints") or []:
                if taint.get("timeAdded"):
                    out[(device.get("name"), taint.get("key"), taint.get("value"), taint.get("effect"))] = taint[
                        "timeAdded"
                    ]
    return out


def _keep_taint_times(times: dict[tuple[Any, ...], str], body: JsonObject) -> None:
    for device in (body.get("spec") or {}).get("devices") or []:
        for taint in device.get("taints") or []:
            added = times.get((device.get("name"), taint.get("key"), taint.get("value"), taint.get("effect")))
            if added and "timeAdded" not in taint:
                taint["timeAdded"] = added


# --- the publisher ---------------------------------------------------------------------------------------


def _owner_of(node: JsonObject) -> JsonObject:
    """The ownerReference to the Node: the slices go when the Node goes."""
    return {"apiVersion": "v1", "kind": "Node", "name": node["metadata"]["name"], "uid": node["metadata"]["uid"],
            "controller": True}  # fmt: skip


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
        watch_timeout_seconds: float = 300.0,
        max_backoff: float = 5.0,
        retry: RequestRetries | None = None,
        metrics: PluginMetrics | None = None,
        node: JsonObject | None = None,
    ) -> None:
        """`node`: this node's Node object if the caller has just read it (the plugin does at start), so that the
        first publish needs no GET of its own for the slices' owner reference."""
        self._rest = rest
        self._metrics = metrics
        self.driver_name = driver_name
        self.node_name = node_name
        self._desired = desired
        self._rng = rng or random.Random()  # noqa: S311 - jitter, not crypto
        self._resync = resync_seconds
        self._watch_timeout = watch_timeout_seconds
        self._max_backoff = max_backoff
        self._retry = retry or RequestRetries()
        self._unavailable = False  # the last pass gave up on a retriable error: probe before retrying again
        self._prefix = name_prefix(SliceSettings(driver_name=driver_name, node_name=node_name))
        self._last: Attempt | None = None
        self._owner: JsonObject | None = _owner_of(node) if node is not None else None
        self._trigger = threading.Event()
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []
        self._stream: WatchStream | None = None
        self._own_versions: list[str] = []
        self._own_deletes: list[str] = []  # bounded: a DELETED event missed while the watch was down stays
        self._own_lock = threading.Lock()
        # Watch events that arrived during a pass and are not (yet) known as ours: a write's event can come before
        # the loop has read the write's answer. Judged when the pass ends, so that no own write triggers a pass.
        self._in_pass = False
        self._unsettled: list[JsonObject] = []
        # The newest LIST of this pool (any pass's): where the watch starts without listing again itself.
        self._listed = threading.Condition()
        self._list_count = 0
        self._list_version = ""
        self.last_result: ReconcileResult | None = None
        self.reconciled = threading.Condition()
        self.reconcile_count = 0
        self.retries = 0  # requests sent again inside a pass
        self.rollbacks = 0  # new generations withdrawn because a pass could not complete them
        self.failed_passes = 0

    # --- requests, each retried on its own ------------------------------------------------------------

    def _selector(self) -> dict[str, str]:
        return {"fieldSelector": f"spec.nodeName={self.node_name},spec.driver={self.driver_name}"}

    def list_slices(self) -> tuple[list[JsonObject], str]:
        """This pool's slices (one request, no retry) and the list's resourceVersion."""
        listing = self._rest.request("GET", SLICES_PATH, query=self._selector())
        items = [
            s for s in listing.get("items") or [] if (s.get("spec") or {}).get("pool", {}).get("name") == self.node_name
        ]
        version = str((listing.get("metadata") or {}).get("resourceVersion", ""))
        with self._listed:
            self._list_count += 1
            self._list_version = version
            self._listed.notify_all()
        return items, version

    def _retrying(self, what: str, call: Callable[[], T]) -> T:
        retry = 0
        while True:
            try:
                result = call()
                self._unavailable = False
                return result
            except RetriesExhausted:
                raise
            except ApiError as exc:
                if exc.status not in RETRIABLE:
                    raise
                # While the API looks down (the last pass gave up on it), a request is a single probe: the pass
                # ends at once and backs off, instead of every pass sending a burst of retries into an outage.
                if self._unavailable or retry + 1 >= self._retry.attempts:
                    raise RetriesExhausted(exc.status, exc.reason, exc.body) from exc
                delay = self._retry.delay(retry, self._rng)
                retry += 1
                self.retries += 1
                log.debug("resource slice request failed; retrying", request=what, error=str(exc), retry=retry)
                if self._stop.wait(delay):
                    raise

    def _list(self) -> list[JsonObject]:
        return self._retrying("list", lambda: self.list_slices()[0])

    def _reread(self, name: str) -> JsonObject | None:
        return self._retrying("get", lambda: self._rest.get(f"{SLICES_PATH}/{name}"))

    def _owner_references(self) -> list[JsonObject]:
        if self._owner is None:
            node = self._retrying("get node", lambda: self._rest.get(f"/api/v1/nodes/{self.node_name}"))
            if node is None:
                return []  # published without an owner; added (a content change) once the Node exists
            self._owner = _owner_of(node)
        return [self._owner]

    def _create(self, body: JsonObject, taken: set[str]) -> JsonObject:
        """POST with generateName. After an ambiguous failure, first look whether the slice was stored after all
        (same content and generation, a name not already accounted for in `taken`)."""
        obj = {**body, "metadata": {**body["metadata"], "generateName": self._prefix}}
        key, generation = content_key(obj), generation_of(obj)
        maybe_stored = False

        def attempt() -> JsonObject:
            nonlocal maybe_stored
            if maybe_stored:  # (its own retries: a failed look must not use up the create's attempts)
                for s in self._list():
                    name = s["metadata"]["name"]
                    if name not in taken and generation_of(s) == generation and content_key(s) == key:
                        return s
            try:
                return self._rest.request("POST", SLICES_PATH, body=obj)
            except ApiError as exc:
                maybe_stored = maybe_stored or exc.status in AMBIGUOUS
                raise

        written = self._retrying("create", attempt)
        taken.add(written["metadata"]["name"])
        self._remember(written)
        return written

    def _update(self, current: JsonObject, body: JsonObject) -> JsonObject | None:
        """PUT over `current`; a 409 re-reads it (done if it already holds `body`). None: it is gone."""
        name = current["metadata"]["name"]
        obj = {**body, "metadata": {**body["metadata"], "name": name}}
        obj["metadata"]["resourceVersion"] = current["metadata"]["resourceVersion"]
        key, generation = content_key(obj), generation_of(obj)

        def attempt() -> JsonObject | None:
            try:
                return self._rest.request("PUT", f"{SLICES_PATH}/{name}", body=obj)
            except ApiError as exc:
                if exc.not_found:
                    return None
                if exc.status == 409:
                    fresh = self._reread(name)
                    if fresh is None:
                        return None
                    if generation_of(fresh) == generation and content_key(fresh) == key:
                        return fresh  # an earlier attempt whose answer was lost did it
                    obj["metadata"]["resourceVersion"] = fresh["metadata"]["resourceVersion"]
                raise

        written = self._retrying("update", attempt)
        if written is not None:
            self._remember(written)
        return written

    def _delete(self, current: JsonObject) -> None:
        """DELETE with a UID precondition (never someone else's object of the same name); gone is success."""
        name, uid = current["metadata"]["name"], current["metadata"].get("uid")
        with self._own_lock:
            self._own_deletes.append(name)
            del self._own_deletes[:-256]
        options: JsonObject = {"apiVersion": "v1", "kind": "DeleteOptions"}
        if uid:
            options["preconditions"] = {"uid": uid}

        def attempt() -> None:
            try:
                self._rest.request("DELETE", f"{SLICES_PATH}/{name}", body=options)
            except ApiError as exc:
                if exc.not_found:
                    return
                if exc.status == 409:
                    fresh = self._reread(name)
                    if fresh is None or fresh["metadata"].get("uid") != uid:
                        return  # ours is gone (a new object took the name)
                raise

        self._retrying("delete", attempt)

    # --- one reconcile -----------------------------------------------------------------------------------

    def _desired_now(self) -> list[JsonObject]:
        owners = self._owner_references()
        slices = self._desired(1)  # the generation is set by the plan
        for obj in slices:
            if owners:
                obj["metadata"]["ownerReferences"] = owners
        return slices

    def reconcile(self) -> ReconcileResult:
        """One pass. Raises ApiError when it could not finish; the API then holds the old generation (the new one
        rolled back), or the complete new one with leftovers of the old (ignored by the scheduler), or, when not
        even the rollback reached the API, a partial new generation that the next pass completes at that number."""
        with self._own_lock:
            self._in_pass = True
        try:
            return self._reconcile()
        finally:
            self._settle_events()

    def _reconcile(self) -> ReconcileResult:
        existing = self._list()
        if not existing and self._last is not None:
            self._owner = None  # the pool is gone (node deleted and re-created?): owner UID read afresh
        plan = plan_publish(existing, self._desired_now(), self._last)
        self._last = Attempt(plan.generation, plan.keys)
        times = taint_times(existing)
        taken = {s["metadata"]["name"] for s in existing}
        created = updated = 0
        touched = False  # a slice of the target generation may be in the API
        try:
            for write in plan.writes:
                _keep_taint_times(times, write.body)
                touched = True
                if write.reuse is not None and self._update(write.reuse, write.body) is not None:
                    updated += 1
                else:
                    self._create(write.body, taken)
                    created += 1
        except ApiError as exc:
            if plan.new_generation and touched:
                self._roll_back(plan.generation, exc)
            raise
        deleted = 0
        for obj in plan.deletes:  # the new generation is complete: these are obsolete (or foreign)
            self._delete(obj)
            deleted += 1
        result = ReconcileResult(plan.generation, created, updated, deleted)
        if self._metrics is not None:
            self._metrics.published(len(plan.keys), time.time())
        if result.writes:
            log.info(
                "published resource slices",
                node=self.node_name,
                generation=plan.generation,
                slices=len(plan.keys),
                created=created,
                updated=updated,
                deleted=deleted,
            )
        return self._done(result)

    def _roll_back(self, generation: int, cause: ApiError) -> None:
        """Withdraw a new generation the pass could not complete, so that the last complete generation is the
        newest again. Found by listing: a slice whose create answer was lost is withdrawn too."""
        withdrawn = 0
        try:
            for obj in self._list():
                if generation_of(obj) == generation:
                    self._delete(obj)
                    withdrawn += 1
        except ApiError as exc:
            log.warning(
                "could not withdraw an incomplete generation; the next pass completes it",
                generation=generation,
                error=str(exc),
                cause=str(cause),
            )
            return
        if withdrawn:
            self.rollbacks += 1
            log.warning(
                "withdrew an incomplete generation; retrying", generation=generation, slices=withdrawn, cause=str(cause)
            )

    def _remember(self, written: JsonObject) -> None:
        """Our own writes come back as watch events; they need no reconcile."""
        version = str((written.get("metadata") or {}).get("resourceVersion", ""))
        with self._own_lock:
            self._own_versions.append(version)
            del self._own_versions[:-256]

    def _is_own_event(self, event: JsonObject) -> bool:
        """(Under `_own_lock`.) An event of one of our writes; a DELETED one is forgotten once seen."""
        meta = (event.get("object") or {}).get("metadata") or {}
        if event.get("type") == "DELETED" and meta.get("name") in self._own_deletes:
            self._own_deletes.remove(meta["name"])
            return True
        return str(meta.get("resourceVersion", "")) in self._own_versions

    def _on_event(self, event: JsonObject) -> None:
        """A foreign change wakes the loop. During a pass an unknown event waits for the pass's end: it may be one
        of the pass's own writes whose answer the loop has not read yet (with many nodes in one API server the
        event often comes first), and waking the loop for it would cost a needless pass."""
        with self._own_lock:
            if self._is_own_event(event):
                return
            if self._in_pass:
                self._unsettled.append(event)
                return
        self._trigger.set()

    def _settle_events(self) -> None:
        with self._own_lock:
            self._in_pass = False
            unsettled, self._unsettled = self._unsettled, []
            foreign = [e for e in unsettled if not self._is_own_event(e)]
        if foreign:
            self._trigger.set()

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
        with self._listed:
            self._listed.notify_all()
        if self._stream is not None:
            self._stream.close()
        for thread in self._threads:
            thread.join(timeout=5.0)

    def wait_for_reconciles(self, count: int, timeout: float) -> bool:
        with self.reconciled:
            return self.reconciled.wait_for(lambda: self.reconcile_count >= count, timeout=timeout)

    def _backoff(self) -> Retries:
        """Between failed passes: 0.2 s doubling to `max_backoff` (5 s), each jittered down to half. It bounds
        how long after an outage the pool is published again, and (with one probe request per pass while the
        API looks down) what a node sends into an outage: about one request per 2.5 to 5 s."""
        return Retries(Backoff(0.2, self._max_backoff, jitter=0.5), self._rng)

    def _run(self) -> None:
        retries = self._backoff()
        while not self._stop.is_set():
            self._trigger.clear()
            try:
                self.reconcile()
                retries.reset()
                self._trigger.wait(self._resync)
            except ApiError as exc:
                self._unavailable = exc.status in RETRIABLE
                self._failed()
                delay = retries.next()
                log.warning("publishing resource slices failed; retrying", error=str(exc), retry_in=round(delay, 2))
                self._stop.wait(delay)
            except Exception:
                self._failed()
                delay = retries.next()
                log.exception("publishing resource slices failed unexpectedly; retrying")
                self._stop.wait(delay)

    def _failed(self) -> None:
        self.failed_passes += 1
        if self._metrics is not None:
            self._metrics.publish_failed()

    def _listed_after(self, count: int) -> str | None:
        """The resourceVersion of a LIST of this pool newer than the `count`-th one; None when stopping."""
        with self._listed:
            self._listed.wait_for(lambda: self._list_count > count or self._stop.is_set())
            return None if self._stop.is_set() else self._list_version

    def _watch(self) -> None:
        """Wakes the loop on foreign changes. It starts from the resourceVersion of a pass's LIST (the loop lists
        anyway: no LIST of its own) and, when a watch ends (timeout, connection lost), resumes from the newest
        version it saw (events and bookmarks: no LIST either). Only a resume point the server no longer has (410)
        starts it over: the loop runs a pass (changes may have been missed) and the watch starts from its LIST."""
        retries = self._backoff()
        version: str | None = None  # None: start from a LIST newer than `listed`
        listed = 0
        while not self._stop.is_set():
            try:
                if version is None:
                    version = self._listed_after(listed)
                    if version is None:
                        return
                query: dict[str, Any] = {**self._selector(), "allowWatchBookmarks": "true"}
                if version:
                    query["resourceVersion"] = version
                # Jittered (as client-go's reflectors do) so that the watches of a fleet do not end in step.
                timeout = max(1, round(self._watch_timeout * (1 + self._rng.random())))
                stream = self._rest.watch(SLICES_PATH, query=query, timeout_seconds=timeout)
                self._stream = stream
                if self._stop.is_set():
                    stream.close()
                for event in stream:
                    if self._stop.is_set():
                        return
                    if event.get("type") == "ERROR":  # e.g. 410 Gone: the resume point has expired
                        raise ApiError(int((event.get("object") or {}).get("code") or 410), "watch error event")
                    retries.reset()
                    seen = ((event.get("object") or {}).get("metadata") or {}).get("resourceVersion")
                    version = str(seen or version)
                    if event.get("type") in ("ADDED", "MODIFIED", "DELETED"):
                        self._on_event(event)
            except ApiError as exc:
                if exc.status == 410:
                    with self._listed:
                        version, listed = None, self._list_count
                    self.trigger()
                delay = retries.next()
                log.debug("slice watch interrupted", error=str(exc), retry_in=round(delay, 2))
                self._stop.wait(delay)
