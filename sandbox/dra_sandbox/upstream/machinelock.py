"""One real node per machine (docs/device-plugin.md "Tests"): every upstream kubelet serves the device manager's
fixed `/var/lib/kubelet/device-plugins/kubelet.sock` whatever its --root-dir, so a second real kubelet on the same
machine (another pytest session, another `dra-sandbox up`) would remove the first one's socket and the plugin's, and
the first node would lose its `nvidia.com/gpu`. A real node holds this lock from its start to its stop; a second one
waits for it, then fails naming the holder.

An flock on a file under /run: the kernel drops it when its holder's process dies, so a killed sandbox never leaves
the machine locked; the file's text (pid, node, since) is only for the message.
"""

from __future__ import annotations

import fcntl
import os
import time
from pathlib import Path

from dra_sandbox.polling import wait_for

LOCK_WAIT_S = 300.0  # a real-node test module holds the machine for 40-50 s, a whole upstream session a few minutes


class MachineBusyError(RuntimeError):
    """Another real node holds the machine past the wait."""


class MachineLock:
    def __init__(self, path: Path, owner: str) -> None:
        self.path = path
        self.owner = owner
        self._fd: int | None = None

    @property
    def held(self) -> bool:
        return self._fd is not None

    def acquire(self, timeout: float = LOCK_WAIT_S, interval: float = 0.5) -> None:
        """Takes the lock, waiting up to `timeout` seconds while another holder has it."""
        if self._fd is not None:
            return
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        try:
            wait_for(lambda: _try_lock(fd), timeout, f"the machine's real-node lock {self.path}", interval=interval)
        except TimeoutError:
            holder = _read_holder(fd)
            os.close(fd)
            raise MachineBusyError(
                f"{self.path} is held by {holder or 'another process'} after {timeout:g} s: only one real kubelet can "
                "run on a machine (each serves /var/lib/kubelet/device-plugins/kubelet.sock); stop that node "
                "(`dra-sandbox down`, or the other test session) and try again") from None
        except BaseException:
            os.close(fd)
            raise
        os.ftruncate(fd, 0)
        since = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
        os.pwrite(fd, f"pid {os.getpid()}, node {self.owner}, since {since}".encode(), 0)
        self._fd = fd

    def release(self) -> None:
        fd, self._fd = self._fd, None
        if fd is None:
            return
        os.ftruncate(fd, 0)
        os.close(fd)  # closing the only descriptor of this open file drops the flock


def _try_lock(fd: int) -> bool:
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return False
    return True


def _read_holder(fd: int) -> str:
    try:
        return os.pread(fd, 200, 0).decode("utf-8", "replace").strip()
    except OSError:
        return ""
