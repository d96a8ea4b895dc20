"""Kubernetes Events (core/v1), deduplicated and rate-limited like client-go's event recorder.

The same (object, reason, message) again is not a new Event: its `count` and `lastTimestamp` go up. Each such
series is written at most once per `interval` (one minute): repeats in between are counted locally and sent with
the next write, or by the sender thread once the interval has passed. Writes happen in a background thread, so a
slow or unreachable API server never delays the caller (a kubelet call, the health loop); failures are logged and
dropped — Events are best effort.
"""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Callable
from dataclasses import KW_ONLY, dataclass, field

import structlog

from dra_driver.k8s.client import ApiError, JsonObject, KubeRest
from dra_driver.k8s.names import DNS_SUBDOMAIN_MAX

log = structlog.get_logger(__name__)

EVENT_INTERVAL_S = 60.0
# The timestamp suffix makes the name unique; the object's name is cut so that the whole stays an object name (a
# ResourceClaim of 253 characters would otherwise make a 270-character Event name, which the API server refuses).
_EVENT_PREFIX_MAX = DNS_SUBDOMAIN_MAX - 1 - 16
MAX_SERIES = 4096  # like client-go's LRU cache of event series
NORMAL, WARNING = "Normal", "Warning"


@dataclass(frozen=True)
class InvolvedObject:
    """The object an Event is about (its `involvedObject`): a Node, a ResourceClaim, a Pod."""

    api_version: str
    kind: str
    name: str
    namespace: str = ""  # empty for cluster-scoped objects (a Node)
    uid: str = ""

    def as_json(self) -> JsonObject:
        out: JsonObject = {"apiVersion": self.api_version, "kind": self.kind, "name": self.name}
        if self.namespace:
            out["namespace"] = self.namespace
        if self.uid:
            out["uid"] = self.uid
        return out


@dataclass
class _Series:
    """One deduplicated Event: the same object, type, reason and message, counted until its next write."""

    namespace: str
    name: str
    involved: InvolvedObject
    type: str
    reason: str
    message: str
    first: float
    last: float
    count: int = 1
    sent_count: int = 0  # 0: not created yet
    last_write: float = float("-inf")
    queued: bool = False


def event_name(involved_name: str, now_ns: int | None = None) -> str:
    """`<object name>.<nanoseconds, hex>` as client-go names Events, the object name cut where the whole would pass
    253 characters (and the cut never leaves a '.' or '-' before the suffix, which a name may not have there)."""
    prefix = involved_name[:_EVENT_PREFIX_MAX].rstrip(".-") or "event"
    return f"{prefix}.{time.time_ns() if now_ns is None else now_ns:x}"


def _stamp(t: float) -> str:
    # Imported here: the first Event is written after the plugin's start, and nothing before its kubelet sockets
    # needs the module (docs/perf-findings.md "Start-up").
    from datetime import UTC, datetime

    return datetime.fromtimestamp(t, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


@dataclass(eq=False, repr=False)
class EventRecorder:
    """Events of one `component` on one `host` (an Event's `source` and reporting instance)."""

    rest: KubeRest
    _: KW_ONLY
    component: str
    host: str
    clock: Callable[[], float] = time.time
    interval: float = EVENT_INTERVAL_S
    _lock: threading.Lock = field(default_factory=threading.Lock, init=False)
    _series: dict[tuple[str, str, str, str, str], _Series] = field(default_factory=dict, init=False)
    _queue: queue.Queue[_Series | None] = field(default_factory=queue.Queue, init=False)
    _stopped: threading.Event = field(default_factory=threading.Event, init=False)
    _thread: threading.Thread = field(init=False)

    def __post_init__(self) -> None:
        self._thread = threading.Thread(target=self._run, name="events", daemon=True)
        self._thread.start()

    def record(self, involved: InvolvedObject, *, type: str, reason: str, message: str, namespace: str = "") -> None:
        """Note one occurrence. `namespace`: where the Event lives (default: the object's; "default" for a Node)."""
        ns = namespace or involved.namespace or "default"
        key = (ns, involved.uid or f"{involved.kind}/{involved.name}", type, reason, message)
        now = self.clock()
        with self._lock:
            series = self._series.get(key)
            if series is None:
                if len(self._series) >= MAX_SERIES:
                    oldest = min(self._series, key=lambda k: self._series[k].last)
                    del self._series[oldest]
                name = event_name(involved.name)
                series = self._series[key] = _Series(ns, name, involved, type, reason, message[:1024], now, now)
            else:
                series.count += 1
                series.last = now
            if now - series.last_write >= self.interval and not series.queued:
                series.queued = True
                self._queue.put(series)

    def flush(self, timeout: float = 10.0) -> bool:
        """Send what is due now and wait until the sender has written it (tests; shutdown)."""
        self._sweep()
        done = threading.Event()

        def wait() -> None:
            self._queue.join()
            done.set()

        threading.Thread(target=wait, daemon=True).start()
        return done.wait(timeout)

    def close(self) -> None:
        self.flush(timeout=5.0)
        self._stopped.set()
        self._queue.put(None)
        self._thread.join(timeout=5.0)

    def _sweep(self) -> None:
        """Queue series with occurrences not written yet whose interval has passed."""
        now = self.clock()
        with self._lock:
            for series in self._series.values():
                if series.count > series.sent_count and not series.queued and now - series.last_write >= self.interval:
                    series.queued = True
                    self._queue.put(series)

    def _run(self) -> None:
        while not self._stopped.is_set():
            try:
                series = self._queue.get(timeout=min(self.interval, 5.0))
            except queue.Empty:
                self._sweep()
                continue
            try:
                if series is not None:
                    self._write(series)
            finally:
                self._queue.task_done()

    def _write(self, series: _Series) -> None:
        with self._lock:
            series.queued = False
            series.last_write = self.clock()
            count, last, created = series.count, series.last, series.sent_count > 0
            series.sent_count = count
        ns = series.namespace
        try:
            if created:
                try:
                    self.rest.request(
                        "PATCH",
                        f"/api/v1/namespaces/{ns}/events/{series.name}",
                        body={"count": count, "lastTimestamp": _stamp(last)},
                        content_type="application/merge-patch+json",
                    )
                    return
                except ApiError as exc:
                    if not exc.not_found:  # expired (events live an hour): write a new one
                        raise
                    series.name = event_name(series.involved.name)
            self.rest.request("POST", f"/api/v1/namespaces/{ns}/events", body=self._event(series, count, last))
        except ApiError as exc:
            log.warning("recording a Kubernetes Event failed", reason=series.reason, error=str(exc))

    def _event(self, series: _Series, count: int, last: float) -> JsonObject:
        return {
            "apiVersion": "v1",
            "kind": "Event",
            "metadata": {"name": series.name, "namespace": series.namespace},
            "involvedObject": series.involved.as_json(),
            "type": series.type,
            "reason": series.reason,
            "message": series.message,
            "count": count,
            "firstTimestamp": _stamp(series.first),
            "lastTimestamp": _stamp(last),
            "source": {"component": self.component, "host": self.host},
            "reportingComponent": self.component,
            "reportingInstance": f"{self.component}-{self.host}",
        }
