"""Directory fsyncs are shared between concurrent callers, never skipped for a caller that comes later; a rename
whose directory fsync is deferred is covered by the next flush that starts after it, and only by such a flush."""

from __future__ import annotations

import errno
import os
import threading
from collections.abc import Callable
from pathlib import Path

import pytest

from dra_driver import fsutil
from tests.polling import wait_for


def test_each_sequential_call_flushes(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[int] = []
    real = os.fsync

    def counting(fd: int) -> None:
        calls.append(fd)
        real(fd)

    monkeypatch.setattr(os, "fsync", counting)
    for _ in range(3):
        fsutil.fsync_dir(tmp_path)
    assert len(calls) == 3


def _first_flush_held(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> tuple[threading.Thread, threading.Event, list[int]]:
    """A flush of `tmp_path` started on a thread and held inside its fsync until the returned event is set; the
    list records every fsync."""
    entered, release = threading.Event(), threading.Event()
    flushes: list[int] = []
    real = os.fsync

    def slow_fsync(fd: int) -> None:
        flushes.append(fd)
        if len(flushes) == 1:
            entered.set()
            assert release.wait(10)
        real(fd)

    monkeypatch.setattr(os, "fsync", slow_fsync)
    first = threading.Thread(target=fsutil.fsync_dir, args=(tmp_path,))
    first.start()
    assert entered.wait(10)
    return first, release, flushes


def test_concurrent_callers_share_a_flush_started_after_them(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    first, release, flushes = _first_flush_held(tmp_path, monkeypatch)
    # These callers arrive while the first flush is in flight: it may not cover their renames, so exactly one more
    # flush (started after they arrived) serves all of them.
    late = [threading.Thread(target=fsutil.fsync_dir, args=(tmp_path,)) for _ in range(8)]
    for t in late:
        t.start()
    state = fsutil._dir_syncs[os.fspath(tmp_path)]
    wait_for(lambda: state.issued == 9, what="every late caller has its ticket")
    release.set()
    for t in [first, *late]:
        t.join(10)
    assert len(flushes) == 2


class FsyncCount:
    """Counts fsyncs; `fail` makes the next one raise EIO instead."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.calls = 0
        self.fail = False
        real = os.fsync

        def counting(fd: int) -> None:
            if self.fail:
                self.fail = False
                raise OSError(errno.EIO, "I/O error")
            self.calls += 1
            real(fd)

        monkeypatch.setattr(os, "fsync", counting)


def _rename_into(directory: Path, name: str) -> None:
    (directory / f".{name}.tmp").write_bytes(b"x")
    os.replace(directory / f".{name}.tmp", directory / name)


def test_a_deferred_rename_is_flushed_once_by_sync_deferred(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    count = FsyncCount(monkeypatch)
    fsutil.sync_deferred(tmp_path)
    assert count.calls == 0  # nothing noted: nothing to flush
    _rename_into(tmp_path, "a")
    fsutil.defer_dir_sync(tmp_path)
    assert count.calls == 0
    fsutil.sync_deferred(tmp_path)
    assert count.calls == 1
    fsutil.sync_deferred(tmp_path)
    assert count.calls == 1  # covered already: no second fsync


def test_another_writers_fsync_dir_after_the_rename_covers_it(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The claim spec (deferred) and the device metadata spec (fsync_dir) share one flush of the CDI dir, whichever
    name each writer spells the directory with."""
    count = FsyncCount(monkeypatch)
    monkeypatch.chdir(tmp_path.parent)
    _rename_into(tmp_path, "claim.json")
    fsutil.defer_dir_sync(Path(tmp_path.name))  # relative
    _rename_into(tmp_path, "metadata.json")
    fsutil.fsync_dir(tmp_path)  # absolute
    assert count.calls == 1
    fsutil.sync_deferred(tmp_path)
    assert count.calls == 1


def test_a_flush_started_before_a_deferred_rename_does_not_cover_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    first, release, flushes = _first_flush_held(tmp_path, monkeypatch)
    _rename_into(tmp_path, "late.json")  # while the first flush is in its fsync
    fsutil.defer_dir_sync(tmp_path)
    release.set()
    first.join(10)
    assert len(flushes) == 1
    fsutil.sync_deferred(tmp_path)
    assert len(flushes) == 2


@pytest.mark.parametrize("flush", [fsutil.sync_deferred, fsutil.fsync_dir])
def test_a_failed_flush_leaves_the_rename_pending(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, flush: Callable[[Path], None]
) -> None:
    """Whichever flush fails, the rename stays pending (its directory's state kept) and the retry flushes it."""
    count = FsyncCount(monkeypatch)
    _rename_into(tmp_path, "a")
    fsutil.defer_dir_sync(tmp_path)
    count.fail = True
    with pytest.raises(OSError, match="I/O error"):
        flush(tmp_path)
    assert os.fspath(tmp_path) in fsutil._dir_syncs
    fsutil.sync_deferred(tmp_path)  # the retry flushes
    assert count.calls == 1
    assert os.fspath(tmp_path) not in fsutil._dir_syncs


def test_no_state_outlives_its_directory_s_pending_changes(tmp_path: Path) -> None:
    """Writers into directories that come and go (an MPS daemon's, a ComputeDomain daemon's, one per claim or
    domain) leave no group-commit state behind once their changes are durable, whichever way they synced; a
    deferred rename keeps its directory's state until a flush covers it."""
    before = len(fsutil._dir_syncs)
    for i in range(200):
        directory = tmp_path / f"d{i}"
        directory.mkdir()
        fsutil.atomic_write(directory / "file", b"x")  # fsync_dir
        _rename_into(directory, "deferred")
        fsutil.defer_dir_sync(directory)
        assert os.fspath(directory) in fsutil._dir_syncs  # pending: kept for the flush that must cover it
        if i % 2:
            fsutil.sync_deferred(directory)
        else:
            fsutil.fsync_dir(Path(os.path.relpath(directory)))  # another spelling's flush covers it
        fsutil.GroupCommit().write(directory / "grouped", b"y")
    assert len(fsutil._dir_syncs) == before


def test_a_dropped_state_does_not_hide_a_later_deferred_rename(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """After the flush that drops a directory's state, a rename noted in it is pending again: sync_deferred
    flushes it (it does not read a fresh, empty state as nothing to do)."""
    count = FsyncCount(monkeypatch)
    fsutil.fsync_dir(tmp_path)
    assert os.fspath(tmp_path) not in fsutil._dir_syncs
    _rename_into(tmp_path, "late")
    fsutil.defer_dir_sync(tmp_path)
    fsutil.sync_deferred(tmp_path)
    assert count.calls == 2
