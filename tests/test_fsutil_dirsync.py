"""Directory fsyncs are shared between concurrent callers, never skipped for a caller that comes later."""

from __future__ import annotations

import os
import threading
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


def test_concurrent_callers_share_a_flush_started_after_them(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    entered = threading.Event()
    release = threading.Event()
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
