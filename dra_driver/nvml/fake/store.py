"""Where a fake node's runtime state lives: in memory, or in a state file shared between processes.

A store hands out snapshots and applies a pure update function under its locks. The file store
re-reads the file before every operation (another process may have changed it) and holds an
fcntl lock on a sidecar `<state>.lock` across each read-modify-write.
"""

from __future__ import annotations

import fcntl
import os
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Protocol, TypeVar

from dra_driver.nvml.fake.state import (
    FakeNodeState,
    FakeStateError,
    decode_state,
    state_matches,
    write_state_file,
)

T = TypeVar("T")
Update = Callable[[FakeNodeState], tuple[FakeNodeState, T]]


class StateStore(Protocol):
    def snapshot(self) -> FakeNodeState: ...

    def update(self, change: Update[T]) -> T:
        """Apply `change` atomically; the new state is kept only when `change` returns normally."""


class MemoryStore:
    def __init__(self, initial: FakeNodeState) -> None:
        self._state = initial
        self._lock = threading.Lock()

    def snapshot(self) -> FakeNodeState:
        with self._lock:
            return self._state

    def update(self, change: Update[T]) -> T:
        with self._lock:
            new, result = change(self._state)
            self._state = new
            return result


class FileStore:
    """State in a JSON file, created from `initial` when missing.

    Different processes serialise on the lock file; threads of this process also take a thread lock
    because fcntl locks belong to the process and would not exclude them.
    """

    def __init__(self, path: Path, initial: FakeNodeState) -> None:
        self.path = path
        self._initial = initial
        self._uuids = tuple(g.uuid for g in initial.gpus)
        self._lock_path = path.with_name(path.name + ".lock")
        self._thread_lock = threading.Lock()
        self._cache: tuple[bytes, FakeNodeState] | None = None  # file bytes -> parsed state

    def open(self) -> None:
        """Create the file if missing, else check it belongs to this node. Raises FakeStateError."""
        with self._locked():
            self._load_or_create()

    def snapshot(self) -> FakeNodeState:
        with self._locked():
            return self._load_or_create()

    def update(self, change: Update[T]) -> T:
        with self._locked():
            old = self._load_or_create()
            new, result = change(old)
            if new != old:
                self._write(new)
            return result

    @contextmanager
    def _locked(self) -> Iterator[None]:
        with self._thread_lock:
            try:
                self.path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
                fd = os.open(self._lock_path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
            except OSError as exc:
                raise FakeStateError(
                    f"fake NVML state file {self.path}: cannot open lock file: {exc.strerror}"
                ) from None
            try:
                fcntl.flock(fd, fcntl.LOCK_EX)
                yield
            finally:
                os.close(fd)  # closing drops the flock

    def _load_or_create(self) -> FakeNodeState:
        try:
            data = self.path.read_bytes()
        except FileNotFoundError:
            self._write(self._initial)
            return self._initial
        except OSError as exc:
            raise FakeStateError(f"fake NVML state file {self.path}: cannot read: {exc.strerror}") from None
        # Re-read every time (another process may have written); parse only when the bytes changed.
        # Comparing bytes, not stat fields, because a recycled inode within one mtime tick fools stat.
        if self._cache is not None and self._cache[0] == data:
            return self._cache[1]
        state = decode_state(data, self.path)
        if not state_matches(state, self._uuids):
            raise FakeStateError(
                f"fake NVML state file {self.path} belongs to another node (node {state.node!r}, "
                f"{len(state.gpus)} GPUs with different UUIDs); delete it or choose another state= path"
            )
        self._cache = (data, state)
        return state

    def _write(self, state: FakeNodeState) -> None:
        try:
            data = write_state_file(self.path, state)
        except OSError as exc:
            raise FakeStateError(f"fake NVML state file {self.path}: cannot write: {exc.strerror}") from None
        self._cache = (data, state)
