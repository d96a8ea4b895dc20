"""Group commit of atomic file writes (the CDI specs of concurrent prepares): writers queued behind a flush share
the next one, each file is complete and durable when its `write` returns, and a failure is its own writer's."""

from __future__ import annotations

import os
import stat
import threading
from pathlib import Path

import pytest

from dra_driver import fsutil
from tests.polling import wait_for


class FsyncLog:
    """Counts fsyncs of files and of directories; the first directory fsync can be held until released."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch, hold_first_dir_sync: bool = False) -> None:
        self.files = 0
        self.dirs = 0
        self.in_first_dir_sync = threading.Event()
        self.release = threading.Event()
        if not hold_first_dir_sync:
            self.release.set()
        self._lock = threading.Lock()
        real = os.fsync

        def spy(fd: int) -> None:
            directory = stat.S_ISDIR(os.fstat(fd).st_mode)
            with self._lock:
                if directory:
                    self.dirs += 1
                    first = self.dirs == 1
                else:
                    self.files += 1
                    first = False
            if first:
                self.in_first_dir_sync.set()
                assert self.release.wait(10)
            real(fd)

        monkeypatch.setattr(os, "fsync", spy)


def test_a_lone_write_is_complete_private_and_flushed(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    log = FsyncLog(monkeypatch)
    commit = fsutil.GroupCommit()
    commit.write(tmp_path / "a.json", b"{}", mode=0o644)
    assert (tmp_path / "a.json").read_bytes() == b"{}"
    assert stat.S_IMODE((tmp_path / "a.json").stat().st_mode) == 0o644
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.json"]  # no temp file left
    assert (log.files, log.dirs) == (1, 1)


def test_writers_queued_behind_a_flush_share_the_next_one(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    log = FsyncLog(monkeypatch, hold_first_dir_sync=True)
    commit = fsutil.GroupCommit()
    first = threading.Thread(target=commit.write, args=(tmp_path / "first.json", b"1"))
    first.start()
    assert log.in_first_dir_sync.wait(10)
    done: list[str] = []

    def write(i: int) -> None:
        commit.write(tmp_path / f"late-{i}.json", b"%d" % i)
        done.append(str(i))

    late = [threading.Thread(target=write, args=(i,)) for i in range(8)]
    for t in late:
        t.start()
    wait_for(lambda: len(commit._queue) == 8, what="every late writer queued behind the held flush")
    assert done == []  # nobody returns before a flush that covers its file
    log.release.set()
    for t in [first, *late]:
        t.join(10)
    assert sorted(done) == [str(i) for i in range(8)]
    # One flush for the first file, ONE more for the eight that queued behind it: every file fsynced on its own,
    # the directory once per flush (64 concurrent atomic_write calls would each flush the directory).
    assert (log.files, log.dirs) == (9, 2)
    for i in range(8):
        assert (tmp_path / f"late-{i}.json").read_bytes() == b"%d" % i


def test_a_failed_file_fails_only_its_own_writer(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    FsyncLog(monkeypatch)
    (tmp_path / "taken.json").mkdir()  # a directory where the file should go: its rename fails
    commit = fsutil.GroupCommit()
    with pytest.raises(IsADirectoryError):
        commit.write(tmp_path / "taken.json", b"x")
    commit.write(tmp_path / "fine.json", b"y")
    assert (tmp_path / "fine.json").read_bytes() == b"y"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["fine.json", "taken.json"]  # the failed temp is gone


def test_a_failing_directory_flush_fails_the_batch(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def failing(directory: Path) -> None:
        raise OSError(5, "Input/output error")

    monkeypatch.setattr(fsutil, "fsync_dir", failing)
    with pytest.raises(OSError, match="Input/output error"):
        fsutil.GroupCommit().write(tmp_path / "a.json", b"x")
