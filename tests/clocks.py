"""A wall clock for tests: code that takes a `clock: Callable[[], datetime]` reads `now`, which only the test moves."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import UTC, datetime


@dataclass
class MovableClock:
    """Returns `now` when called; the test moves time by changing `now` (e.g. past a binding timeout) instead of
    sleeping."""

    now: datetime = field(default_factory=lambda: datetime(2026, 7, 1, 12, 0, tzinfo=UTC))

    def __call__(self) -> datetime:
        return self.now
