"""The plugin's directories on the node: created with exact modes and checked to be usable before anything else
runs; the lock that keeps recovery apart from the claim operations of every plugin instance on the node; and the
per-key locks that serialise the operations of one process on one claim or device (`KeyedLocks`).

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
from collections.abc import Callable, Iterable, Iterator
from contextlib import AbstractContextManager
from pathlib import Path

from dra_driver.errors import DraDriverError
from dra_driver.fsutil import explain_os_error

PLUGIN_DIR_MODE = 0o750  # the kubelet (root) connects to dra.sock; nobody else needs to look inside
CDI_ROOT_MODE = 0o755  # container runtimes read the specs
OPERATION_LOCK_NAME = "plugin.lock"
# Files the plugin keeps in its dir: each must be a regular file when it exists.
PLUGIN_FILES = ("checkpoint.json", "checkpoint.json.lock", OPERATION_LOCK_NAME)


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


class NodeStateBusyError(DraDriverError):
    """The node's claim state is held by another plugin instance longer than we may wait."""


class OperationLock:
    """A reader/writer lock on `<plugin-dir>/plugin.lock` across the plugin instances of a node.

    Every claim operation (prepare, unprepare) holds it shared; recovery holds it exclusive. Two instances (the old
    and the new pod of a seamless rolling update) therefore serve side by side, but recovery, which rolls back,
    deletes and destroys what no record owns, never runs while any instance is in the middle of a claim: no
    PrepareStarted record, just-created MIG instance or half-written temp file it finds can belong to live work.

    flock locks belong to an open file, not a thread, so the threads of this process share one descriptor: the
    first reader takes the shared flock, the last one drops it, and a writer waits for the readers of its own
    process first. Polling with LOCK_NB gives the waits a timeout (flock itself has none)."""

    _POLL_S = 0.02

    def __init__(self, path: Path) -> None:
        self.path = path
        self._cond = threading.Condition()
        self._fd: int | None = None
        self._readers = 0
        self._writer = False

    def _descriptor(self) -> int:
        if self._fd is None:
            try:
                self._fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
            except OSError as exc:
                raise StateDirError(
                    explain_os_error(exc, self.path, "opening", "the plugin dir (--plugin-dir)")
                ) from exc
        return self._fd

    def _flock(self, operation: int, deadline: float, what: str) -> None:
        fd = self._descriptor()
        while True:
            try:
                fcntl.flock(fd, operation | fcntl.LOCK_NB)
                return
            except BlockingIOError:
                if time.monotonic() >= deadline:
                    raise NodeStateBusyError(
                        f"{what}: another plugin instance on this node holds {self.path} (it is recovering the node's "
                        "claim state, or is in the middle of a claim); try again"
                    ) from None
                time.sleep(self._POLL_S)

    def shared(self, timeout: float) -> AbstractContextManager[None]:
        """Held by every claim operation (twice per claim): a plain object with `__enter__`/`__exit__`, where a
        generator context manager cost ≈ 2 µs more per use."""
        return _SharedHold(self, timeout)

    def _enter_shared(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        with self._cond:
            while self._writer:
                if not self._cond.wait(max(0.0, deadline - time.monotonic())):
                    raise NodeStateBusyError("this plugin is recovering the node's claim state; the kubelet will retry")
            if self._readers == 0:
                self._flock(fcntl.LOCK_SH, deadline, "claim operation")
            self._readers += 1

    def _leave_shared(self) -> None:
        with self._cond:
            self._readers -= 1
            if self._readers == 0:
                fcntl.flock(self._descriptor(), fcntl.LOCK_UN)
                self._cond.notify_all()

    @contextlib.contextmanager
    def exclusive(self, timeout: float) -> Iterator[None]:
        deadline = time.monotonic() + timeout
        with self._cond:
            while self._writer or self._readers:
                if not self._cond.wait(max(0.0, deadline - time.monotonic())):
                    raise NodeStateBusyError("recovery: claim operations of this plugin did not finish in time")
            self._writer = True
        try:
            self._flock(fcntl.LOCK_EX, deadline, "recovery")
            try:
                yield
            finally:
                fcntl.flock(self._descriptor(), fcntl.LOCK_UN)
        finally:
            with self._cond:
                self._writer = False
                self._cond.notify_all()

    def close(self) -> None:
        with self._cond:
            if self._fd is not None:
                os.close(self._fd)
                self._fd = None


class _SharedHold:
    __slots__ = ("_lock", "_timeout")

    def __init__(self, lock: OperationLock, timeout: float) -> None:
        self._lock, self._timeout = lock, timeout

    def __enter__(self) -> None:
        self._lock._enter_shared(self._timeout)

    def __exit__(self, *exc: object) -> None:
        self._lock._leave_shared()


class KeyedLocks:
    """One lock per key (a claim UID, a GPU), made on first use and dropped when nobody holds or waits for it, so
    keys that come and go (claim UIDs) do not pile up. `hold` takes its keys in sorted order (two callers never
    wait for each other crosswise) with one deadline for all; a key still held by another thread when it passes
    raises `busy(key)`: the caller answers with a retryable error instead of piling up calls on the kubelet.

    Within one process only: the processes of the node are kept apart by OperationLock and the checkpoint store."""

    def __init__(self, busy: Callable[[str], Exception]) -> None:
        self._busy = busy
        self._guard = threading.Lock()
        self._locks: dict[str, tuple[threading.Lock, int]] = {}  # key -> (its lock, holders and waiters)

    def _enter(self, key: str) -> threading.Lock:
        with self._guard:
            lock, users = self._locks.get(key) or (threading.Lock(), 0)
            self._locks[key] = (lock, users + 1)
            return lock

    def _leave(self, key: str) -> None:
        with self._guard:
            lock, users = self._locks[key]
            if users == 1:
                del self._locks[key]
            else:
                self._locks[key] = (lock, users - 1)

    def hold(self, keys: Iterable[str], timeout: float) -> AbstractContextManager[None]:
        return _KeysHeld(self, sorted(set(keys)), timeout)

    def _take(self, keys: list[str], timeout: float) -> list[tuple[str, threading.Lock | None]]:
        """Each key entered and its lock acquired, in order; on a timeout (or any error) what was taken is given
        back, latest first, and the error raised. Returns (key, its lock) per key, for `_give_back`."""
        deadline = time.monotonic() + timeout
        taken: list[tuple[str, threading.Lock | None]] = []
        try:
            for key in keys:
                lock = self._enter(key)
                taken.append((key, None))  # entered, not yet acquired
                if not lock.acquire(timeout=max(0.0, deadline - time.monotonic())):
                    raise self._busy(key)
                taken[-1] = (key, lock)
        except BaseException:
            self._give_back(taken)
            raise
        return taken

    def _give_back(self, taken: list[tuple[str, threading.Lock | None]]) -> None:
        for key, lock in reversed(taken):
            try:
                if lock is not None:
                    lock.release()
            finally:
                self._leave(key)


class _KeysHeld:
    """`KeyedLocks.hold` as a plain context manager (no generator and ExitStack per claim operation)."""

    __slots__ = ("_keys", "_locks", "_taken", "_timeout")

    def __init__(self, locks: KeyedLocks, keys: list[str], timeout: float) -> None:
        self._locks, self._keys, self._timeout = locks, keys, timeout
        self._taken: list[tuple[str, threading.Lock | None]] = []

    def __enter__(self) -> None:
        self._taken = self._locks._take(self._keys, self._timeout)

    def __exit__(self, *exc: object) -> None:
        taken, self._taken = self._taken, []
        self._locks._give_back(taken)
