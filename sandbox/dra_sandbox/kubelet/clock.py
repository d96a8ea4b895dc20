"""Time and retry pacing, injectable so tests control waits instead of sleeping."""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass
from typing import Protocol


class Clock(Protocol):
    def monotonic(self) -> float: ...

    def wall(self) -> float: ...

    def wait(self, stop: threading.Event, seconds: float) -> bool:
        """Wait up to `seconds`; True as soon as `stop` is set (the caller should then return)."""
        ...


class RealClock:
    def monotonic(self) -> float:
        return time.monotonic()

    def wall(self) -> float:
        return time.time()

    def wait(self, stop: threading.Event, seconds: float) -> bool:
        return stop.wait(max(0.0, seconds))


@dataclass(frozen=True)
class Backoff:
    """Exponential backoff: initial * factor**(attempt-1), capped at maximum. attempt counts from 1."""

    initial: float = 1.0
    factor: float = 2.0
    maximum: float = 30.0

    def delay(self, attempt: int) -> float:
        if attempt < 1:
            return 0.0
        return float(min(self.maximum, self.initial * self.factor ** (attempt - 1)))
