"""`HostMpsControl` against a stand-in `nvidia-cuda-mps-control` (tests/nvml/mps_standin.py): real processes, a
real daemon that forks away, a real unix socket; what the stand-in records is what the control really sent.

Only `mount`/`umount` are intercepted (they need root): the shm tests inject a runner that records them and
edits a fake mountinfo the way the kernel would, and passes every other program through to subprocess.run.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import pytest
from structlog.testing import capture_logs

from dra_driver.nvml.mps import MpsControl, MpsDaemonSpec, MpsError
from dra_driver.nvml.real.mps import (
    CGROUP_PARENT,
    PID_FILE,
    HostMpsControl,
    MpsTimeouts,
    limit_commands,
    mount_points,
    parse_memory,
    parse_percentage,
    pinned_limit_value,
    shm_mount_command,
    shm_size,
)
from tests.nvml import mps_standin
from tests.polling import wait_for

U1 = "GPU-11111111-0000-4000-8000-000000000001"
U2 = "GPU-22222222-0000-4000-8000-000000000002"
GIB = 1 << 30
FAST = MpsTimeouts(command_s=10.0, start_s=15.0, quit_s=3.0, term_s=3.0, kill_s=3.0, poll_interval_s=0.01)


# -- processes -----------------------------------------------------------------------------------------------------


def running(pid: int) -> bool:
    """Alive and not a zombie (an exited daemon stays a zombie until its adoptive parent reaps it)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_bytes()
    except OSError:
        return False
    return stat.rpartition(b")")[2].split()[0] not in (b"Z", b"X")


def kill_leftovers(binary: Path) -> None:
    """SIGKILL every stand-in daemon this binary started that still runs (checked by cmdline: pids get reused)."""
    record = Path(f"{binary}.daemons")
    if not record.exists():
        return
    pids = [int(word) for word in record.read_text().split()]
    for pid in pids:
        try:
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
        except OSError:
            continue
        if str(binary).encode() in cmdline.split(b"\0") and running(pid):
            os.kill(pid, signal.SIGKILL)
    for pid in pids:
        wait_for(lambda pid=pid: not running(pid), what=f"stand-in daemon {pid} to die")  # type: ignore[misc]


@dataclass(frozen=True)
class Bench:
    tmp: Path
    root: Path  # the driver root
    binary: Path

    def spec(self, name: str = "d1", **limits: Any) -> MpsDaemonSpec:
        spec = MpsDaemonSpec(id=name, directory=str(self.tmp / "mps" / name), visible_uuids=(U1, U2), **limits)
        for directory in (spec.pipe_directory, spec.log_directory, spec.shm_directory):
            os.makedirs(directory, exist_ok=True)
        return spec

    def control(self, **kwargs: Any) -> HostMpsControl:
        kwargs.setdefault("mount_shm", False)
        kwargs.setdefault("timeouts", FAST)
        kwargs.setdefault("machine", "x86_64")
        return HostMpsControl(str(self.root), **kwargs)


@pytest.fixture
def bench(tmp_path: Path) -> Iterator[Bench]:
    root = tmp_path / "driver"
    binary = root / "usr" / "bin" / "nvidia-cuda-mps-control"
    binary.parent.mkdir(parents=True)
    binary.write_text(f"#!{sys.executable}\n" + Path(mps_standin.__file__).read_text())
    binary.chmod(0o755)
    try:
        yield Bench(tmp_path, root, binary)
    finally:
        kill_leftovers(binary)


def pid_of(spec: MpsDaemonSpec) -> int:
    return int(Path(spec.pipe_directory, PID_FILE).read_text())


def state(spec: MpsDaemonSpec) -> dict[str, Any]:
    found: dict[str, Any] = json.loads(Path(spec.log_directory, mps_standin.STATE_FILE).read_text())
    return found


def control_log(spec: MpsDaemonSpec) -> str:
    return Path(spec.log_directory, mps_standin.CONTROL_LOG).read_text()


