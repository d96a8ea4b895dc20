"""Test hooks: a log of served requests and injectable faults.

Both are shared between the test thread and the server's event loop, so they take a lock.
`resource` is written as in RBAC: `resourceclaims` is the main resource only, and
`resourceclaims/status` its status subresource.
"""

from __future__ import annotations

import threading
from collections import Counter
from dataclasses import dataclass
from typing import Final

VERBS: Final = ("get", "list", "watch", "create", "update", "patch", "delete", "deletecollection")
TIMEOUT: Final = "timeout"


@dataclass(frozen=True)
class RequestRecord:
    verb: str
    group: str
    version: str
    resource: str  # plural, e.g. "resourceslices"
    subresource: str  # "" or e.g. "status"
    namespace: str
    name: str
    code: int
    dry_run: bool = False  # `?dryRun=All`: validated and admitted, nothing stored (the plugin's feature probes)

    @property
    def full_resource(self) -> str:
        return f"{self.resource}/{self.subresource}" if self.subresource else self.resource


def _split(resource: str | None) -> tuple[str | None, str]:
    if resource is None:
        return None, ""
    plural, _, sub = resource.partition("/")
    return plural, sub


def _check_verb(verb: str | None) -> None:
    if verb is not None and verb not in VERBS:
        raise ValueError(f"unknown verb {verb!r}: use one of {', '.join(VERBS)}")


def _matches(rec: RequestRecord, verb: str | None, resource: str | None, namespace: str | None,
             name: str | None, group: str | None) -> bool:
    plural, sub = _split(resource)
    return (
        (verb is None or rec.verb == verb)
        and (plural is None or (rec.resource == plural and rec.subresource == sub))
        and (namespace is None or rec.namespace == namespace)
        and (name is None or rec.name == name)
        and (group is None or rec.group == group)
    )


class RequestLog:
    """Every resource request the server answered (faulted ones included), in arrival order."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._records: list[RequestRecord] = []
        # Kept as requests arrive, so that a bench polling `/debug/requests` of a busy server (thousands of
        # clients) does not rescan the whole log each time.
        self._tally: Counter[tuple[str, str, int]] = Counter()

    def record(self, rec: RequestRecord) -> None:
        with self._lock:
            self._records.append(rec)
            self._tally[(rec.verb, rec.full_resource, rec.code)] += 1

    def count(self, verb: str | None = None, resource: str | None = None, *, namespace: str | None = None,
              name: str | None = None, group: str | None = None) -> int:
        _check_verb(verb)
        with self._lock:
            return sum(1 for r in self._records if _matches(r, verb, resource, namespace, name, group))

    def records(self) -> list[RequestRecord]:
        with self._lock:
            return list(self._records)

    def summary(self) -> dict[tuple[str, str], int]:
        """(verb, resource[/subresource]) -> count; handy in assertion messages."""
        with self._lock:
            return dict(Counter((r.verb, r.full_resource) for r in self._records))

    def tally(self) -> dict[tuple[str, str, int], int]:
        """(verb, resource[/subresource], code) -> count since the start (or the last reset)."""
        with self._lock:
            return dict(self._tally)

    def reset(self) -> None:
        with self._lock:
            self._records.clear()
            self._tally.clear()


@dataclass
class FaultRule:
    verb: str | None
    resource: str | None
    status: int | str
    remaining: int
    namespace: str | None = None
    name: str | None = None
    message: str | None = None


@dataclass(frozen=True)
class Fault:
    """What the server does to one request: answer `status`, or hang (`status == "timeout"`)."""

    status: int | str
    message: str | None
    hang_seconds: float


class Faults:
    """`inject(verb=..., resource=..., status=500|409|...|"timeout", count=N)`: the next N matching
    requests fail before touching any state. A "timeout" fault holds the request open until the client
    gives up or `max_hang_seconds` pass (then 504), so a hang never outlives a test."""

    def __init__(self, max_hang_seconds: float = 30.0) -> None:
        self._lock = threading.Lock()
        self._rules: list[FaultRule] = []
        self.max_hang_seconds = max_hang_seconds

    def inject(self, verb: str | None = None, resource: str | None = None, status: int | str = 500,
               count: int = 1, *, namespace: str | None = None, name: str | None = None,
               message: str | None = None) -> FaultRule:
        _check_verb(verb)
        if isinstance(status, str) and status != TIMEOUT:
            raise ValueError(f'status must be an HTTP code (e.g. 500, 409, 429) or "{TIMEOUT}", not {status!r}')
        if isinstance(status, int) and not 400 <= status <= 599:
            raise ValueError(f"status {status} is not an HTTP error code (400-599)")
        if count < 1:
            raise ValueError("count must be at least 1")
        rule = FaultRule(verb, resource, status, count, namespace, name, message)
        with self._lock:
            self._rules.append(rule)
        return rule

    def take(self, verb: str, resource: str, subresource: str, namespace: str, name: str, group: str) -> Fault | None:
        """Consume one matching rule for a request, if any (called by the server)."""
        rec = RequestRecord(verb, group, "", resource, subresource, namespace, name, 0)
        with self._lock:
            for rule in self._rules:
                if rule.remaining > 0 and _matches(rec, rule.verb, rule.resource, rule.namespace, rule.name, None):
                    rule.remaining -= 1
                    if rule.remaining == 0:
                        self._rules.remove(rule)
                    return Fault(rule.status, rule.message, self.max_hang_seconds)
        return None

    def pending(self) -> int:
        with self._lock:
            return sum(r.remaining for r in self._rules)

    def clear(self) -> None:
        with self._lock:
            self._rules.clear()
