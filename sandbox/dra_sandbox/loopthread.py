"""The one background thread of a bench component that loops until stopped (the kubelet simulator's plugin watcher,
node status, registration sessions and health streams; the node lifecycle controller)."""

from __future__ import annotations

import threading
from collections.abc import Callable


class LoopThread:
    """A daemon thread running `target`, a loop that ends once `stopping` is set. `stop()` sets it and waits up to
    `join_timeout_s` for the loop to end (a loop stuck in a call is left to end with the process: a daemon)."""

    def __init__(self, target: Callable[[], None], name: str, join_timeout_s: float = 5.0) -> None:
        self.stopping = threading.Event()
        self._thread = threading.Thread(target=target, name=name, daemon=True)
        self._join_timeout_s = join_timeout_s

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self.stopping.set()
        self.join()

    def join(self) -> None:
        """Wait for the loop to end (after `stopping` was set); at once if the thread never started."""
        if self._thread.ident is not None:
            self._thread.join(self._join_timeout_s)
