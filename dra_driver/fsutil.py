"""Durable file replacement, shared by every writer of state (checkpoint, CDI specs, fake NVML state).

Temp files are named `.<target name>.<8 random lower-case hex>.tmp` in the target's directory: hidden and
`.tmp`-suffixed so spec-dir scanners skip them, and recognisable so a crash leftover can be swept for exactly
one target name (`temp_file_pattern`) without touching anybody else's files.

File and directory names made from API names (namespaces, claim and request names, node names, UIDs) go through
`bounded_name`: Kubernetes accepts names that together pass the kernel's 255-byte limit on one path component
(a namespace of 63 and a claim name of 253), so a name that does not fit is shortened with a hash of the whole
(docs/kubelet-plugin.md "File names from API names").
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import os
import re
import secrets
import stat
import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TypeAlias

# What the durable-write functions take for a path: the hot paths (checkpoint, claim and metadata specs) pass plain
# strings, built once per claim, where a `Path` per step (joins, `parent`, `__fspath__`) was ≈ 6 % of a claim's CPU
# in the profile; other callers keep passing `Path`.
StrPath: TypeAlias = "str | os.PathLike[str]"

TEMP_SUFFIX = ".tmp"
# `[a-z0-9_]{8}` rather than hex only: files left by older versions (tempfile.mkstemp names) match as well.
_TEMP_RANDOM = r"[a-z0-9_]{8}"

NAME_MAX = 255  # bytes in one path component (Linux NAME_MAX; ext4, xfs, btrfs, tmpfs, overlayfs)
PATH_MAX = 4096  # bytes in a whole path, with its terminating NUL (Linux PATH_MAX)
# What a temp file of `atomic_write` adds to its target's name: "." + name + "." + 8 random + ".tmp".
TEMP_NAME_EXTRA = 1 + 1 + 8 + len(TEMP_SUFFIX)
# The longest name a file written with `atomic_write` (or `GroupCommit`) may have: its temp file must fit too.
ATOMIC_NAME_MAX = NAME_MAX - TEMP_NAME_EXTRA
HASH_SEPARATOR = "_"  # never in a Kubernetes name or UID: a shortened name is never another's whole name
HASH_CHARS = 16  # 64 bits of SHA-256, lower-case hex
BOUNDED_NAME_MIN = 1 + len(HASH_SEPARATOR) + HASH_CHARS  # the least room a shortened name needs


def bounded_name(name: str, limit: int = NAME_MAX) -> str:
    """`name` itself when it fits in `limit` bytes (UTF-8); else its longest prefix that leaves room for
    `_<hash>`, the first 16 hex digits of the SHA-256 of the whole name: at most `limit` bytes, the same for the
    same name in every process and version, and readable as far as it fits.

    The one rule for file and directory names made from API names (docs/kubelet-plugin.md "File names from API
    names"). A name that fits keeps the name earlier versions gave it, so files they wrote are found under it.
    `name` must not contain '_' (no Kubernetes name or UID does): a shortened name, which does, then never equals
    a name kept whole, and two shortened names differ unless their whole names collide in 64 bits of SHA-256."""
    if HASH_SEPARATOR in name:
        raise ValueError(f"bounded_name: {name[:80]!r} contains {HASH_SEPARATOR!r}, which marks a shortened name")
    if limit < BOUNDED_NAME_MIN:
        raise ValueError(f"bounded_name: {limit} bytes leave no room for a shortened name (needs {BOUNDED_NAME_MIN})")
    raw = name.encode()
    if len(raw) <= limit:
        return name
    digest = hashlib.sha256(raw).hexdigest()[:HASH_CHARS]
    # A prefix cut inside a multi-byte character loses that character (errors="ignore"), never produces a bad one.
    prefix = raw[: limit - len(HASH_SEPARATOR) - HASH_CHARS].decode(errors="ignore")
    return f"{prefix}{HASH_SEPARATOR}{digest}"


class _DirSync:
    """Group commit for directory fsyncs: callers that renamed into one directory share a flush. A change (a
    rename, or an `fsync_dir` call) takes a ticket once it is done; a flush that starts after the ticket was handed
    out covers it. `issued` and `flushed` change under `_dir_syncs_lock` only."""

    __slots__ = ("flush_lock", "flushed", "issued")

    def __init__(self) -> None:
        self.flush_lock = threading.Lock()
        self.issued = 0  # tickets handed out: changes done in the directory (and fsync_dir calls)
        self.flushed = 0  # the highest ticket a completed flush covers


# The states of the directories that have a change not yet known to be durable (a ticket above `flushed`), by
# absolute path; a state is dropped by the flush that leaves nothing pending, so the map holds only directories in
# use (an MPS daemon's or a ComputeDomain daemon's directory, one per claim or domain, used to keep one state each
# forever). Looking a state up and taking a ticket on it happen under `_dir_syncs_lock` together: a ticket is then
# never taken on a state already dropped, where the next `sync_deferred` (finding a new, empty state) would miss it.
_dir_syncs: dict[str, _DirSync] = {}
_dir_syncs_lock = threading.Lock()


def _dir_key(directory: StrPath) -> str:
    # One state per directory however it is spelled (`cdi` and `/abs/cdi`): a flush through one name covers the
    # changes noted through the other. abspath is string work for an absolute path (no syscall, ≈ 1 µs).
    return os.path.abspath(directory)


def _ticket(key: str) -> tuple[_DirSync, int]:
    with _dir_syncs_lock:
        state = _dir_syncs.get(key)
        if state is None:
            state = _dir_syncs[key] = _DirSync()
        state.issued += 1
        return state, state.issued


def fsync_dir(directory: StrPath) -> None:
    """Make the renames and unlinks done in `directory` so far durable. Concurrent callers for one directory
    share one fsync (a flush started after this call began covers it)."""
    key = _dir_key(directory)
    state, ticket = _ticket(key)
    _flush_dir(directory, key, state, ticket)


def defer_dir_sync(directory: StrPath) -> None:
    """Note a rename just done in `directory` whose directory entry the caller does not fsync now: the next
    `fsync_dir` of the directory (anybody's) or `sync_deferred` makes it durable. A caller that must answer only
    once the rename is durable calls `sync_deferred` before answering (the GPU plugin's claim CDI specs share the
    CDI dir's fsync with the device metadata spec written after them: docs/architecture.md "Durable files")."""
    _ticket(_dir_key(directory))


def sync_deferred(directory: StrPath) -> None:
    """Make every rename noted with `defer_dir_sync` in `directory` so far durable: no syscall where a flush that
    started after the last of them (an `fsync_dir` of another writer) already covers them. Raises the fsync's
    OSError (the changes then stay pending for the next call)."""
    key = _dir_key(directory)
    with _dir_syncs_lock:
        state = _dir_syncs.get(key)
        if state is None or state.flushed >= state.issued:
            return  # no state: nothing pending in the directory
        ticket = state.issued
    _flush_dir(directory, key, state, ticket)


def _flush_dir(directory: StrPath, key: str, state: _DirSync, ticket: int) -> None:
    with state.flush_lock:
        # `flushed` only grows, and only under `flush_lock`, which this thread holds.
        if state.flushed >= ticket:
            return
        with _dir_syncs_lock:
            covers = state.issued
        _fsync_dir_now(directory)
        with _dir_syncs_lock:
            state.flushed = covers
            # Nothing pending: drop the state. A caller still holding it (waiting on `flush_lock` with a ticket
            # this flush covered) only reads `flushed`; the next change makes a new state.
            if state.issued == covers and _dir_syncs.get(key) is state:
                del _dir_syncs[key]


def _fsync_dir_now(directory: StrPath) -> None:
    fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def temp_file_pattern(target_name_regex: str) -> re.Pattern[str]:
    """The names `atomic_write` gives its temp files for targets whose names match `target_name_regex`."""
    return re.compile(rf"\.(?:{target_name_regex})\.{_TEMP_RANDOM}{re.escape(TEMP_SUFFIX)}")


def _create_temp(head: str, target_name: str) -> tuple[int, str]:
    """`head`: the target's directory with its trailing "/" ("" for the current directory)."""
    while True:
        candidate = f"{head}.{target_name}.{secrets.token_hex(4)}{TEMP_SUFFIX}"
        try:
            return os.open(candidate, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600), candidate
        except FileExistsError:
            continue


def atomic_write(path: StrPath, data: bytes, mode: int = 0o600) -> None:
    """Replace `path` so that readers see the old file or the whole new one, never a mix, and the new one
    survives a crash: temp file in the same directory, fsync, rename, fsync the directory."""
    target = os.fspath(path)
    rename_into_place(write_temp_file(target, data, mode), target)
    fsync_dir(parent_dir(target))


def parent_dir(path: str) -> str:
    """The directory of the file `path` names, as a string (`Path(path).parent` without a Path): "." for a bare
    name."""
    return os.path.dirname(path) or "."


def rename_into_place(tmp: StrPath, path: StrPath) -> None:
    """Rename the temp file of `write_temp` to `path` (not yet durable: the caller fsyncs the directory); a
    rename that fails removes the temp file."""
    try:
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise


@dataclass
class _Pending:
    path: str
    tmp: str  # the durable temp file to rename to `path`
    done: bool = False  # set by the flush that took it, with `error` unless the rename is durable
    error: BaseException | None = None


class GroupCommit:
    """Group commit for atomic file replacements (the per-claim CDI specs of concurrent prepares).

    Each writer writes and fsyncs its own temp file, in its own thread: the fsyncs of concurrent writers run
    side by side and the filesystem commits them together (one thread fsyncing every file in turn was 1.6-2x
    slower for 16-64 files). Then the renames are grouped: whoever gets the flush lock renames every temp file
    queued so far and fsyncs their directory ONCE, while later writers queue for the next flush. Every file is
    as durable when `write` returns as with `atomic_write`, and readers see the old file or the whole new one."""

    def __init__(self) -> None:
        self._queue: list[_Pending] = []
        self._queue_lock = threading.Lock()
        self._flush_lock = threading.Lock()

    def write(self, path: StrPath, data: bytes, mode: int = 0o600) -> None:
        """Replace `path` with `data` durably (raises the OSError of this file's write, rename or flush)."""
        target = os.fspath(path)
        entry = _Pending(target, write_temp_file(target, data, mode))
        with self._queue_lock:
            self._queue.append(entry)
        with self._flush_lock:
            if not entry.done:
                with self._queue_lock:
                    batch, self._queue = self._queue, []
                _flush(batch)
        if entry.error is not None:
            raise entry.error


def _flush(batch: list[_Pending]) -> None:
    """Rename every temp file of the batch into place, then fsync each directory involved once."""
    renamed: list[_Pending] = []
    try:
        for entry in batch:
            try:
                rename_into_place(entry.tmp, entry.path)
            except OSError as exc:
                entry.error = exc
                continue
            renamed.append(entry)
        for directory in sorted({parent_dir(entry.path) for entry in renamed}):
            try:
                fsync_dir(directory)
            except OSError as exc:
                for entry in renamed:
                    if parent_dir(entry.path) == directory:
                        entry.error = exc
        for entry in renamed:
            entry.done = True
    finally:
        for entry in batch:
            if not entry.done and entry.error is None:
                # The flush was interrupted (e.g. KeyboardInterrupt) before this file was known to be durable.
                entry.error = OSError(f"writing {entry.path} was interrupted")
            entry.done = True


def write_temp(path: Path, data: bytes, mode: int = 0o600) -> Path:
    """A durable (fsynced) temp file beside `path` holding `data`, named as `atomic_write` names its temp files
    (removed again if anything fails): the first half of an atomic replacement, for writers that rename it
    themselves."""
    return Path(write_temp_file(os.fspath(path), data, mode))


def write_temp_file(path: str, data: bytes, mode: int = 0o600, *, durable: bool = True) -> str:
    """`write_temp` for a path given and returned as a string (the per-claim writers'); `durable=False` leaves the
    fsync out, for a file its writer verifies and rewrites on every use (device metadata)."""
    directory, sep, name = path.rpartition("/")
    fd, tmp = _create_temp(directory + sep, name)
    try:
        try:
            # Straight to the descriptor: a buffered file object around it costs more than the write itself.
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view) :]
            os.fchmod(fd, mode)
            if durable:
                os.fsync(fd)
        finally:
            os.close(fd)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise
    return tmp


def sweep_temp_files(directory: Path, is_ours: Callable[[str], bool]) -> list[Path]:
    """Delete the regular files in `directory` whose names `is_ours` accepts (crash leftovers of
    `atomic_write`); anything else with such a name (a directory, a symlink) is left alone. Only call this
    while no other writer can be working in `directory`. Returns what was deleted."""
    removed: list[Path] = []
    try:
        entries = list(os.scandir(directory))
    except FileNotFoundError:
        return removed
    for entry in entries:
        if not is_ours(entry.name):
            continue
        path = Path(entry.path)
        try:
            if not stat.S_ISREG(path.lstat().st_mode):
                continue
            path.unlink()
        except FileNotFoundError:
            continue
        removed.append(path)
    if removed:
        fsync_dir(directory)
    return removed


def explain_os_error(exc: OSError, path: Path, action: str, directory_hint: str) -> str:
    """One sentence for a failed file operation: the path, what the system said and what to do about it.
    `directory_hint` names the directory's role, e.g. "the plugin dir (--plugin-dir)"."""
    reason = exc.strerror or str(exc)
    if isinstance(exc, IsADirectoryError):
        return (
            f"{action} {path} failed: it is a directory, not a file; move it out of the way "
            f"(nothing but this plugin should create {path.name} in {directory_hint})"
        )
    if isinstance(exc, NotADirectoryError):
        return f"{action} {path} failed: a path component is not a directory; {directory_hint} must be a directory"
    if exc.errno in (errno.EROFS, errno.EACCES, errno.EPERM):
        return (
            f"{action} {path} failed: {reason}; {directory_hint} must be writable by the plugin "
            "(check the hostPath mount, its read-only flag and its permissions)"
        )
    if exc.errno in (errno.ENOSPC, errno.EDQUOT):
        return f"{action} {path} failed: {reason}; free space on the filesystem that holds {directory_hint}"
    if exc.errno == errno.ENAMETOOLONG:
        longest = max((len(part.encode()) for part in path.parts), default=0)
        return (
            f"{action} {path} failed: {reason} (the path is {len(str(path).encode())} bytes, its longest component "
            f"{longest}; the limits are {PATH_MAX - 1} and {NAME_MAX}); choose a shorter path for {directory_hint}"
        )
    return f"{action} {path} failed: {reason}"
