"""Waiting for what another thread or process does: poll a predicate. The one polling loop of the bench and tests."""

from __future__ import annotations

import socket
import time
from collections.abc import Callable
from pathlib import Path
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


def socket_accepts(path: Path) -> bool:
    """A live listener on the unix socket (a SIGKILLed process leaves the file behind): a predicate to poll."""
    probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    probe.settimeout(1.0)
    try:
        probe.connect(str(path))
    except OSError:
        return False
    finally:
        probe.close()
    return True
