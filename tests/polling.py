"""The tests' one way to wait for what another thread or process does: the bench's poll loop with test defaults."""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

from dra_sandbox import polling

T = TypeVar("T")


def wait_for(
    predicate: Callable[[], T | None], timeout: float = 10.0, what: str = "condition", *, interval: float = 0.01
) -> T:
    """Poll `predicate` until it returns something truthy and return that; a TimeoutError naming `what` after
    `timeout` seconds fails the test (see dra_sandbox.polling.wait_for)."""
    return polling.wait_for(predicate, timeout, what, interval)