def ask(bench: Bench, spec: MpsDaemonSpec, *lines: str) -> str:
    """Talk to a daemon the way a person would, past the code under test."""
    env = {"CUDA_MPS_PIPE_DIRECTORY": spec.pipe_directory, "PATH": "/usr/bin:/bin"}
    done = subprocess.run(
        [str(bench.binary)],
        input="".join(f"{line}\n" for line in lines),
        capture_output=True,
        text=True,
        env=env,
        timeout=10,
        check=True,
    )
    return done.stdout


# -- start, adopt, status, stop --------------------------------------------------------------------------------------


def test_it_is_an_mps_control(bench: Bench) -> None:
    control: MpsControl = bench.control()
    assert isinstance(control, MpsControl)


def test_start_runs_the_daemon_with_the_spec_environment_and_limits(bench: Bench) -> None:
    spec = bench.spec(active_thread_percentage=40, pinned_memory_limits={U1: 4 * GIB + 123})
    control = bench.control()
    control.start(spec)

    pid = pid_of(spec)
    assert running(pid)
    started = json.loads(Path(spec.log_directory, mps_standin.ENV_FILE).read_text())
    root = bench.root
    assert started["env"] == {
        "CUDA_VISIBLE_DEVICES": f"{U1},{U2}",
        "CUDA_MPS_PIPE_DIRECTORY": spec.pipe_directory,
        "CUDA_MPS_LOG_DIRECTORY": spec.log_directory,
        "PATH": f"{root}/usr/bin:/usr/bin:/bin",
        "LD_LIBRARY_PATH": ":".join(
            f"{root}/{rel}"
            for rel in (
                "usr/lib64",
                "usr/lib/x86_64-linux-gnu",
                "usr/lib/aarch64-linux-gnu",
                "lib64",
                "lib/x86_64-linux-gnu",
                "lib/aarch64-linux-gnu",
                "usr/lib",
                "lib",
            )
        ),
    }
    assert started["front_led_session"] is True
    assert started["multi_user"] is False
    found = state(spec)
    assert found["pid"] == pid
    assert found["default_active_thread_percentage"] == 40
    assert found["default_pinned"] == {U1: "4096M"}  # whole MiB, rounded down; U2 has no limit

    status = control.status(spec)
    assert status.running and status.pid == pid
    assert status.active_thread_percentage == 40
    assert status.pinned_memory_limits == {U1: 4096 << 20}


def test_a_multi_user_daemon_is_started_with_dash_m(bench: Bench) -> None:
    spec = replace(bench.spec(), multi_user=True)
    bench.control().start(spec)
    assert json.loads(Path(spec.log_directory, mps_standin.ENV_FILE).read_text())["multi_user"] is True


def test_no_limits_sends_no_set_command(bench: Bench) -> None:
    spec = bench.spec()
    bench.control().start(spec)
    assert "set_" not in control_log(spec)
    assert state(spec)["default_active_thread_percentage"] == 100


def test_start_again_adopts_the_daemon_and_relimits_its_running_servers(bench: Bench) -> None:
    control = bench.control()
    first = bench.spec(active_thread_percentage=50, pinned_memory_limits={U1: 4 * GIB})
    control.start(first)
    pid = pid_of(first)
    ask(bench, first, "standin_add_server 4242", "standin_add_server 4343")

    again = bench.spec(active_thread_percentage=30, pinned_memory_limits={U1: 2 * GIB, U2: GIB})
    bench.control().start(again)  # a new control, as after a plugin restart

    assert pid_of(again) == pid and running(pid)
    assert control_log(again).count("daemon started") == 1
    found = state(again)
    assert found["default_active_thread_percentage"] == 30
    assert found["default_pinned"] == {U1: "2048M", U2: "1024M"}
    for server in ("4242", "4343"):
        assert found["servers"][server] == {"active_thread_percentage": 30, "pinned": {U1: "2048M", U2: "1024M"}}


