"""Random faults and outages for the sandbox API server: what the publisher benchmark and robustness tests need.

`Faults` (hooks.py) fails the next N matching requests. `ChaosFaults` keeps that and adds two modes:

- `fail_randomly(probability, statuses=(500, 409), verb=None, resource=None)`: each matching request fails with
  that probability, answering a status drawn from `statuses`. Draws come from one seeded generator, so the
  same request sequence gets the same faults;
- `outage(status=503)` / `end_outage()`: every resource request fails until ended; `outage(seconds=30)` also
  ends by itself (measured on `clock`, monotonic by default).

One-shot faults from `inject()` still come first. Like every fault, these fail before touching any state (a
real API server may store a write and still lose the answer; tests that need that wrap the client instead).

    srv = ApiServer(faults=ChaosFaults(seed=7))
    srv.faults.fail_randomly(0.2, resource="resourceslices")
"""

from __future__ import annotations

import random
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from .hooks import Fault, Faults, _check_verb


@dataclass(frozen=True)
class RandomRule:
    probability: float
    statuses: tuple[int, ...]
    verb: str | None
    resource: str | None  # "plural" or "plural/subresource", as in RBAC


class ChaosFaults(Faults):
    def __init__(
        self, max_hang_seconds: float = 30.0, *, seed: int = 0, clock: Callable[[], float] = time.monotonic
    ) -> None:
        super().__init__(max_hang_seconds)
        self._chaos_lock = threading.Lock()
        self._rng = random.Random(seed)  # noqa: S311 - reproducible test faults, not crypto
        self._clock = clock
        self._random: list[RandomRule] = []
        self._outage_status: int | None = None
        self._outage_until: float | None = None
        self.random_failures = 0
        self.outage_failures = 0

    def fail_randomly(
        self,
        probability: float,
        statuses: Sequence[int] = (500, 409),
        *,
        verb: str | None = None,
        resource: str | None = None,
    ) -> RandomRule:
        _check_verb(verb)
        if not 0.0 < probability <= 1.0:
            raise ValueError(f"probability must be in (0, 1], not {probability}")
        if not statuses or any(not 400 <= s <= 599 for s in statuses):
            raise ValueError(f"statuses must be HTTP error codes (400-599), not {list(statuses)}")
        rule = RandomRule(probability, tuple(statuses), verb, resource)
        with self._chaos_lock:
            self._random.append(rule)
        return rule

    def outage(self, status: int = 503, *, seconds: float | None = None) -> None:
        if not 400 <= status <= 599:
            raise ValueError(f"status {status} is not an HTTP error code (400-599)")
        with self._chaos_lock:
            self._outage_status = status
            self._outage_until = None if seconds is None else self._clock() + seconds

    def end_outage(self) -> None:
        with self._chaos_lock:
            self._outage_status = self._outage_until = None

    def in_outage(self) -> bool:
        with self._chaos_lock:
            return self._outage_active()

    def _outage_active(self) -> bool:
        if self._outage_status is None:
            return False
        if self._outage_until is not None and self._clock() >= self._outage_until:
            self._outage_status = self._outage_until = None
            return False
        return True

    def clear(self) -> None:
        super().clear()
        with self._chaos_lock:
            self._random.clear()
            self._outage_status = self._outage_until = None

    def take(self, verb: str, resource: str, subresource: str, namespace: str, name: str, group: str) -> Fault | None:
        fault = super().take(verb, resource, subresource, namespace, name, group)
        if fault is not None:
            return fault
        full = f"{resource}/{subresource}" if subresource else resource
        with self._chaos_lock:
            if self._outage_active():
                assert self._outage_status is not None
                self.outage_failures += 1
                return Fault(self._outage_status, "injected outage", self.max_hang_seconds)
            for rule in self._random:
                matches = (rule.verb is None or rule.verb == verb) and (rule.resource is None or rule.resource == full)
                if matches and self._rng.random() < rule.probability:  # draws only for matching requests
                    self.random_failures += 1
                    return Fault(self._rng.choice(rule.statuses), None, self.max_hang_seconds)
        return None
