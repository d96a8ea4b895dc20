"""The plugin's directories: exact modes whatever the umask, clear errors for unusable paths, one instance."""

from __future__ import annotations

import os
import stat
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from dra_driver.kubeletplugin.statedirs import (
    KeyedLocks,
    NodeStateBusyError,
    OperationLock,
    StateDirError,
    prepare_cdi_root,
    prepare_plugin_dir,
)
from tests.plugin.readonly import read_only
from tests.polling import wait_for


@contextmanager
def _umask(mask: int) -> Iterator[None]:
    old = os.umask(mask)
    try:
        yield
    finally:
        os.umask(old)


def _mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


@pytest.mark.parametrize("mask", [0o000, 0o002, 0o022, 0o077])
def test_plugin_dir_is_exactly_0750_whatever_the_umask(tmp_path: Path, mask: int) -> None:
    """Issue 12 finding 6: the docs promise 0750; mkdir's mode alone is filtered by the umask."""
    with _umask(mask):
        prepare_plugin_dir(tmp_path / "plugins" / "gpu.dra.dev")
        prepare_cdi_root(tmp_path / "cdi")
    assert _mode(tmp_path / "plugins" / "gpu.dra.dev") == 0o750
    assert _mode(tmp_path / "cdi") == 0o755


def test_an_existing_plugin_dir_is_tightened_and_a_shared_cdi_dir_left_as_it_is(tmp_path: Path) -> None:
    plugin_dir, cdi = tmp_path / "p", tmp_path / "cdi"
    plugin_dir.mkdir()
    cdi.mkdir()
    os.chmod(plugin_dir, 0o777)
    os.chmod(cdi, 0o775)
    prepare_plugin_dir(plugin_dir)
    prepare_cdi_root(cdi)
    assert (_mode(plugin_dir), _mode(cdi)) == (0o750, 0o775)


@pytest.mark.parametrize("name", ["checkpoint.json", "checkpoint.json.lock", "plugin.lock"])
def test_a_directory_where_a_state_file_belongs_is_a_clear_startup_error(tmp_path: Path, name: str) -> None:
    (tmp_path / name).mkdir()
    with pytest.raises(StateDirError) as info:
        prepare_plugin_dir(tmp_path)
    message = str(info.value)
    assert str(tmp_path / name) in message and "is a directory" in message and "Move it out of the way" in message
    assert (tmp_path / name).is_dir()


def test_a_file_where_the_plugin_dir_belongs_is_a_clear_startup_error(tmp_path: Path) -> None:
    (tmp_path / "p").write_text("x")
    with pytest.raises(StateDirError, match="exists but is not a directory"):
        prepare_plugin_dir(tmp_path / "p")


def test_read_only_dirs_are_clear_startup_errors(tmp_path: Path) -> None:
    plugin_dir, cdi = tmp_path / "p", tmp_path / "cdi"
    plugin_dir.mkdir(mode=0o750)
    cdi.mkdir()
    with read_only(plugin_dir), pytest.raises(StateDirError) as info:
        prepare_plugin_dir(plugin_dir)
    assert str(plugin_dir) in str(info.value) and "(--plugin-dir) must be writable" in str(info.value)
    with read_only(cdi), pytest.raises(StateDirError) as info:
        prepare_cdi_root(cdi)
    assert str(cdi) in str(info.value) and "(--cdi-root) must be writable" in str(info.value)
    assert sorted(p.name for p in (*plugin_dir.iterdir(), *cdi.iterdir())) == []  # no probe left behind


def _busy(enter: Any) -> str:
    with pytest.raises(NodeStateBusyError) as info, enter:
        pass
    return str(info.value)


def test_claim_operations_share_the_node_and_recovery_excludes_them(tmp_path: Path) -> None:
    """Three OperationLock objects are three open files, i.e. three plugin instances as flock sees them."""
    old, new, third = (OperationLock(tmp_path / "plugin.lock") for _ in range(3))
    try:
        with old.shared(timeout=1), new.shared(timeout=1):  # two instances serve side by side
            assert "holds" in _busy(third.exclusive(timeout=0.1)) and "plugin.lock" in _busy(
                third.exclusive(timeout=0.1)
            )
        with third.exclusive(timeout=1):
            assert "holds" in _busy(old.shared(timeout=0.1))
            assert "recovering the node's claim state" in _busy(third.shared(timeout=0.1))
        with old.shared(timeout=1):  # free again
            pass
    finally:
        for lock in (old, new, third):
            lock.close()


def test_recovery_waits_for_the_readers_of_its_own_process(tmp_path: Path) -> None:
    lock = OperationLock(tmp_path / "plugin.lock")
    entered, release = threading.Event(), threading.Event()

    def claim() -> None:
        with lock.shared(timeout=1):
            entered.set()
            release.wait(10)

    worker = threading.Thread(target=claim)
    worker.start()
    assert entered.wait(5)
    with pytest.raises(NodeStateBusyError, match="did not finish in time"), lock.exclusive(timeout=0.1):
        pass
    release.set()
    worker.join(5)
    with lock.exclusive(timeout=1):
        pass
    lock.close()


class Busy(Exception):
    pass


def test_keyed_locks_serialise_one_key_let_others_through_and_forget_idle_keys() -> None:
    locks = KeyedLocks(busy=lambda key: Busy(f"{key} is busy"))
    inside, release = threading.Event(), threading.Event()
    order: list[str] = []

    def first() -> None:
        with locks.hold(["claim-a"], timeout=5):
            inside.set()
            release.wait(10)
            order.append("first")

    def second() -> None:
        with locks.hold(["claim-a"], timeout=5):
            order.append("second")

    one, two = threading.Thread(target=first), threading.Thread(target=second)
    one.start()
    assert inside.wait(5)
    two.start()
    with locks.hold(["claim-b"], timeout=0.1):  # another key is not held up
        pass
    with pytest.raises(Busy, match="claim-a is busy"), locks.hold(["claim-b", "claim-a"], timeout=0.1):
        pass
    wait_for(lambda: locks._locks["claim-a"][1] == 2 or None, what="the second caller waiting on claim-a")
    release.set()
    one.join(5)
    two.join(5)
    assert order == ["first", "second"]
    assert locks._locks == {}  # UIDs that came and went leave nothing behind
    with locks.hold(["claim-b"], timeout=0.1):  # the timed-out caller released what it had taken
        pass