def test_a_stale_pid_file_gets_a_new_daemon(bench: Bench) -> None:
    control = bench.control()
    spec = bench.spec(active_thread_percentage=60)
    control.start(spec)
    crashed = pid_of(spec)
    os.kill(crashed, signal.SIGKILL)  # leaves its pid file and socket behind
    wait_for(lambda: not running(crashed), what="the daemon to die")
    assert Path(spec.pipe_directory, PID_FILE).exists()
    assert not control.status(spec).running

    control.start(spec)
    fresh = pid_of(spec)
    assert fresh != crashed and running(fresh)
    assert control.status(spec).active_thread_percentage == 60


def test_status_of_a_daemon_that_does_not_run(bench: Bench) -> None:
    control = bench.control()
    spec = bench.spec()
    status = control.status(spec)
    assert not status.running and status.pid is None
    assert PID_FILE in status.detail and "no daemon answered" in status.detail

    control.start(spec)
    control.stop(spec)
    assert not control.status(spec).running


def test_stop_ends_the_daemon_and_is_idempotent(bench: Bench) -> None:
    control = bench.control()
    spec = bench.spec()
    control.start(spec)
    pid = pid_of(spec)

    control.stop(spec)
    assert not running(pid)
    assert not Path(spec.pipe_directory, PID_FILE).exists()
    assert "quit" in control_log(spec)
    control.stop(spec)
    bench.control().stop(bench.spec("never-started"))


def test_two_daemons_run_side_by_side(bench: Bench) -> None:
    control = bench.control()
    a, b = bench.spec("a", active_thread_percentage=20), bench.spec("b", active_thread_percentage=80)
    control.start(a)
    control.start(b)
    pid_a = pid_of(a)
    assert pid_a != pid_of(b)
    assert control.status(a).active_thread_percentage == 20
    assert control.status(b).active_thread_percentage == 80
    control.stop(a)
    assert not running(pid_a) and control.status(b).running


def test_a_missing_binary_says_where_it_looked_and_how_to_fix_it(bench: Bench, tmp_path: Path) -> None:
    empty = tmp_path / "no-driver"
    control = HostMpsControl(str(empty), mount_shm=False, timeouts=FAST)
    spec = bench.spec()
    with pytest.raises(MpsError) as info:
        control.start(spec)
    message = str(info.value)
    assert "nvidia-cuda-mps-control not found" in message
    assert f"{empty}/usr/bin" in message and "--driver-root" in message
    status = control.status(spec)
    assert not status.running and "--driver-root" in status.detail
    control.stop(spec)  # nothing runs: a success


def test_a_limit_for_a_device_the_daemon_does_not_serve_is_refused_before_anything_runs(bench: Bench) -> None:
    spec = bench.spec(pinned_memory_limits={"GPU-elsewhere": GIB})
    with pytest.raises(MpsError, match="GPU-elsewhere") as info:
        bench.control().start(spec)
    assert f"{spec.log_directory}/control.log" in str(info.value)
    assert not Path(spec.pipe_directory, PID_FILE).exists()


def test_a_pinned_limit_under_one_mib_is_refused(bench: Bench) -> None:
    # It would be sent as 0M, which is no limit at all.
    with pytest.raises(MpsError, match="1 MiB"):
        bench.control().start(bench.spec(pinned_memory_limits={U1: (1 << 20) - 1}))


# -- stopping safely -------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("ignores", ["quit", "quit and SIGTERM"])
def test_a_daemon_that_ignores_quit_is_signalled(bench: Bench, ignores: str) -> None:
    spec = bench.spec()
    Path(spec.log_directory, mps_standin.IGNORE_QUIT).write_text("term" if "SIGTERM" in ignores else "")
    control = bench.control(timeouts=MpsTimeouts(quit_s=0.3, term_s=0.5, kill_s=5.0, poll_interval_s=0.01))
    control.start(spec)
    pid = pid_of(spec)

    with capture_logs() as logs:
        control.stop(spec)

    assert not running(pid)
    said = control_log(spec)
    assert "quit ignored" in said
    sent = [entry["signal"] for entry in logs if entry["event"].startswith("mps daemon ignored quit")]
    if "SIGTERM" in ignores:
        assert "SIGTERM ignored" in said and sent == ["SIGTERM", "SIGKILL"]
    else:
        assert sent == ["SIGTERM"]


