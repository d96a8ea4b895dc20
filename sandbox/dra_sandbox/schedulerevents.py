"""kube-scheduler's Events: `FailedScheduling` through the events.k8s.io/v1 API with client-go's series semantics.

kube-scheduler records with the events.k8s.io recorder (k8s.io/client-go/tools/events): `Eventf(pod, nil, Warning,
"FailedScheduling", "Scheduling", message)` makes an Event named `<pod>.<unix nanoseconds in hex>` in the pod's
namespace with `eventTime`, `reportingController` = the profile's scheduler name (`default-scheduler`),
`reportingInstance` = `<controller>-<hostname>`, `action` `Scheduling`, `regarding` = the pod's reference (with its
resourceVersion), `note` = the message cut to 1024 bytes (`truncateMessage` in pkg/scheduler/schedule_one.go).

Aggregation (event_broadcaster.go `recordToSink`, `getKey`): events are keyed by type, action, reason,
reportingController, reportingInstance, regarding and related - not by the note. The first of a key is created; the
second turns into a series: the FIRST event is patched with `series: {count: 2, lastObservedTime}`; later ones only
count in the recorder's memory until its 30-minute heartbeat patches the series again (the heartbeat is not
imitated: the count in the API stays 2). Because `regarding` carries the pod's resourceVersion, a pod whose status
changed between two attempts starts a new event.

Read through the core API (the same objects, converted) such an event has `involvedObject`, `message`, empty
`source`, no `firstTimestamp`/`lastTimestamp`/`count`, and `reportingComponent`.
"""

from __future__ import annotations

import socket
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Final

from dra_driver.k8s.client import JsonObject, KubeRest

EVENTS_API: Final = "/apis/events.k8s.io/v1"
NOTE_LENGTH_LIMIT: Final = 1024  # k8s.io/api events validation NoteLengthLimit
DEFAULT_SCHEDULER: Final = "default-scheduler"
FAILED_SCHEDULING: Final = "FailedScheduling"
SCHEDULING_ACTION: Final = "Scheduling"


def truncate_message(message: str) -> str:
    """schedule_one.go truncateMessage: at most NoteLengthLimit bytes, cut ones ending in ` ...`."""
    data = message.encode()
    if len(data) <= NOTE_LENGTH_LIMIT:
        return message
    suffix = " ..."
    return data[:NOTE_LENGTH_LIMIT - len(suffix)].decode(errors="ignore") + suffix


def micro_time(when: datetime) -> str:
    """metav1.MicroTime's RFC 3339 form with microseconds."""
    return when.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def object_reference(obj: Mapping[str, Any], api_version: str, kind: str) -> JsonObject:
    """reference.GetReference: kind, namespace, name, uid, apiVersion, resourceVersion."""
    meta = obj.get("metadata") or {}
    ref: JsonObject = {"kind": kind, "namespace": meta.get("namespace", ""), "name": meta.get("name", ""),
                       "uid": meta.get("uid", ""), "apiVersion": api_version,
                       "resourceVersion": meta.get("resourceVersion", "")}
    return {k: v for k, v in ref.items() if v}


@dataclass(frozen=True)
class _Key:
    type: str
    action: str
    reason: str
    controller: str
    instance: str
    regarding: tuple[tuple[str, str], ...]


@dataclass
class _Recorded:
    namespace: str
    name: str
    count: int = 1


class EventRecorder:
    """One reporting controller's events.k8s.io recorder (not thread-safe: the scheduler's loop owns it)."""

    def __init__(self, rest: KubeRest, controller: str = DEFAULT_SCHEDULER, *,
                 clock: Callable[[], datetime] = lambda: datetime.now(UTC), hostname: str | None = None) -> None:
        self._rest = rest
        self._controller = controller
        self._instance = f"{controller}-{hostname or socket.gethostname()}"
        self._clock = clock
        self._recorded: dict[_Key, _Recorded] = {}
        self._last_nanos = 0

    def eventf(self, regarding: Mapping[str, Any], event_type: str, reason: str, action: str, note: str) -> None:
        """Record one occurrence about a pod (core v1 `regarding`): create, start a series, or count."""
        ref = object_reference(regarding, "v1", "Pod")
        key = _Key(event_type, action, reason, self._controller, self._instance, tuple(sorted(ref.items())))
        now = self._clock()
        known = self._recorded.get(key)
        if known is not None:
            known.count += 1
            if known.count == 2:
                self._rest.request(
                    "PATCH", f"{EVENTS_API}/namespaces/{known.namespace}/events/{known.name}",
                    body={"series": {"count": 2, "lastObservedTime": micro_time(now)}},
                    content_type="application/strategic-merge-patch+json")
            return
        namespace = str(ref.get("namespace") or "default")
        # Strictly increasing, so a clock standing still (the tests move it by hand) cannot repeat a name.
        self._last_nanos = max(int(now.timestamp() * 1e9), self._last_nanos + 1)
        name = f"{ref.get('name', '')}.{self._last_nanos:x}"
        self._rest.request("POST", f"{EVENTS_API}/namespaces/{namespace}/events", body={
            "apiVersion": "events.k8s.io/v1", "kind": "Event",
            "metadata": {"name": name, "namespace": namespace},
            "eventTime": micro_time(now), "reportingController": self._controller,
            "reportingInstance": self._instance, "action": action, "reason": reason, "regarding": ref,
            "note": truncate_message(note), "type": event_type,
        })
        self._recorded[key] = _Recorded(namespace, name)

    def retain(self, uids: set[str]) -> None:
        """Forget the series of pods not in `uids` (bound or gone; client-go's cache is a bounded LRU)."""
        for key in [k for k in self._recorded if dict(k.regarding).get("uid") not in uids]:
            del self._recorded[key]
