"""A kubelet plugin's process life: start, serve until SIGTERM or SIGINT, stop (once); both drivers' plugins run this
way."""

from __future__ import annotations

import signal
import threading
from collections.abc import Callable, Mapping
from types import FrameType

import structlog

log = structlog.get_logger(__name__)


def serve_until_signal(
    start: Callable[[], None],
    stop: Callable[[], None],
    *,
    stop_requested: threading.Event,
    done: threading.Event,
    also: Mapping[signal.Signals, Callable[[], None]] | None = None,
) -> None:
    """`start`, then wait for `done`, then `stop`. SIGTERM and SIGINT set `stop_requested` (which ends a driver wait
    inside `start`) and `done`; `also` handles other signals (the GPU plugin's SIGHUP). The handlers are installed
    before `start` and the previous ones put back after `stop`."""

    def on_signal(signum: int, frame: FrameType | None) -> None:
        log.info("signal received", signal=signal.Signals(signum).name)
        stop_requested.set()
        done.set()

    def handler(action: Callable[[], None]) -> Callable[[int, FrameType | None], None]:
        return lambda signum, frame: action()

    previous = {s: signal.signal(s, on_signal) for s in (signal.SIGTERM, signal.SIGINT)}
    for sig, action in (also or {}).items():
        previous[sig] = signal.signal(sig, handler(action))
    try:
        start()
        done.wait()
    finally:
        stop()
        for sig, old in previous.items():
            signal.signal(sig, old)


def begin_stop(stopped: threading.Event, stop_requested: threading.Event) -> bool:
    """Mark a plugin as stopping (`stop_requested` ends a driver wait inside its start, `stopped` its loops): True
    the first time, False when it was stopped already: a second call of its stop does nothing."""
    if stopped.is_set():
        return False
    stop_requested.set()
    stopped.set()
    return True
