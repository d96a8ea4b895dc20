"""Stopping the sandbox on a signal: SIGINT, SIGTERM and SIGHUP raise `StopRequested` in the main thread.

Python turns SIGINT into KeyboardInterrupt only when SIGINT was not ignored at start-up, and a shell starts a
backgrounded job (`cmd &`) with SIGINT ignored; SIGTERM and SIGHUP kill the interpreter without unwinding at
all. Either way the kubelet-plugin child processes would stay behind. Inside `stop_on_signals()` every one of
the three raises `StopRequested` once, so `with SandboxCluster(...)` (and every `finally`) unwinds and stops what
was started; a second signal during that shutdown is ignored, so the cleanup itself is not cut short.
"""

from __future__ import annotations

import signal
from collections.abc import Iterator
from contextlib import contextmanager
from types import FrameType

STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


class StopRequested(BaseException):
    """A stop signal arrived (a BaseException, like KeyboardInterrupt: `except Exception` does not swallow it)."""

    def __init__(self, signum: int) -> None:
        super().__init__(f"stopped by {signal.Signals(signum).name}")
        self.signum = signum

    @property
    def exit_code(self) -> int:
        return 128 + self.signum  # what a shell reports for a process killed by the signal


@contextmanager
def stop_on_signals() -> Iterator[None]:
    """Install the handlers (main thread only) for the duration of the block; the old ones come back after."""
    fired: list[int] = []

    def handler(signum: int, frame: FrameType | None) -> None:
        if fired:
            return  # already stopping: let the cleanup finish
        fired.append(signum)
        raise StopRequested(signum)

    previous = {sig: signal.signal(sig, handler) for sig in STOP_SIGNALS}
    try:
        yield
    finally:
        for sig, old in previous.items():
            signal.signal(sig, old)
