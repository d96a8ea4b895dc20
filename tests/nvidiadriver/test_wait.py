"""The wait for the NVIDIA driver (nvidiadriver/wait.py) and its reporters (plugin/driverreport.py): the checks in
order with their reasons, the backoff, the stop, what the board, the log and the Node Events say. No real sleeping:
the pause between rounds is injected."""

from __future__ import annotations

import os
import threading
from collections.abc import Callable
from pathlib import Path

import pytest

from dra_driver.k8s.events import NORMAL, WARNING
from dra_driver.nvidiadriver.state import DriverState, DriverStatus, DriverStatusBoard, readiness
from dra_driver.nvidiadriver.wait import (
    DriverPaths,
    DriverWait,
    DriverWaitSettings,
    check_control_device,
    check_driver_files,
    check_kernel_module,
)
from dra_driver.nvml.fake.backend import FakeNvml, FakeSettings
from dra_driver.plugin.driverreport import NOT_READY_EVENT, READY_EVENT, DriverReporter


class Pauses:
    """The injected pause: records each interval; `then` runs after each (a test loads the driver there)."""

    def __init__(self, then: Callable[[int], None] = lambda n: None, stop_after: int | None = None) -> None:
        self.intervals: list[float] = []
        self._then = then
        self._stop_after = stop_after

    def __call__(self, seconds: float) -> bool:
        self.intervals.append(seconds)
        self._then(len(self.intervals))
        return self._stop_after is not None and len(self.intervals) >= self._stop_after


def absent_driver() -> FakeNvml:
    return FakeNvml.preset("dgx-h100", settings=FakeSettings(driver_absent=True))


def host(tmp_path: Path, *, lib: bool = True, module: bool = True, ctl: bool = True) -> DriverPaths:
    """A driver root, /proc, /sys and /dev as a GPU node has them (each part optional)."""
    root, proc, sys, dev = (tmp_path / d for d in ("driver", "proc", "sys", "dev"))
    for d in (root, proc, sys, dev):
        d.mkdir(parents=True)
    if lib:
        libdir = root / "usr/lib/x86_64-linux-gnu"
        libdir.mkdir(parents=True)
        (libdir / "libnvidia-ml.so.570.124.06").write_bytes(b"\x7fELF")
        (libdir / "libnvidia-ml.so.1").symlink_to("libnvidia-ml.so.570.124.06")
    if module:
        (proc / "driver/nvidia").mkdir(parents=True)
        (proc / "driver/nvidia/version").write_text("NVRM version: NVIDIA UNIX x86_64 Kernel Module  570.124.06\n")
    if ctl:
        # A character device cannot be made without privileges: /dev/null is one, so link to it.
        (dev / "nvidiactl").symlink_to("/dev/null")
    return DriverPaths(driver_root=root, host_driver_root=Path("/run/nvidia/driver"), dev_root=dev, proc_root=proc,
                       sys_root=sys, machine="x86_64")


def test_a_node_with_a_driver_passes_every_check(tmp_path: Path) -> None:
    paths = host(tmp_path)
    assert (check_driver_files(paths), check_kernel_module(paths), check_control_device(paths)) == (None, None, None)


def test_each_missing_part_names_what_to_fix(tmp_path: Path) -> None:
    no_lib = check_driver_files(host(tmp_path / "a", lib=False))
    assert no_lib is not None and "libnvidia-ml.so.1 not found under the driver root" in no_lib
    assert "driverRoot" in no_lib and "/run/nvidia/driver" in no_lib and "usr/lib/x86_64-linux-gnu" in no_lib
    no_module = check_kernel_module(host(tmp_path / "b", module=False))
    assert no_module is not None and "nvidia kernel module is not loaded" in no_module and "modprobe" in no_module
    no_ctl = check_control_device(host(tmp_path / "c", ctl=False))
    assert no_ctl is not None and "nvidiactl" in no_ctl and "--dev-root" in no_ctl
    for reason in (no_lib, no_module, no_ctl):
        assert "\n" not in reason and "Fix:" in reason


def test_the_module_also_counts_from_sys_and_a_plain_file_is_no_control_device(tmp_path: Path) -> None:
    paths = host(tmp_path, module=False, ctl=False)
    (paths.sys_root / "module/nvidia").mkdir(parents=True)
    assert check_kernel_module(paths) is None
    (paths.dev_root / "nvidiactl").write_text("not a device")
    assert check_control_device(paths) is not None


def test_a_dangling_library_link_is_named(tmp_path: Path) -> None:
    paths = host(tmp_path, lib=False)
    libdir = paths.driver_root / "usr/lib64"
    libdir.mkdir(parents=True)
    (libdir / "libnvidia-ml.so.1").symlink_to("/usr/lib/only-on-the-host/libnvidia-ml.so.570")
    reason = check_driver_files(paths)
    assert reason is not None and "dangling symlink" in reason and "only-on-the-host" in reason


def test_the_first_failing_check_is_the_reason_and_the_board_says_it(tmp_path: Path) -> None:
    nvml = absent_driver()
    board = DriverStatusBoard()
    wait = DriverWait(nvml, board, DriverWaitSettings(max_interval=5, paths=host(tmp_path, module=False, ctl=False)),
                      stop=threading.Event())
    assert wait.attempt() is False
    status = board.status()
    assert status.state is DriverState.NOT_READY and status.reason.startswith("the nvidia kernel module")
    assert not wait.initialised


