"""One sandbox at a time in the machine's CDI directory.

Podman reads CDI specs only from /etc/cdi and /var/run/cdi, so a sandbox that runs real containers puts its plugins'
specs there. Two such sandboxes at once (`make demo` while `dra-sandbox up` runs, or two test workers) would share
the directory, and since both name their nodes alike, one plugin's start-up recovery would delete the other's specs as
orphans (a real node has its own directory, so the plugin is right to). The sandbox holding this lock owns the
directory; another one waits for it (podman forced) or checks CDI instead of running containers (auto)."""

from __future__ import annotations

import errno
import fcntl
import os
import time
from pathlib import Path

LOCK_NAME = ".dra-sandbox.lock"  # not *.json / *.yaml: CDI loaders ignore it


class SystemCdiLock:
    def __init__(self, fd: int, path: Path) -> None:
        self._fd = fd
        self.path = path

    @classmethod
    def acquire(cls, cdi_dir: Path, wait_s: float = 0.0) -> SystemCdiLock | str:
        """The lock, or (after `wait_s`) why not: a text naming the holder."""
        path = cdi_dir / LOCK_NAME
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        deadline = time.monotonic() + wait_s
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError as exc:
                if exc.errno not in (errno.EWOULDBLOCK, errno.EAGAIN):
                    os.close(fd)
                    raise
                if time.monotonic() >= deadline:
                    holder = os.pread(fd, 64, 0).decode(errors="replace").strip() or "unknown"
                    os.close(fd)
                    return f"another sandbox (pid {holder}) is using {cdi_dir} for its containers"
                time.sleep(0.2)  # flock has no timed wait; the holder is another process
                continue
            os.ftruncate(fd, 0)
            os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
            return cls(fd, path)

    def release(self) -> None:
        if self._fd >= 0:
            os.ftruncate(self._fd, 0)
            os.close(self._fd)  # closing drops the flock
            self._fd = -1
