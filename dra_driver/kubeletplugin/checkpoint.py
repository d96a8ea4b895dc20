"""The crash-safe store of a driver's checkpoint: one file, written atomically, shared by the plugin instances of a
node, and never a reason to crash-loop.

What a driver records (its claim records, their format) is its codec's business (`CheckpointCodec`); the store adds
what every kubelet plugin needs of such a file:

- writes are atomic (temp file, fsync, rename) and group-committed: changes queued while another thread writes go
  out together as one file, so concurrent claim operations share the disk flushes; the directory is fsynced after
  the rename only where the boot id is unknown (`_sync_renames`);
- an in-process lock serialises threads and an flock on `<file>.lock` serialises processes (the old and the new pod
  of a seamless rolling update);
- nothing prepared survives a reboot (`/var/run` is gone, and with it every CDI spec): a file written under another
  boot id (`/proc/sys/kernel/random/boot_id`) is discarded;
- a corrupt file is moved aside under a unique name (`quarantine`) and the loss remembered (`take_loss`), so the
  driver rebuilds what it owns from what exists on the node instead of treating everything there as unowned; a file
  in a format newer than the codec knows (`NewerCheckpointError`) is never moved: the driver refuses to start;
- temp files a crash left mid-write are swept under the lock (`sweep_temp_files`).
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import re
import threading
import time
import weakref
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Generic, Protocol, TypeVar

import structlog

from dra_driver import defaults
from dra_driver.errors import DraDriverError
from dra_driver.fsutil import (
    explain_os_error,
    fsync_dir,
    parent_dir,
    rename_into_place,
    sweep_temp_files,
    temp_file_pattern,
    write_temp_file,
)

DEFAULT_BOOT_ID_PATH = defaults.BOOT_ID_PATH
PLUGIN_DIR_HINT = "the plugin dir (--plugin-dir)"

log = structlog.get_logger(__name__)

V = TypeVar("V")


class CorruptCheckpointError(DraDriverError, ValueError):
    """The file is damaged (not the codec's format, a bad checksum, a wrong shape): a codec's `decode` raises it,
    and the store moves the file aside."""


class NewerCheckpointError(DraDriverError):
    """The file is intact but in a format this plugin does not know. Never quarantined (it is not damaged, and
    a newer plugin needs it back): the plugin refuses to start instead of guessing at claims it cannot read."""


class CheckpointIOError(DraDriverError, OSError):
    """The checkpoint file (or its directory) cannot be read or written. The message names the path, what the
    system said and what to do; it ends up in the claim's error."""


class CheckpointCodec(Protocol[V]):
    """How one driver's checkpoint value becomes bytes and back. The store calls `encode` under its locks only, so
    a codec may keep a cache between writes (one codec per store)."""

    def encode(self, value: V) -> bytes: ...

    def decode(self, raw: bytes) -> V:
        """Raises CorruptCheckpointError for a damaged file, NewerCheckpointError for a newer format."""
        ...

    def empty(self, boot_id: str) -> V:
        """The value of a node with nothing recorded, since boot `boot_id`."""
        ...

    def boot_id(self, value: V) -> str:
        """The boot id `value` was written under ("": unknown, e.g. a file from before boot ids were recorded)."""
        ...

    def with_boot_id(self, value: V, boot_id: str) -> V: ...

    def records(self, value: V) -> int:
        """How many records `value` holds: a file that disappears with none recorded lost nothing."""
        ...


def read_boot_id(path: Path) -> str:
    try:
        return path.read_text().strip()
    except OSError:
        return ""


class CheckpointStore(Generic[V]):
    """The single reader/writer of one checkpoint file. `update` is a locked read-modify-write; `load` reads without
    waiting while the file is the one this store last read or wrote."""

    def __init__(
        self,
        path: Path,
        codec: CheckpointCodec[V],
        *,
        boot_id_path: Path = DEFAULT_BOOT_ID_PATH,
        clock_ns: Callable[[], int] = time.time_ns,
        on_loss: Callable[[str], None] | None = None,
        on_write: Callable[[float], None] | None = None,
        on_quarantine: Callable[[Path, str], None] | None = None,
    ) -> None:
        self.path = path
        # Every write and read works on these strings: a Path per step was measurable per claim.
        self._path_s = os.fspath(path)
        self._dir_s = parent_dir(self._path_s)
        self._codec = codec
        self._lock_path = path.with_name(path.name + ".lock")
        # The lock file stays open from the first lock on (closed with the store): an open + close per write was 2
        # of a claim's syscalls. The flock itself is still taken and released per write. Nothing removes the lock
        # file while a plugin runs (the plugin dir is ours; an old and a new pod of a rolling update open the same
        # file), so the inode held is the one every process locks.
        self._lock_fd: int | None = None
        self._boot_id = read_boot_id(boot_id_path)
        # Whether a write's rename is made durable (the directory fsynced) before its caller returns. Only a machine
        # crash can take back a rename that is not, and a machine crash is a reboot: the file is then read under
        # another boot id and discarded (`_read_file`), whichever version of it the directory holds. Each version's
        # content is fsynced before its rename, so that version is whole, never a torn file to quarantine. So with
        # the boot id known the directory fsync protects nothing, and it was one of the two disk flushes on every
        # prepare's and unprepare's path (docs/architecture.md "Durable files"). Without a boot id an old file would
        # be believed after a reboot: there every rename is made durable before its caller returns.
        self._sync_renames = not self._boot_id
        self._clock_ns = clock_ns
        self._on_loss = on_loss
        # Called with the quarantined file and why it was unusable (a Node Event: kubeletplugin/nodeevents.py).
        self.on_quarantine = on_quarantine
        self.on_write = on_write  # called with the seconds each durable write took (the metrics)
        self._mutex = threading.Lock()
        # The last value we read or wrote and the file identity it came from: re-decoding is skipped while the file
        # is unchanged (another process writing it changes inode, size or mtime).
        self._cached: tuple[tuple[int, int, int], V] | None = None
        # The last file this store renamed into place, with its identity, set just BEFORE the rename: a reader that
        # finds the new file between the rename and the update of `_cached` is served without the lock as well.
        self._written: tuple[tuple[int, int, int], V] | None = None
        # Why the recorded ownership was lost (corrupt file, file deleted under us); None while it is intact.
        self._loss: str | None = None
        self._queue: list[_Ticket[V]] = []
        self._queue_lock = threading.Lock()

    @contextlib.contextmanager
    def _locked(self) -> Iterator[None]:
        self._acquire()
        try:
            yield
        finally:
            self._release()

    def _acquire(self) -> None:
        """The in-process mutex, then the flock on the lock file (the hot paths call this and `_release` directly:
        a generator context manager per write costs more than the two calls)."""
        self._mutex.acquire()
        try:
            fd = self._lock_fd
            if fd is None:
                fd = self._lock_fd = self._open_lock()
                weakref.finalize(self, os.close, fd)
            fcntl.flock(fd, fcntl.LOCK_EX)
        except BaseException:
            self._mutex.release()
            raise

    def _release(self) -> None:
        try:
            if self._lock_fd is not None:
                fcntl.flock(self._lock_fd, fcntl.LOCK_UN)
        finally:
            self._mutex.release()

    def _open_lock(self) -> int:
        try:
            return os.open(self._lock_path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        except OSError as exc:
            # A read-only plugin dir still lets us read the checkpoint (and answer for prepared claims); writes
            # then fail with their own clear error.
            try:
                return os.open(self._lock_path, os.O_RDONLY | os.O_CLOEXEC)
            except OSError:
                raise CheckpointIOError(
                    explain_os_error(exc, self._lock_path, "opening the checkpoint lock", PLUGIN_DIR_HINT)
                ) from exc

    def exists(self) -> bool:
        """Whether a checkpoint file is there at all (a lost file means lost ownership, see `take_loss`)."""
        return os.path.lexists(self.path)

    def take_loss(self) -> str | None:
        """Why recorded ownership was lost since the last call (then cleared), or None."""
        with self._mutex:
            loss, self._loss = self._loss, None
            return loss

    def _lost(self, reason: str) -> None:
        self._loss = reason
        if self._on_loss is not None:
            self._on_loss(reason)

    def load(self) -> V:
        # Fast path without the locks: while the file is the one we last read or wrote (same inode, size, mtime),
        # the cached decode is what a locked read would return. A reader never waits behind another thread's
        # write this way; a write by another process replaces the file (new inode), and is read under the lock.
        try:
            identity = _identity(os.stat(self._path_s))
        except OSError:
            identity = None
        for known in (self._cached, self._written):
            if known is not None and known[0] == identity:
                return known[1]
        self._acquire()
        try:
            return self._read()
        finally:
            self._release()

    def update(self, change: Callable[[V], V]) -> V:
        """Apply `change` and put it in place before returning: every process reads it from then on and its
        content is on disk; its rename is made durable too where the boot id is unknown (`_sync_renames`; elsewhere
        the next boot, the only reader a machine crash leaves, discards the file anyway).

        Group commit: changes queued while another thread writes are applied together and written as ONE file
        by whichever caller gets the lock next, so concurrent prepares share the disk flushes. The lock covers
        the read-modify-write up to the rename (the temp file's fsync included); the directory fsync, where one is
        needed, runs after it, shared with concurrent flushes, while the next batch is already being written.
        Every caller returns only once its change is in place as above. A change that raises affects only its own
        caller."""
        ticket = _Ticket(change)
        with self._queue_lock:
            self._queue.append(ticket)
        written: list[_Ticket[V]] = []
        started = 0.0
        self._acquire()
        try:
            if not ticket.done:
                with self._queue_lock:
                    batch, self._queue = self._queue, []
                try:
                    written, started = self._apply(batch)
                finally:
                    for queued in batch:
                        queued.done = True
                        if queued not in written:
                            queued.durable.set()
        finally:
            self._release()
        if written:
            self._flush(written, started)
        ticket.durable.wait()
        if ticket.error is not None:
            raise ticket.error
        assert ticket.result is not None
        return ticket.result

    def _apply(self, batch: list[_Ticket[V]]) -> tuple[list[_Ticket[V]], float]:
        """Under the locks: apply the batch's changes and put the new file in place (not yet durable). Returns
        the tickets whose file was renamed into place (to flush) and when the write started."""
        try:
            current = self._read()
        except CheckpointIOError as exc:
            for queued in batch:
                queued.error = exc
            return [], 0.0
        for queued in batch:
            try:
                current = self._codec.with_boot_id(queued.change(current), self._boot_id)
                queued.result = current
            except Exception as exc:  # handed back to the caller that owns the change
                queued.error = exc
        started = time.monotonic()
        try:
            tmp = write_temp_file(self._path_s, self._codec.encode(current))
            # The file's identity once renamed (a rename keeps inode, size and mtime): readers that find it get
            # this state from `_written` without the lock, from the rename on. What they see is the file as it
            # then is; only a machine crash could still take the rename back, and after one (a reboot) the file
            # is discarded anyway (another boot id). The writers' callers return only once it is durable.
            written = (_identity(os.stat(tmp)), current)
            self._written = written
            try:
                rename_into_place(tmp, self._path_s)
            except BaseException:
                self._written = None
                raise
            self._cached = written
        except OSError as exc:
            error = CheckpointIOError(explain_os_error(exc, self.path, "writing the checkpoint", PLUGIN_DIR_HINT))
            for queued in batch:
                queued.error = queued.error or error
            return [], 0.0
        return batch, started

    def _flush(self, batch: list[_Ticket[V]], started: float) -> None:
        """After the locks: make the batch's rename durable where it has to be, then release its callers."""
        try:
            if self._sync_renames:
                fsync_dir(self._dir_s)
            if self.on_write is not None:
                self.on_write(time.monotonic() - started)
        except OSError as exc:
            error = CheckpointIOError(explain_os_error(exc, self.path, "writing the checkpoint", PLUGIN_DIR_HINT))
            for queued in batch:
                queued.error = queued.error or error
        finally:
            for queued in batch:
                queued.durable.set()

    def sweep_temp_files(self) -> list[Path]:
        """Delete temp files a crash left behind mid-write (`.checkpoint.json.<random>.tmp`). Under the lock, so
        no writer of this checkpoint can be in the middle of using one."""
        pattern = temp_file_pattern(re.escape(self.path.name))
        with self._locked():
            return sweep_temp_files(self.path.parent, lambda name: pattern.fullmatch(name) is not None)

    def _read(self) -> V:
        try:
            identity = _identity(os.stat(self._path_s))
        except FileNotFoundError:
            recorded = self._codec.records(self._cached[1]) if self._cached is not None else 0
            if recorded:
                # Somebody deleted the file under us: what it recorded is unknown to the file now.
                self._lost(f"{self.path} disappeared while {recorded} claim(s) were recorded")
            self._cached = None
            return self._codec.empty(self._boot_id)
        except OSError as exc:
            raise CheckpointIOError(
                explain_os_error(exc, self.path, "reading the checkpoint", PLUGIN_DIR_HINT)
            ) from exc
        if self._cached is not None and self._cached[0] == identity:
            return self._cached[1]
        value = self._read_file()
        self._cached = (identity, value) if self.path.exists() else None
        return value

    def _read_file(self) -> V:
        try:
            raw = self.path.read_bytes()
        except FileNotFoundError:
            return self._codec.empty(self._boot_id)
        except OSError as exc:
            raise CheckpointIOError(
                explain_os_error(exc, self.path, "reading the checkpoint", PLUGIN_DIR_HINT)
            ) from exc
        try:
            value = self._codec.decode(raw)
        except CorruptCheckpointError as exc:
            quarantine = self._quarantine()
            log.warning(
                "checkpoint corrupt; moved aside, ownership is rebuilt from what exists on the node",
                path=str(self.path),
                quarantined_to=str(quarantine),
                reason=str(exc),
            )
            self._lost(f"{self.path} was corrupt ({exc}); moved to {quarantine.name}")
            if self.on_quarantine is not None:
                try:
                    self.on_quarantine(quarantine, str(exc))
                except Exception:
                    log.exception("reporting the quarantined checkpoint failed", quarantined_to=str(quarantine))
            return self._codec.empty(self._boot_id)
        written_under = self._codec.boot_id(value)
        if written_under and self._boot_id and written_under != self._boot_id:
            log.info(
                "checkpoint is from before the last reboot; nothing prepared survives a reboot, discarding it",
                path=str(self.path),
                claims=self._codec.records(value),
            )
            return self._codec.empty(self._boot_id)
        return value

    def _quarantine(self) -> Path:
        """Move the corrupt file to `<name>.corrupt-<unix ns>-<pid>[-n]`, never over an earlier one (a hard link
        fails if the name exists, so two quarantines in the same instant cannot collide)."""
        base = f"{self.path.name}.corrupt-{self._clock_ns()}-{os.getpid()}"
        for attempt in range(1000):
            target = self.path.with_name(base if attempt == 0 else f"{base}-{attempt}")
            try:
                os.link(self.path, target)
            except FileExistsError:
                continue
            except OSError:
                # A filesystem without hard links: the unique name alone has to do.
                if os.path.lexists(target):
                    continue
                os.replace(self.path, target)
                return target
            os.unlink(self.path)
            fsync_dir(self.path.parent)
            return target
        raise CheckpointIOError(f"could not find a free quarantine name for {self.path} (tried {base}-1..999)")


class _Signal:
    """A one-shot `threading.Event` for the ticket's outcome, on a bare lock: an Event (a Condition and its lock) is
    ≈ 4 µs to make, set and wait, this ≈ 0.3 µs, once per checkpoint write."""

    __slots__ = ("_lock",)

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._lock.acquire()

    def set(self) -> None:
        with contextlib.suppress(RuntimeError):  # already set: setting again changes nothing, as Event.set
            self._lock.release()

    def wait(self) -> None:
        self._lock.acquire()
        with contextlib.suppress(RuntimeError):  # a second `set` in between released it already
            self._lock.release()  # set stays set for any later wait

    def is_set(self) -> bool:
        return not self._lock.locked()


@dataclass(eq=False)
class _Ticket(Generic[V]):
    change: Callable[[V], V]
    done: bool = False  # taken by a batch (under the locks)
    result: V | None = None
    error: Exception | None = None
    durable: _Signal = field(default_factory=_Signal)  # set once the outcome is final


def _identity(st: os.stat_result) -> tuple[int, int, int]:
    return (st.st_ino, st.st_size, st.st_mtime_ns)