@pytest.fixture
def bystander() -> Iterator[int]:
    """A process that is not an MPS daemon, waiting on its stdin."""
    proc = subprocess.Popen([sys.executable, "-c", "import sys; sys.stdin.read()"], stdin=subprocess.PIPE)
    try:
        yield proc.pid
    finally:
        assert proc.stdin is not None
        proc.stdin.close()
        proc.wait(timeout=10)


def test_a_pid_file_naming_an_unrelated_process_never_gets_it_signalled(bench: Bench, bystander: int) -> None:
    spec = bench.spec()
    Path(spec.pipe_directory, PID_FILE).write_text(f"{bystander}\n")
    control = bench.control(timeouts=MpsTimeouts(quit_s=0.2, term_s=0.2, kill_s=0.2, poll_interval_s=0.01))
    status = control.status(spec)
    assert not status.running and "not this directory's" in status.detail

    control.stop(spec)
    assert running(bystander)

    control.start(spec)  # a stale pid file: a daemon of its own
    assert pid_of(spec) != bystander and running(pid_of(spec)) and running(bystander)


def test_another_directorys_daemon_named_by_a_pid_file_is_not_signalled(bench: Bench) -> None:
    control = bench.control(timeouts=MpsTimeouts(quit_s=0.2, term_s=0.2, kill_s=0.2, poll_interval_s=0.01))
    other = bench.spec("other")
    control.start(other)
    mine = bench.spec("mine")
    Path(mine.pipe_directory, PID_FILE).write_text(f"{pid_of(other)}\n")

    control.stop(mine)
    assert running(pid_of(other)) and control.status(other).running


# -- cgroup escape ---------------------------------------------------------------------------------------------------


def test_the_daemon_moves_into_its_own_cgroup_which_stop_removes(bench: Bench, tmp_path: Path) -> None:
    cgroup_root = tmp_path / "cgroup"
    cgroup_root.mkdir()
    control = bench.control(cgroup_root=str(cgroup_root))
    spec = bench.spec()
    control.start(spec)
    group = cgroup_root / CGROUP_PARENT / spec.id
    assert (group / "cgroup.procs").read_text().split() == [str(pid_of(spec))]

    # cgroupfs lets rmdir remove a group whose interface files remain; a plain directory does not.
    (group / "cgroup.procs").unlink()
    control.stop(spec)
    assert not group.exists() and (cgroup_root / CGROUP_PARENT).is_dir()


def test_a_cgroup_that_cannot_be_removed_only_warns(bench: Bench, tmp_path: Path) -> None:
    cgroup_root = tmp_path / "cgroup"
    cgroup_root.mkdir()
    control = bench.control(cgroup_root=str(cgroup_root))
    spec = bench.spec()
    control.start(spec)
    pid = pid_of(spec)
    with capture_logs() as logs:
        control.stop(spec)  # cgroup.procs is still there: rmdir fails
    assert not running(pid)
    assert [e["event"] for e in logs if e["log_level"] == "warning"] == ["mps daemon cgroup not removed"]


def test_a_failed_cgroup_escape_warns_and_the_daemon_still_runs(bench: Bench, tmp_path: Path) -> None:
    not_a_cgroup_fs = tmp_path / "file"
    not_a_cgroup_fs.write_text("")
    spec = bench.spec()
    with capture_logs() as logs:
        bench.control(cgroup_root=str(not_a_cgroup_fs)).start(spec)
    warnings = [e for e in logs if e["log_level"] == "warning"]
    assert len(warnings) == 1 and "will not survive a restart of the plugin container" in warnings[0]["event"]
    assert warnings[0]["pid"] == pid_of(spec) and running(pid_of(spec))


