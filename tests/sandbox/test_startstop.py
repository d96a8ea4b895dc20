"""StartStop.starting: the timings a component's start() notes, and the stop() a failed start runs."""

from __future__ import annotations

import pytest

from dra_sandbox.startstop import StartStop


class _Parts(StartStop):
    def __init__(self, fail_at: str = "") -> None:
        self.fail_at = fail_at
        self.timings: dict[str, float] = {}
        self.started: list[str] = []
        self.stopped: list[list[str]] = []

    def start(self) -> None:
        with self.starting(self.timings) as ready:
            for part in ("first", "second"):
                if part == self.fail_at:
                    raise KeyboardInterrupt(part)  # a BaseException, as Ctrl-C in the middle of a start
                self.started.append(part)
                ready(part)

    def stop(self) -> None:
        self.stopped.append(list(self.started))


def test_each_part_is_timed_from_the_start_and_nothing_is_stopped() -> None:
    parts = _Parts()
    parts.start()
    assert list(parts.timings) == ["first", "second"]
    assert 0.0 <= parts.timings["first"] <= parts.timings["second"]
    assert parts.stopped == []


def test_a_failed_start_stops_what_had_started_and_raises() -> None:
    parts = _Parts(fail_at="second")
    with pytest.raises(KeyboardInterrupt, match="second"):
        parts.start()
    assert parts.stopped == [["first"]]
    assert list(parts.timings) == ["first"]
