"""One publisher of a node's ResourceSlices, whichever plugin instances run there.

During a seamless rolling update the old and the new plugin pod of a node run side by side. Both would
publish the node's pool; if their versions lay the slices out differently, each would see the other's
slices as drift and rewrite them, and the pool's generation would climb. An exclusive flock on
`<plugin-dir>/publisher.lock` lets exactly one instance publish: the old one keeps publishing until it exits
(the kernel drops its lock, even on SIGKILL), then the new one takes over. Its slices stay in place in
between, so the scheduler never sees the pool disappear. A single instance gets the lock at once.
"""

from __future__ import annotations

import fcntl
import os
import threading
from collections.abc import Callable
from pathlib import Path

import structlog

log = structlog.get_logger(__name__)

LOCK_NAME = "publisher.lock"


class PublisherLease:
    """Runs `on_acquired` once this process holds the publisher lock; `release` gives it back."""

    def __init__(self, plugin_dir: Path, on_acquired: Callable[[], None], *, poll_interval: float = 1.0) -> None:
        self.path = plugin_dir / LOCK_NAME
        self._on_acquired = on_acquired
        self._poll_interval = poll_interval
        self._stop = threading.Event()
        self._fd: int | None = None
        self.held = threading.Event()
        self._thread = threading.Thread(target=self._acquire_loop, name="publisher-lease", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def _try_lock(self) -> bool:
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            return False
        self._fd = fd
        return True

    def _acquire_loop(self) -> None:
        waiting_logged = False
        while not self._stop.is_set():
            if self._try_lock():
                log.info("publishing this node's ResourceSlices", lock=str(self.path))
                self.held.set()
                self._on_acquired()
                return
            if not waiting_logged:
                log.info("another plugin instance publishes this node's slices; waiting to take over")
                waiting_logged = True
            self._stop.wait(self._poll_interval)

    def release(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join()
        if self._fd is not None:
            os.close(self._fd)  # closing the only descriptor drops the flock
            self._fd = None
            self.held.clear()
