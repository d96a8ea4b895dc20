"""The plugin's directories on the node: created with exact modes, checked to be usable before anything else
runs, and held by one plugin instance at a time.

A directory the plugin cannot use is a startup error that names the path, what is wrong and what to do, rather
than a traceback or an error on every claim later. Modes are set with chmod after mkdir because mkdir's mode is
filtered by the process umask.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import secrets
import stat
import threading
import time
from pathlib import Path

import structlog

from dra_driver.errors import DraDriverError
from dra_driver.fsutil import explain_os_error

log = structlog.get_logger(__name__)

PLUGIN_DIR_MODE = 0o750  # the kubelet (root) connects to dra.sock; nobody else needs to look inside
CDI_ROOT_MODE = 0o755  # container runtimes read the specs
INSTANCE_LOCK_NAME = "plugin.lock"
# Files the plugin keeps in its dir: each must be a regular file when it exists.
PLUGIN_FILES = ("checkpoint.json", "checkpoint.json.lock", INSTANCE_LOCK_NAME)


class StateDirError(DraDriverError):
    """A directory or file the plugin needs is unusable; the message says which, why and what to do."""


def prepare_plugin_dir(path: Path) -> None:
    """Create `--plugin-dir` (mode exactly 0750) and check that it is a writable directory whose state files,
    where they exist, are regular files."""
    hint = f"the plugin dir {path} (--plugin-dir)"
    _make_dir(path, PLUGIN_DIR_MODE, hint, chmod_existing=True)
    for name in PLUGIN_FILES:
        target = path / name
        try:
            st = target.lstat()
        except FileNotFoundError:
            continue
        except OSError as exc:
            raise StateDirError(explain_os_error(exc, target, "checking", hint)) from exc
        if not stat.S_ISREG(st.st_mode):
            kind = "a directory" if stat.S_ISDIR(st.st_mode) else "not a regular file"
            raise StateDirError(
                f"{target} is {kind}; the plugin keeps its {name} there as a file. Move it out of the way (if it "
                "holds a checkpoint, keep a copy: the plugin rebuilds claim ownership when the file is absent)"
            )
    _check_writable(path, hint)


def prepare_cdi_root(path: Path) -> None:
    """Create `--cdi-root` if it is missing (mode exactly 0755) and check that it is a writable directory. An
    existing one keeps its mode: it is shared with the container runtime and other drivers."""
    hint = f"the CDI spec dir {path} (--cdi-root)"
    _make_dir(path, CDI_ROOT_MODE, hint, chmod_existing=False)
    _check_writable(path, hint)


def _make_dir(path: Path, mode: int, hint: str, *, chmod_existing: bool) -> None:
    existed = path.is_dir()
    try:
        path.mkdir(parents=True, exist_ok=True)
    except FileExistsError as exc:
        raise StateDirError(f"{hint} exists but is not a directory; remove it or point the flag elsewhere") from exc
    except OSError as exc:
        raise StateDirError(explain_os_error(exc, path, "creating", hint)) from exc
    if not path.is_dir():
        raise StateDirError(f"{hint} is not a directory (a link to a file?); point the flag at a directory")
    if existed and not chmod_existing:
        return
    try:
        os.chmod(path, mode)
    except OSError as exc:
        raise StateDirError(explain_os_error(exc, path, f"setting mode {mode:o} on", hint)) from exc


def _check_writable(directory: Path, hint: str) -> None:
    """Create, fsync and delete a probe file: the only reliable test (read-only mounts, permissions, a full
    disk, an immutable flag all show up here rather than on the first claim)."""
    probe = directory / f".write-probe-{os.getpid()}-{secrets.token_hex(4)}"
    try:
        fd = os.open(probe, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
        try:
            os.write(fd, b"ok")
            os.fsync(fd)
        finally:
            os.close(fd)
        probe.unlink()
    except OSError as exc:
        with contextlib.suppress(OSError):
            probe.unlink()
        raise StateDirError(explain_os_error(exc, directory, "writing into", hint)) from exc


class InstanceLock:
    """An exclusive flock on `<plugin-dir>/plugin.lock`, held for the process's life (the kernel drops it when
    the process dies). Startup recovery rolls back, deletes and destroys what no record owns, which is only
    safe while no other plugin instance is working in the same dir."""

    def __init__(self, plugin_dir: Path) -> None:
        self.path = plugin_dir / INSTANCE_LOCK_NAME
        self._fd: int | None = None

    def acquire(self, timeout: float, stopped: threading.Event | None = None) -> None:
        try:
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        except OSError as exc:
            raise StateDirError(explain_os_error(exc, self.path, "opening", "the plugin dir (--plugin-dir)")) from exc
        deadline = time.monotonic() + timeout
        waiting_logged = False
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() >= deadline or (stopped is not None and stopped.is_set()):
                    holder = _read_pid(fd)
                    os.close(fd)
                    raise StateDirError(
                        f"another plugin instance{f' (pid {holder})' if holder else ''} holds {self.path}; two "
                        "instances on one node would fight over claims. Stop the other one (during a rolling update "
                        "it exits within its shutdown grace period)"
                    ) from None
                if not waiting_logged:
                    log.info("waiting for the previous plugin instance to exit", lock=str(self.path))
                    waiting_logged = True
                # Polling: flock has no timeout, and a blocked call could not notice a shutdown request.
                (stopped or threading.Event()).wait(0.2)
        os.ftruncate(fd, 0)
        os.write(fd, f"{os.getpid()}\n".encode())
        self._fd = fd

    def release(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None


def _read_pid(fd: int) -> str:
    try:
        return os.pread(fd, 32, 0).decode(errors="replace").strip()
    except OSError:
        return ""
