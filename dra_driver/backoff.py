"""The one retry pacing of the product: exponential backoff with a cap and optional jitter.

Every loop that waits after a failure (resource slice requests and passes, the slice watch, the informers, the
controller's reconcile retries, status.devices writes, the Node driver annotation, the driver wait and the driver
reload) takes its delays from a `Backoff`. The caller keeps waiting on what it already waits on (a stop Event, a
Condition, kopf's own delay), so a stop request still ends a wait at once; this module only says how long.

`delay(failures)` is `min(cap, initial * factor**failures)`, where `failures` counts the failures before this
one (0 for the first). With `jitter` j > 0 the delay is then scaled by a draw from [1 - j, 1) (client-go's
"jitter down" shape): a fleet of nodes that failed together does not retry in step, and no wait passes the cap.
A `Retries` counts one loop's failures; `reset()` after a success starts the next failure at `initial` again.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Backoff:
    initial: float  # seconds before the first retry
    cap: float  # no delay is longer
    factor: float = 2.0
    jitter: float = 0.0  # 0: exact delays; 0.5: each is drawn from [half, all] of the exact one

    def __post_init__(self) -> None:
        if not (math.isfinite(self.initial) and self.initial >= 0):
            raise ValueError(f"backoff initial must be a finite number of seconds >= 0, got {self.initial}")
        if not (self.cap >= 0):  # inf allowed: no cap
            raise ValueError(f"backoff cap must be >= 0 seconds, got {self.cap}")
        if not (math.isfinite(self.factor) and self.factor >= 1):
            raise ValueError(f"backoff factor must be a finite number >= 1, got {self.factor}")
        if not (0 <= self.jitter <= 1):
            raise ValueError(f"backoff jitter must be between 0 and 1, got {self.jitter}")

    def delay(self, failures: int, rng: random.Random | None = None) -> float:
        """Seconds to wait after the (failures + 1)-th failure in a row. `rng` is required when jitter > 0."""
        if failures < 0:
            raise ValueError(f"failures must be >= 0, got {failures}")
        try:
            exact = self.initial * self.factor**failures if self.initial else 0.0
        except OverflowError:  # a loop failing for days: the cap has long been reached
            exact = math.inf
        exact = float(min(self.cap, exact))
        if not self.jitter:
            return exact
        if rng is None:
            raise ValueError("a jittered backoff needs a random source")
        return exact * ((1.0 - self.jitter) + self.jitter * rng.random())


class Retries:
    """One loop's failures in a row under a `Backoff`: `next()` gives the wait after one more, `reset()` after a
    success. Not thread-safe: each loop owns its own."""

    def __init__(self, policy: Backoff, rng: random.Random | None = None) -> None:
        self.policy = policy
        self._rng = rng
        self.failures = 0

    def next(self) -> float:
        delay = self.policy.delay(self.failures, self._rng)
        self.failures += 1
        return delay

    def reset(self) -> None:
        self.failures = 0