# -- shm -------------------------------------------------------------------------------------------------------------


def mountinfo_line(point: str) -> str:
    escaped = point.replace("\\", "\\134").replace(" ", "\\040")
    return f"1234 25 0:99 / {escaped} rw,nosuid,nodev,noexec,relatime shared:7 - tmpfs tmpfs rw,size=500k\n"


@dataclass(frozen=True)
class MountRecorder:
    """Runs every program but mount/umount, which it records and reflects in a fake mountinfo."""

    mountinfo: Path
    returncode: int = 0
    calls: list[list[str]] = field(default_factory=list)

    def __call__(self, argv: Sequence[str], **kwargs: Any) -> subprocess.CompletedProcess[str]:
        if argv[0] not in ("mount", "umount"):
            done: subprocess.CompletedProcess[str] = subprocess.run(argv, **kwargs)
            return done
        self.calls.append(list(argv))
        assert kwargs["timeout"] > 0 and "shell" not in kwargs
        if self.returncode == 0:
            line = mountinfo_line(argv[-1])
            text = self.mountinfo.read_text()
            self.mountinfo.write_text(text + line if argv[0] == "mount" else text.replace(line, ""))
        return subprocess.CompletedProcess(list(argv), self.returncode, "", "mount: permission denied\n")


@pytest.fixture
def mountinfo(tmp_path: Path) -> Path:
    path = tmp_path / "mountinfo"
    path.write_text(mountinfo_line("/") + mountinfo_line("/dev/shm"))
    return path


def shm_control(bench: Bench, recorder: MountRecorder, meminfo: Path, **kwargs: Any) -> HostMpsControl:
    return bench.control(
        mount_shm=True, run=recorder, mountinfo_path=str(recorder.mountinfo), meminfo_path=str(meminfo), **kwargs
    )


def test_start_mounts_a_tmpfs_of_half_the_memory_and_stop_unmounts_it(
    bench: Bench, mountinfo: Path, tmp_path: Path
) -> None:
    meminfo = tmp_path / "meminfo"
    meminfo.write_text("MemTotal:       16318588 kB\nMemFree:         1000000 kB\n")
    recorder = MountRecorder(mountinfo)
    control = shm_control(bench, recorder, meminfo)
    spec = bench.spec()

    control.start(spec)
    control.start(spec)  # adopted: mounted already
    assert recorder.calls == [
        ["mount", "-t", "tmpfs", "-o", "rw,nosuid,nodev,noexec,size=8159294k", "tmpfs", spec.shm_directory]
    ]
    control.stop(spec)
    assert recorder.calls[1:] == [["umount", spec.shm_directory]]
    control.stop(spec)
    assert len(recorder.calls) == 2


def test_an_existing_mount_is_kept_and_meminfo_has_a_fallback(bench: Bench, mountinfo: Path, tmp_path: Path) -> None:
    spec = bench.spec()
    mountinfo.write_text(mountinfo.read_text() + mountinfo_line(spec.shm_directory))
    recorder = MountRecorder(mountinfo)
    shm_control(bench, recorder, tmp_path / "no-meminfo").start(spec)
    assert recorder.calls == []

    other = bench.spec("other")
    shm_control(bench, recorder, tmp_path / "no-meminfo").start(other)
    assert recorder.calls == [shm_mount_command(other.shm_directory, "65536k")]


def test_a_failed_mount_fails_start_before_the_daemon_runs(bench: Bench, mountinfo: Path, tmp_path: Path) -> None:
    recorder = MountRecorder(mountinfo, returncode=32)
    spec = bench.spec()
    with pytest.raises(MpsError, match="permission denied") as info:
        shm_control(bench, recorder, tmp_path / "meminfo").start(spec)
    assert spec.directory in str(info.value)
    assert not Path(spec.pipe_directory, PID_FILE).exists()


