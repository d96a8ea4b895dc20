"""The plugin watcher: finds registration sockets in the kubelet's registry directory.

Like the kubelet's pluginwatcher it creates the directory (0755), walks what is already there at
start, watches subdirectories too, ignores names starting with '.', reports a new unix socket as
added and a removed one as removed. Linux inotify is used when available; otherwise (or when asked)
the tree is rescanned every `poll_interval_s`.
"""

from __future__ import annotations

import logging
import os
import stat
import threading
from collections.abc import Callable
from pathlib import Path

from dra_sandbox.kubelet.inotify import (
    IN_CREATE,
    IN_DELETE,
    IN_DELETE_SELF,
    IN_IGNORED,
    IN_MOVE_SELF,
    IN_MOVED_FROM,
    IN_MOVED_TO,
    IN_Q_OVERFLOW,
    Inotify,
    InotifyUnavailable,
)
from dra_sandbox.loopthread import LoopThread

log = logging.getLogger(__name__)
SocketCallback = Callable[[str], None]


def is_socket(path: str) -> bool:
    try:
        return stat.S_ISSOCK(os.lstat(path).st_mode)
    except OSError:
        return False


def scan_sockets(root: str) -> tuple[set[str], set[str]]:
    """(sockets, directories) under `root`, skipping anything whose name starts with '.'."""
    sockets: set[str] = set()
    dirs: set[str] = {root}
    for current, subdirs, files in os.walk(root):
        subdirs[:] = [d for d in subdirs if not d.startswith(".")]
        dirs.update(os.path.join(current, d) for d in subdirs)
        for name in files:
            path = os.path.join(current, name)
            if not name.startswith(".") and is_socket(path):
                sockets.add(path)
    return sockets, dirs


class PluginWatcher:
    def __init__(
        self,
        registry_dir: Path,
        on_added: SocketCallback,
        on_removed: SocketCallback,
        *,
        use_inotify: bool = True,
        poll_interval_s: float = 0.5,
    ) -> None:
        self.registry_dir = str(registry_dir)
        self._on_added = on_added
        self._on_removed = on_removed
        self._use_inotify = use_inotify
        self._poll_interval_s = poll_interval_s
        self._worker = LoopThread(self._run, "plugin-watcher")
        self._known: set[str] = set()
        self._known_lock = threading.Lock()  # _known is written by the watcher thread, read by anyone
        self._inotify: Inotify | None = None
        self._wd_to_dir: dict[int, str] = {}
        self.mode = "stopped"

    def start(self) -> None:
        os.makedirs(self.registry_dir, mode=0o755, exist_ok=True)
        if self._use_inotify:
            try:
                self._inotify = Inotify()
            except InotifyUnavailable as exc:
                log.warning("plugin watcher: %s; falling back to polling", exc)
        self.mode = "inotify" if self._inotify else "polling"
        # Watches first, then the walk: a socket created in between is seen twice, never missed.
        self._resync()
        self._worker.start()

    def stop(self) -> None:
        self._worker.stop()
        if self._inotify is not None:
            self._inotify.close()
            self._inotify = None
        self.mode = "stopped"

    def known_sockets(self) -> set[str]:
        with self._known_lock:
            return set(self._known)

    # ---- internals (watcher thread only, after start) ------------------------------------------------

    def _watch_dir(self, path: str) -> None:
        if self._inotify is None or path in self._wd_to_dir.values():
            return
        try:
            self._wd_to_dir[self._inotify.add_watch(path)] = path
        except OSError as exc:
            log.warning("plugin watcher: cannot watch %s: %s", path, exc)

    def _resync(self) -> None:
        """Compare the tree with what we know: report new and vanished sockets."""
        sockets, dirs = scan_sockets(self.registry_dir)
        for directory in sorted(dirs):
            self._watch_dir(directory)
        known = self.known_sockets()
        for path in sorted(known - sockets):
            self._removed(path)
        for path in sorted(sockets - known):
            self._added(path)

    def _added(self, path: str) -> None:
        with self._known_lock:
            if path in self._known:
                return
            self._known.add(path)
        log.info("plugin watcher: socket %s appeared", path)
        self._on_added(path)

    def _removed(self, path: str) -> None:
        with self._known_lock:
            if path not in self._known:
                return
            self._known.discard(path)
        log.info("plugin watcher: socket %s removed", path)
        self._on_removed(path)

    def _run(self) -> None:
        while not self._worker.stopping.is_set():
            try:
                if self._inotify is None:
                    self._worker.stopping.wait(self._poll_interval_s)
                    if not self._worker.stopping.is_set():
                        self._resync()
                else:
                    self._handle_events()
            except Exception:  # the watcher must survive anything a plugin does to the directory
                log.exception("plugin watcher: unexpected error; rescanning")
                self._worker.stopping.wait(self._poll_interval_s)

    def _handle_events(self) -> None:
        assert self._inotify is not None
        for event in self._inotify.read(timeout_s=0.2):
            if event.mask & IN_Q_OVERFLOW:
                self._resync()
                continue
            directory = self._wd_to_dir.get(event.wd)
            if event.mask & (IN_IGNORED | IN_DELETE_SELF | IN_MOVE_SELF):
                if directory is not None and event.mask & IN_IGNORED:
                    del self._wd_to_dir[event.wd]
                    for path in sorted(p for p in self.known_sockets() if p.startswith(directory + os.sep)):
                        self._removed(path)
                continue
            if directory is None or not event.name or event.name.startswith("."):
                continue
            path = os.path.join(directory, event.name)
            if event.mask & (IN_CREATE | IN_MOVED_TO):
                if event.is_dir:
                    # Sockets may have been created in the new directory before its watch existed.
                    sockets, dirs = scan_sockets(path)
                    for sub in sorted(dirs):
                        self._watch_dir(sub)
                    for sock in sorted(sockets):
                        self._added(sock)
                elif is_socket(path):
                    self._added(path)
            elif event.mask & (IN_DELETE | IN_MOVED_FROM):
                if event.is_dir:
                    for sock in sorted(p for p in self.known_sockets() if p.startswith(path + os.sep)):
                        self._removed(sock)
                else:
                    self._removed(path)
