"""One real node per machine: the lock a real node holds from start to stop (dra_sandbox/upstream/machinelock.py)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from dra_sandbox.upstream.machinelock import MachineBusyError, MachineLock

# A second process holding the lock as another session's real node would; it says so, then waits for its stdin.
HOLDER = """
import sys
from pathlib import Path
from dra_sandbox.upstream.machinelock import MachineLock
lock = MachineLock(Path(sys.argv[1]), "node-other")
lock.acquire(timeout=5)
print("held", flush=True)
sys.stdin.readline()
"""


def _holder(path: Path) -> subprocess.Popen[str]:
    proc = subprocess.Popen([sys.executable, "-c", HOLDER, str(path)], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None
    assert proc.stdout.readline().strip() == "held"
    return proc


def test_a_second_node_waits_then_fails_naming_the_holder(tmp_path: Path) -> None:
    path = tmp_path / "run" / "real-node.lock"
    holder = _holder(path)
    try:
        lock = MachineLock(path, "node-mine")
        with pytest.raises(MachineBusyError) as failed:
            lock.acquire(timeout=0.3, interval=0.05)
        message = str(failed.value)
        assert f"pid {holder.pid}, node node-other" in message
        assert "/var/lib/kubelet/device-plugins/kubelet.sock" in message
        assert not lock.held
    finally:
        holder.kill()
        holder.wait()
    # The kernel dropped the killed holder's lock: the next node takes it and writes itself in.
    lock.acquire(timeout=5)
    try:
        assert lock.held
        assert path.read_text().startswith("pid ")
        assert "node node-mine" in path.read_text()
    finally:
        lock.release()
    assert not lock.held
    assert path.read_text() == ""


def test_the_lock_is_free_again_once_released_and_waiters_get_it(tmp_path: Path) -> None:
    path = tmp_path / "real-node.lock"
    first = MachineLock(path, "node-a")
    first.acquire(timeout=1)
    second = MachineLock(path, "node-b")  # another open file: flock excludes it even in this process
    with pytest.raises(MachineBusyError):
        second.acquire(timeout=0.1, interval=0.02)
    first.release()
    first.release()  # a second release (stop after a failed start) does nothing
    second.acquire(timeout=1)
    assert second.held
    assert "node node-b" in path.read_text()
    second.release()