# -- the pure parts --------------------------------------------------------------------------------------------------


def test_limit_commands_cover_defaults_then_each_server() -> None:
    spec = MpsDaemonSpec(
        id="d",
        directory="/x",
        visible_uuids=(U1, U2),
        active_thread_percentage=25,
        pinned_memory_limits={U2: 3 * GIB + (1 << 20) - 1},
    )
    assert limit_commands(spec, [7, 9]) == [
        "set_default_active_thread_percentage 25",
        f"set_default_device_pinned_mem_limit {U2} 3072M",
        "set_active_thread_percentage 7 25",
        f"set_device_pinned_mem_limit 7 {U2} 3072M",
        "set_active_thread_percentage 9 25",
        f"set_device_pinned_mem_limit 9 {U2} 3072M",
    ]
    assert limit_commands(MpsDaemonSpec(id="d", directory="/x", visible_uuids=(U1,)), [7]) == []


@pytest.mark.parametrize(
    ("reply", "expected"), [("100.0\n", 100), ("33.3", 33), ("", None), ("Invalid command", None), ("nan", None)]
)
def test_parse_percentage(reply: str, expected: int | None) -> None:
    assert parse_percentage(reply) == expected


@pytest.mark.parametrize(
    ("reply", "expected"),
    [
        ("4096M\n", 4096 << 20),
        ("4G", 4 * GIB),
        ("4GiB", 4 * GIB),
        ("0", 0),
        ("512k", 512 << 10),
        ("x", None),
        ("", None),
    ],
)
def test_parse_memory(reply: str, expected: int | None) -> None:
    assert parse_memory(reply) == expected


def test_mount_points_undo_the_octal_escapes() -> None:
    assert mount_points(mountinfo_line("/a dir/with\\slash") + "short line\n") == {"/a dir/with\\slash"}


@pytest.mark.parametrize(
    ("meminfo", "expected"),
    [("MemTotal: 1000 kB\n", "500k"), ("MemFree: 1000 kB\n", "65536k"), (None, "65536k"), ("MemTotal: x kB", "65536k")],
)
def test_shm_size(meminfo: str | None, expected: str) -> None:
    assert shm_size(meminfo) == expected


def test_pinned_limit_value_never_rounds_up() -> None:
    assert pinned_limit_value((2 << 20) - 1) == "1M" and pinned_limit_value(5 << 20) == "5M"


@pytest.mark.parametrize(
    ("state", "pipe", "story"),
    [
        ("S", "mine", "daemon pid 77"),
        ("Z", "mine", "the pid file names 77, which has exited"),  # dead, its parent has not reaped it yet
        ("S", "other", "the pid file names 77, which is not this directory's nvidia-cuda-mps-control"),
    ],
)
def test_what_proc_says_about_the_pid_in_the_pid_file(
    bench: Bench, tmp_path: Path, state: str, pipe: str, story: str
) -> None:
    spec = bench.spec()
    proc = tmp_path / "proc" / "77"
    proc.mkdir(parents=True)
    (proc / "stat").write_text(f"77 (nvidia-cuda-mps) {state} 1 77 77 0 -1 4194560")
    (proc / "cmdline").write_bytes(b"/driver/usr/bin/nvidia-cuda-mps-control\0-d\0")
    pipe_dir = spec.pipe_directory if pipe == "mine" else "/elsewhere/pipe"
    (proc / "environ").write_bytes(f"PATH=/usr/bin\0CUDA_MPS_PIPE_DIRECTORY={pipe_dir}\0".encode())
    Path(spec.pipe_directory, PID_FILE).write_text("77\n")

    status = bench.control(proc_root=str(tmp_path / "proc")).status(spec)
    assert not status.running and status.detail.startswith(story + ";")
