"""The threads of a level-triggered controller in the sandbox (the scheduler stand-in, the device taint eviction
controller): one loop runs whole passes, and one watch per API path wakes it on any event. A pass lists what it
needs itself, so an event only says "look again"; a watch that ends (its timeout) or fails is opened again.
`stop` closes the open watches, so their threads notice at once instead of at the watch's timeout."""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence

from dra_driver.k8s.client import ApiError, KubeRest, WatchStream
from dra_sandbox.kubelet.clock import Clock, RealClock

WATCH_TIMEOUT_S = 30
WATCH_RETRY_S = 0.5  # after an API error, before the watch is opened again
JOIN_TIMEOUT_S = 5.0


class WatchLoop:
    """`step` is one pass; it returns the seconds until the next pass is due by time alone (an event or
    `trigger()` starts one sooner). It handles its own errors: one escaping it ends the loop."""

    def __init__(self, rest: KubeRest, name: str, step: Callable[[], float], clock: Clock | None = None) -> None:
        self._rest = rest
        self._name = name
        self._step = step
        self._clock = clock or RealClock()
        self._wake = threading.Event()
        self._stopped = threading.Event()
        self._threads: list[threading.Thread] = []
        self._streams: dict[str, WatchStream] = {}  # path -> its open watch
        self._guard = threading.Lock()

    def start(self, paths: Sequence[str]) -> None:
        self._threads = [threading.Thread(target=self._run, name=self._name, daemon=True)]
        self._threads += [threading.Thread(target=self._watch, args=(path,), name=f"{self._name} watch {path}",
                                           daemon=True) for path in paths]
        for thread in self._threads:
            thread.start()

    def trigger(self) -> None:
        self._wake.set()

    def stop(self) -> None:
        self._stopped.set()
        self._wake.set()
        with self._guard:
            for stream in self._streams.values():
                stream.close()
        for thread in self._threads:
            thread.join(timeout=JOIN_TIMEOUT_S)

    def _run(self) -> None:
        while not self._stopped.is_set():
            self._wake.clear()
            self._clock.wait(self._wake, self._step())

    def _watch(self, path: str) -> None:
        while not self._stopped.is_set():
            try:
                stream = self._rest.watch(path, timeout_seconds=WATCH_TIMEOUT_S)
                with self._guard:
                    self._streams[path] = stream
                if self._stopped.is_set():  # stop() ran while this watch opened: it did not close this one
                    stream.close()
                for _event in stream:
                    self._wake.set()
            except ApiError:
                self._clock.wait(self._stopped, WATCH_RETRY_S)
