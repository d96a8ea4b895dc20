"""Only one sandbox at a time runs its containers from the machine's /var/run/cdi: the lock, and what a second
sandbox does while another holds it."""

from __future__ import annotations

import os
import threading
from pathlib import Path

import pytest

from dra_sandbox.cdilock import LOCK_NAME, SystemCdiLock
from dra_sandbox.cluster import SYSTEM_CDI_DIR, NodeSpec
from dra_sandbox.runtime.podman import PodmanRuntime
from tests.integration.conftest import sandbox


def test_a_second_holder_is_refused_with_the_first_ones_pid_until_it_releases(tmp_path: Path) -> None:
    first = SystemCdiLock.acquire(tmp_path)
    assert isinstance(first, SystemCdiLock)
    assert (tmp_path / LOCK_NAME).read_text() == f"{os.getpid()}\n"
    second = SystemCdiLock.acquire(tmp_path)  # its own open file: flock refuses it like another process
    assert second == f"another sandbox (pid {os.getpid()}) is using {tmp_path} for its containers"
    first.release()
    third = SystemCdiLock.acquire(tmp_path)
    assert isinstance(third, SystemCdiLock)
    third.release()


def test_a_waiting_holder_gets_the_lock_once_it_is_released(tmp_path: Path) -> None:
    first = SystemCdiLock.acquire(tmp_path)
    assert isinstance(first, SystemCdiLock)
    got: list[SystemCdiLock | str] = []
    waiter = threading.Thread(target=lambda: got.append(SystemCdiLock.acquire(tmp_path, wait_s=30)))
    waiter.start()
    first.release()
    waiter.join(timeout=35)
    assert len(got) == 1 and isinstance(got[0], SystemCdiLock)
    got[0].release()


@pytest.mark.xdist_group("system-cdi")
def test_a_second_podman_sandbox_checks_cdi_in_its_own_dir_instead_of_sharing_the_system_one() -> None:
    if os.geteuid() != 0 or not PodmanRuntime().availability().usable:
        pytest.skip("podman cannot run containers as root here: no sandbox would use /var/run/cdi")
    SYSTEM_CDI_DIR.mkdir(parents=True, exist_ok=True)
    holder = SystemCdiLock.acquire(SYSTEM_CDI_DIR, wait_s=120)  # the other sandbox
    assert isinstance(holder, SystemCdiLock), holder
    try:
        with sandbox("dra-lock-", [NodeSpec("node-a", "fake:l4x2")], runtime="auto") as cluster:
            assert cluster.runtime is not None and cluster.runtime.name == "cdi-check"
            assert cluster.cdi_root != SYSTEM_CDI_DIR and cluster.cdi_root.is_dir()
            assert f"another sandbox (pid {os.getpid()})" in getattr(cluster.runtime, "reason", "")
    finally:
        holder.release()
