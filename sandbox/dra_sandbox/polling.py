"""Waiting for what another thread or process does: poll a predicate. The one polling loop of the bench and tests."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")


def wait_for(predicate: Callable[[], T | None], timeout: float, what: str, interval: float = 0.05) -> T:
    """Call `predicate` every `interval` seconds until it returns something truthy, and return that value.

    Raises TimeoutError naming `what` once `timeout` seconds have passed. The predicate gets one last call after
    the deadline, so a slow machine never fails a condition that holds by then.
    """
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out after {timeout:g} s waiting for {what}")
        time.sleep(interval)  # the polling interval, not synchronisation