def test_the_fake_backend_is_checked_by_init_alone_and_backs_off_to_the_cap() -> None:
    nvml = absent_driver()
    board = DriverStatusBoard()
    seen: list[tuple[DriverStatus, DriverStatus]] = []
    board.listen(lambda previous, current: seen.append((previous, current)))
    pauses = Pauses(then=lambda n: nvml.load_driver("580.65.06") if n == 7 else None)
    wait = DriverWait(nvml, board, DriverWaitSettings(max_interval=3.0), stop=threading.Event(), pause=pauses)
    assert wait.wait() is True
    assert pauses.intervals == [0.5, 1.0, 2.0, 3.0, 3.0, 3.0, 3.0]  # doubling, capped
    assert wait.rounds == 8 and wait.initialised
    # One change to NOT_READY (the same reason for 7 rounds notifies once), then READY with the version.
    assert [c.state for _, c in seen] == [DriverState.NOT_READY, DriverState.READY]
    assert "DRIVER_NOT_LOADED" in seen[0][1].reason
    assert board.status().driver_version == "580.65.06"
    assert nvml.system_info().driver_version == "580.65.06"  # NVML is initialised: the plugin can go on
    wait.release()
    assert not wait.initialised


def test_a_stop_ends_the_wait_without_initialising() -> None:
    stop = threading.Event()
    wait = DriverWait(absent_driver(), DriverStatusBoard(), DriverWaitSettings(max_interval=5), stop=stop,
                      pause=Pauses(stop_after=2))
    assert wait.wait() is False and wait.rounds == 2 and not wait.initialised
    stop.set()
    assert DriverWait(absent_driver(), DriverStatusBoard(), DriverWaitSettings(max_interval=5), stop=stop).wait() is False


def test_the_default_pause_is_the_stop_event() -> None:
    """A SIGTERM sets the event: the wait returns at once instead of sleeping out its interval."""
    stop = threading.Event()
    wait = DriverWait(absent_driver(), DriverStatusBoard(), DriverWaitSettings(max_interval=600, initial_interval=600),
                      stop=stop)
    result: list[bool] = []
    thread = threading.Thread(target=lambda: result.append(wait.wait()))
    thread.start()
    stop.set()
    thread.join(timeout=5)
    assert result == [False]


def test_checks_explain_but_init_decides(tmp_path: Path) -> None:
    """The library is not under the driver root, yet NVML initialises (the loader path found it): ready."""
    board = DriverStatusBoard()
    nvml = FakeNvml.preset("l4x2")
    wait = DriverWait(nvml, board, DriverWaitSettings(max_interval=1, paths=host(tmp_path, lib=False)),
                      stop=threading.Event())
    assert wait.attempt() is True and board.ready
    wait.release()


class NoGpus(FakeNvml):
    def gpus(self) -> list:  # type: ignore[type-arg]
        return []


def test_nvml_without_gpus_is_not_ready_unless_a_gpu_is_passed_through() -> None:
    nvml = NoGpus.preset("l4x2")
    board = DriverStatusBoard()
    wait = DriverWait(nvml, board, DriverWaitSettings(max_interval=1), stop=threading.Event())
    assert wait.attempt() is False
    assert "NVML lists no GPU" in board.status().reason and "empty ResourceSlice" in board.status().reason
    assert not wait.initialised  # the reference it took was given back
    passed = DriverWait(nvml, board, DriverWaitSettings(max_interval=1), stop=threading.Event(),
                        accept_no_gpus=lambda: True)
    assert passed.attempt() is True and board.ready
    passed.release()


class Recorded:
    def __init__(self) -> None:
        self.events: list[tuple[str, str, str]] = []

    def record(self, *, type: str, reason: str, message: str) -> None:
        self.events.append((type, reason, message))


def test_each_reason_is_reported_once_per_episode_and_ready_ends_it() -> None:
    events = Recorded()
    board = DriverStatusBoard()
    board.listen(DriverReporter(events))  # type: ignore[arg-type]
    for reason in ("no library", "no module", "no library", "no module"):
        board.set(DriverState.NOT_READY, reason)
    board.set(DriverState.READY, driver_version="570.124.06")
    board.set(DriverState.RELOADING, "every GPU answers GPU_IS_LOST")
    board.set(DriverState.READY, driver_version="580.65.06")
    assert events.events == [
        (WARNING, NOT_READY_EVENT, "no library"),
        (WARNING, NOT_READY_EVENT, "no module"),
        (NORMAL, READY_EVENT, "NVIDIA driver 570.124.06 is ready"),
        (WARNING, NOT_READY_EVENT, "every GPU answers GPU_IS_LOST"),
        (NORMAL, READY_EVENT, "NVIDIA driver 580.65.06 is ready"),
    ]


def test_a_healthy_start_records_no_event() -> None:
    events = Recorded()
    board = DriverStatusBoard()
    board.listen(DriverReporter(events))  # type: ignore[arg-type]
    board.set(DriverState.READY, driver_version="570.124.06")
    assert events.events == []


@pytest.mark.parametrize(("state", "reason", "said"), [
    (DriverState.NOT_READY, "no /dev/nvidiactl", (False, "driver not ready: no /dev/nvidiactl")),
    (DriverState.RELOADING, "version changed", (False, "driver reloading: version changed")),
    (DriverState.READY, "", (True, "ok")),
])
def test_readiness_says_the_reason(state: DriverState, reason: str, said: tuple[bool, str]) -> None:
    assert readiness(DriverStatus(state, reason)) == said


def test_dev_null_is_a_character_device() -> None:
    """Guards the fixture above: the control-device check accepts what it links to."""
    import stat

    assert stat.S_ISCHR(os.stat("/dev/null").st_mode)
