"""The plugin watcher on real directories and real unix sockets (inotify and polling)."""

from __future__ import annotations

import os
import shutil
import socket
import stat
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from dra_sandbox.kubelet.inotify import EVENT_HEADER, IN_CREATE, IN_ISDIR, parse_events
from dra_sandbox.kubelet.watcher import PluginWatcher
from tests.polling import wait_for
from tests.sandbox.test_kubelet_fakeplugin import short_tmpdir


class Recorder:
    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.events: list[tuple[str, str]] = []

    def added(self, path: str) -> None:
        with self.lock:
            self.events.append(("added", path))

    def removed(self, path: str) -> None:
        with self.lock:
            self.events.append(("removed", path))

    def snapshot(self) -> list[tuple[str, str]]:
        with self.lock:
            return list(self.events)


def make_socket(path: Path) -> socket.socket:
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.bind(str(path))
    return sock


@pytest.fixture
def base() -> Iterator[Path]:
    path = short_tmpdir()
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture(params=["inotify", "polling"])
def mode(request: pytest.FixtureRequest) -> str:
    return str(request.param)


def test_watcher_lifecycle(base: Path, mode: str) -> None:
    registry = base / "plugins_registry"
    rec = Recorder()
    # Created by the watcher with 0755 (as the kubelet does).
    watcher = PluginWatcher(registry, rec.added, rec.removed, use_inotify=mode == "inotify", poll_interval_s=0.05)
    old_umask = os.umask(0o022)
    try:
        watcher.start()
    finally:
        os.umask(old_umask)
    sockets: list[socket.socket] = []
    try:
        assert watcher.mode == mode
        assert stat.S_IMODE(registry.stat().st_mode) == 0o755
        a = registry / "a-reg.sock"
        sockets.append(make_socket(a))
        wait_for(lambda: ("added", str(a)) in rec.snapshot(), what="socket a added")
        # Dot-names and plain files are ignored.
        sockets.append(make_socket(registry / ".hidden-reg.sock"))
        (registry / "notes.txt").write_text("x")
        # Subdirectories are watched too (including sockets created right after the directory).
        sub = registry / "sub"
        sub.mkdir()
        b = sub / "b-reg.sock"
        sockets.append(make_socket(b))
        wait_for(lambda: ("added", str(b)) in rec.snapshot(), what="socket in subdirectory added")
        a.unlink()
        wait_for(lambda: ("removed", str(a)) in rec.snapshot(), what="socket a removed")
        shutil.rmtree(sub)
        wait_for(lambda: ("removed", str(b)) in rec.snapshot(), what="subdirectory socket removed")
        events = rec.snapshot()
        assert all(".hidden" not in p and "notes" not in p for _, p in events)
        assert events == [("added", str(a)), ("added", str(b)), ("removed", str(a)), ("removed", str(b))]
    finally:
        watcher.stop()
        for s in sockets:
            s.close()


def test_existing_sockets_are_found_at_start(base: Path, mode: str) -> None:
    registry = base / "reg"
    (registry / "nested").mkdir(parents=True)
    socks = [make_socket(registry / "x-reg.sock"), make_socket(registry / "nested" / "y-reg.sock"),
             make_socket(registry / ".z-reg.sock")]
    rec = Recorder()
    watcher = PluginWatcher(registry, rec.added, rec.removed, use_inotify=mode == "inotify", poll_interval_s=0.05)
    watcher.start()
    try:
        assert sorted(p for _, p in rec.snapshot()) == sorted(
            [str(registry / "nested" / "y-reg.sock"), str(registry / "x-reg.sock")]
        )
    finally:
        watcher.stop()
        for s in socks:
            s.close()


def test_parse_inotify_events() -> None:
    name = b"dra-reg.sock\0\0\0\0"
    buf = EVENT_HEADER.pack(3, IN_CREATE, 0, len(name)) + name + EVENT_HEADER.pack(4, IN_CREATE | IN_ISDIR, 0, 0)
    events = parse_events(buf)
    assert [(e.wd, e.name, e.is_dir) for e in events] == [(3, "dra-reg.sock", False), (4, "", True)]
