"""The tests' one way to wait for something that happens on another thread or process: poll a predicate."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")


def wait_for(predicate: Callable[[], T | None], timeout: float = 10.0, what: str = "condition", *,
             interval: float = 0.01) -> T:
    """Call `predicate` every `interval` seconds until it returns something truthy, and return that value.

    Fails the test (AssertionError naming `what`) once `timeout` seconds have passed; the predicate is always
    called at least once more after the deadline, so a slow machine never fails a condition that holds.
    """
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:g} s waiting for {what}")
        time.sleep(interval)  # the polling interval, not synchronisation
