"""One publisher per node: the second plugin instance publishes only after the first lets go (or dies)."""

from __future__ import annotations

import subprocess
import sys
import threading
from pathlib import Path

from dra_driver.kubeletplugin.publishlease import LOCK_NAME, PublisherLease
from tests.polling import wait_for


def test_the_second_instance_takes_over_when_the_first_releases(tmp_path: Path) -> None:
    started: list[str] = []
    first = PublisherLease(tmp_path, lambda: started.append("first"), poll_interval=0.01)
    second = PublisherLease(tmp_path, lambda: started.append("second"), poll_interval=0.01)
    first.start()
    wait_for(first.held.is_set, 5, "the first lease")
    second.start()
    # Give the second one many chances to (wrongly) get the lock while the first holds it.
    assert not second.held.wait(0.3)
    assert started == ["first"]
    first.release()
    wait_for(second.held.is_set, 5, "the second lease after the first released")
    assert started == ["first", "second"]
    second.release()
    assert (tmp_path / LOCK_NAME).exists()


def test_a_killed_holder_process_releases_the_lease(tmp_path: Path) -> None:
    """SIGKILL of the old pod's process drops its flock: the survivor takes over."""
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import fcntl, os, sys, time\n"
            f"fd = os.open({str(tmp_path / LOCK_NAME)!r}, os.O_RDWR | os.O_CREAT, 0o600)\n"
            "fcntl.flock(fd, fcntl.LOCK_EX)\n"
            "print('locked', flush=True)\n"
            "time.sleep(60)\n",
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "locked"
        acquired = threading.Event()
        lease = PublisherLease(tmp_path, acquired.set, poll_interval=0.01)
        lease.start()
        assert not acquired.wait(0.3)
        holder.kill()
        holder.wait(10)
        wait_for(acquired.is_set, 5, "the lease after the holder was killed")
        lease.release()
    finally:
        if holder.poll() is None:
            holder.kill()
            holder.wait(10)


def test_release_before_acquiring_stops_waiting(tmp_path: Path) -> None:
    blocker = PublisherLease(tmp_path, lambda: None, poll_interval=0.01)
    blocker.start()
    wait_for(blocker.held.is_set, 5, "the blocking lease")
    def must_not_start() -> None:
        raise AssertionError("a lease that was released while waiting must not start publishing")

    waiting = PublisherLease(tmp_path, must_not_start)
    waiting.start()
    waiting.release()  # returns although the lock was never ours
    assert not waiting.held.is_set()
    blocker.release()
