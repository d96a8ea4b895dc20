"""The MPS control daemon on real GPUs: the host driver's `nvidia-cuda-mps-control` (legacy v2 interface).

One daemon per `MpsDaemonSpec`, side by side, each told apart only by its pipe directory
(CUDA_MPS_PIPE_DIRECTORY). The daemon outlives the plugin on purpose: clients keep running while the plugin
restarts, so `start` first looks for a daemon already serving the directory and adopts it.

What runs, all as argument lists with a timeout, a minimal environment and no shell:

- `nvidia-cuda-mps-control -d` (from the driver root) starts a daemon; it forks into the background and writes
  `nvidia-cuda-mps-control.pid` into the pipe directory.
- `nvidia-cuda-mps-control` with commands on stdin (one per line, EOF ends the session) talks to it; it exits 0
  when it reached a daemon, non-zero when none listens on the pipe directory.
- `mount -t tmpfs ...` / `umount` for the shared-memory directory, unless it already is a mount point.

A pid read from the pid file is trusted only after /proc says it is an `nvidia-cuda-mps-control` started for
this very pipe directory, because pids are reused and several daemons run at once: a stale pid file must never
get an unrelated process (or another claim's daemon) signalled.
"""

from __future__ import annotations

import math
import os
import platform
import re
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import KW_ONLY, dataclass, field

import structlog

from dra_driver.nvml.mps import MpsDaemonSpec, MpsDaemonStatus, MpsError
from dra_driver.nvml.real.computepolicy import NVIDIA_SMI_DIRS
from dra_driver.nvml.real.loader import driver_library_dirs

log = structlog.get_logger(__name__)

CONTROL = "nvidia-cuda-mps-control"
PID_FILE = "nvidia-cuda-mps-control.pid"
CONTROL_LOG = "control.log"
CGROUP_PARENT = "dra-gpu-mps"
HEALTH_PROBE = "get_default_active_thread_percentage"
SHM_FALLBACK_SIZE = "65536k"
# The daemon execs nvidia-cuda-mps-server, which sits beside it; nothing else from the container's PATH.
BASE_PATH = "/usr/bin:/bin"
_MIB = 1 << 20
_MEMORY = re.compile(r"(?P<number>\d+)(?P<unit>[KMGT]?)(?:i?B)?", re.IGNORECASE)
_UNITS = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}

Runner = Callable[..., "subprocess.CompletedProcess[str]"]


@dataclass(frozen=True)
class MpsTimeouts:
    """Seconds. `command_s` bounds every single program run; the others bound a whole wait."""

    command_s: float = 10.0
    start_s: float = 30.0  # for the pid file to appear and the daemon to answer
    quit_s: float = 15.0  # after `quit`, for the daemon to exit on its own (it waits for its clients)
    term_s: float = 5.0
    kill_s: float = 5.0
    poll_interval_s: float = 0.05


@dataclass(frozen=True)
class _Reply:
    ok: bool
    stdout: str
    detail: str  # what went wrong, when not ok


def pinned_limit_value(limit_bytes: int) -> str:
    """MPS takes the pinned-memory limit in whole MiB; rounding down never grants more than allocated."""
    return f"{limit_bytes // _MIB}M"


def limit_commands(spec: MpsDaemonSpec, servers: Sequence[int]) -> list[str]:
    """The set_* lines for the defaults and for every running server: the defaults reach only servers started
    later, so an adopted daemon's running servers need their own."""
    pct = spec.active_thread_percentage
    pinned = [
        (uuid, pinned_limit_value(spec.pinned_memory_limits[uuid]))
        for uuid in spec.visible_uuids
        if uuid in spec.pinned_memory_limits
    ]
    lines: list[str] = []
    if pct is not None:
        lines.append(f"set_default_active_thread_percentage {pct}")
    lines.extend(f"set_default_device_pinned_mem_limit {uuid} {value}" for uuid, value in pinned)
    for server in servers:
        if pct is not None:
            lines.append(f"set_active_thread_percentage {server} {pct}")
        lines.extend(f"set_device_pinned_mem_limit {server} {uuid} {value}" for uuid, value in pinned)
    return lines


def shm_mount_command(directory: str, size: str) -> list[str]:
    return ["mount", "-t", "tmpfs", "-o", f"rw,nosuid,nodev,noexec,size={size}", "tmpfs", directory]


def shm_size(meminfo: str | None) -> str:
    """Half the node's memory, as the kernel sizes /dev/shm by default; the fallback when /proc says nothing."""
    for line in (meminfo or "").splitlines():
        name, _, value = line.partition(":")
        fields = value.split()
        if name == "MemTotal" and fields and fields[0].isdigit() and int(fields[0]) > 1:
            return f"{int(fields[0]) // 2}k"
    return SHM_FALLBACK_SIZE


def mount_points(mountinfo: str) -> set[str]:
    """Mount points of a /proc/<pid>/mountinfo text (field 5, octal escapes undone)."""
    points: set[str] = set()
    for line in mountinfo.splitlines():
        fields = line.split()
        if len(fields) > 4:
            points.add(_unescape_octal(fields[4]))
    return points


def _unescape_octal(text: str) -> str:
    out: list[str] = []
    i = 0
    while i < len(text):
        code = text[i + 1 : i + 4]
        if text[i] == "\\" and len(code) == 3 and all(c in "01234567" for c in code):
            out.append(chr(int(code, 8)))
            i += 4
        else:
            out.append(text[i])
            i += 1
    return "".join(out)


def parse_percentage(reply: str) -> int | None:
    """`get_default_active_thread_percentage` answers e.g. `100.0`."""
    words = reply.split()
    try:
        value = float(words[-1]) if words else math.nan
    except ValueError:
        return None
    return round(value) if math.isfinite(value) else None


def parse_memory(reply: str) -> int | None:
    """A pinned-memory limit as printed (`4096M`, `4G`, `0`), in bytes; None for anything else."""
    words = reply.split()
    found = _MEMORY.fullmatch(words[-1]) if words else None
    if found is None:
        return None
    return int(found["number"]) * _UNITS[found["unit"].upper()]


def parse_server_list(reply: str) -> list[int]:
    return [int(word) for word in reply.split() if word.isdigit()]


@dataclass(frozen=True)
class HostMpsControl:
    """`MpsControl` over the host driver's `nvidia-cuda-mps-control`.

    driver_root: the host driver root as mounted in this container (--driver-root); None: the container's PATH
    and the loader's default library search.
    cgroup_root: a host cgroup v2 filesystem mounted into the container; when given, each daemon is moved into
    `<cgroup_root>/dra-gpu-mps/<id>` so that stopping the plugin container (runc kills its whole cgroup when the
    container shares the host PID namespace) does not take the daemons and every client's MPS with it.
    mount_shm: mount a tmpfs on the spec's shm directory (needs CAP_SYS_ADMIN); tests turn it off or inject `run`.
    run, proc_root, mountinfo_path, meminfo_path, machine (platform.machine() by default): seams for tests.
    """

    driver_root: str | None
    _: KW_ONLY
    cgroup_root: str | None = None
    run: Runner = subprocess.run
    mount_shm: bool = True
    proc_root: str = "/proc"
    mountinfo_path: str = "/proc/self/mountinfo"
    meminfo_path: str = "/proc/meminfo"
    machine: str = field(default_factory=platform.machine)
    timeouts: MpsTimeouts = field(default_factory=MpsTimeouts)

    # -- MpsControl ---------------------------------------------------------------------------------------------

    def start(self, spec: MpsDaemonSpec) -> None:
        unknown = sorted(set(spec.pinned_memory_limits) - set(spec.visible_uuids))
        if unknown:
            raise self._error(spec, f"pinned-memory limits for {', '.join(unknown)}, which the daemon does not serve")
        tiny = sorted(uuid for uuid, limit in spec.pinned_memory_limits.items() if limit < _MIB)
        if tiny:
            # MPS counts whole MiB: this would be sent as 0M, which limits nothing useful (and may read as none).
            raise self._error(spec, f"pinned-memory limits under 1 MiB for {', '.join(tiny)}")
        binary = self._binary()
        pid = self._our_pid(spec)
        if pid is not None:
            probe = self._send(spec, binary, [HEALTH_PROBE])
            if not probe.ok:
                raise self._error(spec, f"daemon pid {pid} runs but does not answer ({probe.detail}); stop it first")
            log.info("mps daemon adopted", daemon=spec.id, pid=pid)
        else:
            # Only for a new daemon: a tmpfs mounted under running servers would hide the memory they share.
            self._ensure_shm(spec)
            pid = self._start_daemon(spec, binary)
            log.info("mps daemon started", daemon=spec.id, pid=pid, visible=",".join(spec.visible_uuids))
        # Also on adoption: a daemon whose earlier escape failed gets another chance; moving it again is a no-op.
        self._escape_cgroup(spec, pid)
        self._apply_limits(spec, binary)

    def status(self, spec: MpsDaemonSpec) -> MpsDaemonStatus:
        try:
            binary = self._binary()
        except MpsError as exc:
            return MpsDaemonStatus(id=spec.id, running=False, detail=str(exc))
        probe = self._send(spec, binary, [HEALTH_PROBE])
        if not probe.ok:
            return MpsDaemonStatus(id=spec.id, running=False, detail=f"{self._pid_story(spec)}; {probe.detail}")
        pinned: dict[str, int] = {}
        for uuid in spec.visible_uuids:
            reply = self._send(spec, binary, [f"get_default_device_pinned_mem_limit {uuid}"])
            value = parse_memory(reply.stdout) if reply.ok else None
            if value:  # a zero (unset) is reported like the spec's absent entry: no limit
                pinned[uuid] = value
        return MpsDaemonStatus(
            id=spec.id,
            running=True,
            pid=self._our_pid(spec),
            active_thread_percentage=parse_percentage(probe.stdout),
            pinned_memory_limits=pinned,
        )

    def stop(self, spec: MpsDaemonSpec) -> None:
        pid = self._our_pid(spec)
        binary = self._find_binary()
        if binary is None:
            if pid is not None:
                raise self._error(spec, f"daemon pid {pid} runs but {self._not_found()}")
            answered = False  # no program to ask with, and no live daemon of this directory either
        else:
            answered = self._send(spec, binary, ["quit"]).ok
        if pid is not None:
            self._end(spec, pid)
        elif (
            answered
            and binary is not None
            # Something answered on the pipe but no pid file vouches for it: all we can do is wait for silence.
            and not self._poll(lambda: not self._send(spec, binary, [HEALTH_PROBE]).ok, self.timeouts.quit_s)
        ):
            raise self._error(spec, "a daemon without a pid file answered `quit` but kept answering")
        if pid is not None or answered:
            log.info("mps daemon stopped", daemon=spec.id, pid=pid)
        self._release_shm(spec)
        self._remove_cgroup(spec)

    # -- the daemon process ---------------------------------------------------------------------------------------

    def _start_daemon(self, spec: MpsDaemonSpec, binary: str) -> int:
        pid_file = os.path.join(spec.pipe_directory, PID_FILE)
        # The pid file is known stale here (no live daemon of this directory); a leftover would be read as the
        # new daemon's before that one writes its own.
        try:
            os.unlink(pid_file)
        except FileNotFoundError:
            pass
        except OSError as exc:
            raise self._error(spec, f"cannot remove the stale {pid_file}: {exc}") from None
        # The front process's output goes to a file, not a pipe: the daemon it forks may keep the inherited
        # descriptors open, and a pipe would then never see EOF.
        with tempfile.TemporaryFile(mode="w+") as output:
            try:
                done = self.run(
                    [binary, "-d", *(["-M"] if spec.multi_user else [])],
                    stdin=subprocess.DEVNULL,
                    stdout=output,
                    stderr=subprocess.STDOUT,
                    text=True,
                    timeout=self.timeouts.command_s,
                    check=False,
                    env=self._env(spec, binary),
                    # Its own session: no signal meant for the plugin's process group reaches the daemon.
                    start_new_session=True,
                )
            except subprocess.TimeoutExpired:
                raise self._error(spec, f"`{binary} -d` did not return in {self.timeouts.command_s:g} s") from None
            except OSError as exc:
                raise self._error(spec, f"running {binary} failed: {exc}") from None
            output.seek(0)
            said = _one_line(output.read())
        if done.returncode != 0:
            raise self._error(spec, f"`{binary} -d` exited {done.returncode}: {said or '(no output)'}")

        found: list[int] = []

        def up() -> bool:
            pid = self._our_pid(spec)
            if pid is None or not self._send(spec, binary, [HEALTH_PROBE]).ok:
                return False
            found.append(pid)
            return True

        if not self._poll(up, self.timeouts.start_s):
            raise self._error(
                spec,
                f"the daemon did not come up in {self.timeouts.start_s:g} s ({self._pid_story(spec)})",
            )
        return found[-1]

    def _end(self, spec: MpsDaemonSpec, pid: int) -> None:
        """Wait for `pid` to leave after `quit`, then TERM, then KILL; each signal only after re-checking that the
        pid still is this directory's daemon (it may have exited and the pid been reused meanwhile)."""
        if self._poll(lambda: not self._alive(pid), self.timeouts.quit_s):
            return
        for sig, wait in ((signal.SIGTERM, self.timeouts.term_s), (signal.SIGKILL, self.timeouts.kill_s)):
            if not self._is_our_daemon(pid, spec):
                return
            log.warning("mps daemon ignored quit; signalling", daemon=spec.id, pid=pid, signal=sig.name)
            try:
                os.kill(pid, sig)
            except ProcessLookupError:
                return
            except OSError as exc:
                raise self._error(spec, f"cannot send {sig.name} to daemon pid {pid}: {exc}") from None
            if self._poll(lambda: not self._alive(pid), wait):
                return
        raise self._error(spec, f"daemon pid {pid} survived quit, SIGTERM and SIGKILL")

    def _apply_limits(self, spec: MpsDaemonSpec, binary: str) -> None:
        listed = self._send(spec, binary, ["get_server_list"])
        if not listed.ok:
            raise self._error(spec, f"get_server_list failed: {listed.detail}")
        lines = limit_commands(spec, parse_server_list(listed.stdout))
        if not lines:
            return
        applied = self._send(spec, binary, lines)
        if not applied.ok:
            raise self._error(spec, f"setting the limits failed: {applied.detail}")
        if spec.active_thread_percentage is not None:
            # Read back: the v2 interface has no status per command, so this is how a refused value shows.
            probe = self._send(spec, binary, [HEALTH_PROBE])
            found = parse_percentage(probe.stdout) if probe.ok else None
            if found != spec.active_thread_percentage:
                raise self._error(
                    spec,
                    f"set the default active thread percentage to {spec.active_thread_percentage} "
                    f"but the daemon reports {found if found is not None else probe.detail or probe.stdout!r}",
                )

    def _send(self, spec: MpsDaemonSpec, binary: str, lines: Sequence[str]) -> _Reply:
        """One control session; never raises (a missing daemon is an answer, not an error)."""
        try:
            done = self.run(
                [binary],
                input="".join(f"{line}\n" for line in lines),
                capture_output=True,
                text=True,
                timeout=self.timeouts.command_s,
                check=False,
                env=self._env(spec, binary),
            )
        except subprocess.TimeoutExpired:
            return _Reply(False, "", f"the control pipe did not answer in {self.timeouts.command_s:g} s")
        except OSError as exc:
            return _Reply(False, "", f"running {binary} failed: {exc}")
        if done.returncode != 0:
            said = _one_line(done.stderr or done.stdout or "")
            return _Reply(
                False,
                done.stdout or "",
                f"no daemon answered on {spec.pipe_directory} "
                f"(exit status {done.returncode}{': ' + said if said else ''})",
            )
        return _Reply(True, done.stdout or "", "")

    def _env(self, spec: MpsDaemonSpec, binary: str) -> dict[str, str]:
        env = {
            "PATH": f"{os.path.dirname(binary)}:{BASE_PATH}",
            "CUDA_VISIBLE_DEVICES": ",".join(spec.visible_uuids),
            "CUDA_MPS_PIPE_DIRECTORY": spec.pipe_directory,
            "CUDA_MPS_LOG_DIRECTORY": spec.log_directory,
        }
        if self.driver_root is not None:
            # The daemon and its servers load libcuda; the container's loader does not know the driver root.
            env["LD_LIBRARY_PATH"] = ":".join(driver_library_dirs(self.driver_root, self.machine))
        return env

    # -- finding the binary -----------------------------------------------------------------------------------

    def _search_dirs(self) -> list[str]:
        if self.driver_root is None:
            return []
        return [os.path.join(self.driver_root, rel) for rel in NVIDIA_SMI_DIRS]

    def _find_binary(self) -> str | None:
        if self.driver_root is None:
            return shutil.which(CONTROL)
        for directory in self._search_dirs():
            path = os.path.join(directory, CONTROL)
            if os.path.isfile(path) and os.access(path, os.X_OK):
                return path
        return None

    def _binary(self) -> str:
        binary = self._find_binary()
        if binary is None:
            raise MpsError(self._not_found())
        return binary

    def _not_found(self) -> str:
        where = ", ".join(self._search_dirs()) or "PATH (no --driver-root given)"
        return (
            f"{CONTROL} not found (looked in {where}). Fix: set --driver-root (DRA_DRIVER_DRIVER_ROOT) to the host "
            f"driver root as mounted in this container (e.g. /run/nvidia/driver with the GPU Operator), whose "
            f"usr/bin holds the driver's {CONTROL}"
        )

    # -- /proc ----------------------------------------------------------------------------------------------------

    def _pid_in_file(self, spec: MpsDaemonSpec) -> int | None:
        try:
            with open(os.path.join(spec.pipe_directory, PID_FILE)) as f:
                text = f.read().strip()
        except OSError:
            return None
        return int(text) if text.isdigit() and int(text) > 0 else None

    def _our_pid(self, spec: MpsDaemonSpec) -> int | None:
        pid = self._pid_in_file(spec)
        return pid if pid is not None and self._is_our_daemon(pid, spec) else None

    def _is_our_daemon(self, pid: int, spec: MpsDaemonSpec) -> bool:
        """A live `nvidia-cuda-mps-control` whose environment names this pipe directory."""
        if not self._alive(pid):
            return False
        argv = self._read_proc(pid, "cmdline").split(b"\0")
        # A script (a wrapper, or the tests' stand-in) runs as `<interpreter> <script>`.
        if not any(os.path.basename(arg) == CONTROL.encode() for arg in argv[:2]):
            return False
        try:
            environ = self._read_proc(pid, "environ", missing_ok=False)
        except PermissionError:
            return True  # cannot look (no ptrace access): the cmdline and our pid file are what we have
        except OSError:
            return False
        wanted = f"CUDA_MPS_PIPE_DIRECTORY={spec.pipe_directory}".encode()
        return wanted in environ.split(b"\0")

    def _alive(self, pid: int) -> bool:
        """Running and not a zombie: a daemon that exited stays a zombie until whoever inherited it reaps it."""
        stat = self._read_proc(pid, "stat")
        state = stat.rpartition(b")")[2].split()[:1]
        return bool(state) and state[0] not in (b"Z", b"X")

    def _read_proc(self, pid: int, name: str, *, missing_ok: bool = True) -> bytes:
        try:
            with open(os.path.join(self.proc_root, str(pid), name), "rb") as f:
                return f.read()
        except OSError:
            if missing_ok:
                return b""
            raise

    def _pid_story(self, spec: MpsDaemonSpec) -> str:
        pid = self._pid_in_file(spec)
        if pid is None:
            return f"no pid in {spec.pipe_directory}/{PID_FILE}"
        if not self._alive(pid):
            return f"the pid file names {pid}, which has exited"
        if not self._is_our_daemon(pid, spec):
            return f"the pid file names {pid}, which is not this directory's {CONTROL}"
        return f"daemon pid {pid}"

    # -- shm ------------------------------------------------------------------------------------------------------

    def _shm_mounted(self, spec: MpsDaemonSpec) -> bool:
        try:
            with open(self.mountinfo_path) as f:
                text = f.read()
        except OSError:
            return False
        return os.path.normpath(spec.shm_directory) in mount_points(text)

    def _ensure_shm(self, spec: MpsDaemonSpec) -> None:
        if not self.mount_shm or self._shm_mounted(spec):
            return
        try:
            with open(self.meminfo_path) as f:
                meminfo: str | None = f.read()
        except OSError:
            meminfo = None
        self._mount_step(spec, shm_mount_command(spec.shm_directory, shm_size(meminfo)))

    def _release_shm(self, spec: MpsDaemonSpec) -> None:
        if self.mount_shm and self._shm_mounted(spec):
            self._mount_step(spec, ["umount", spec.shm_directory])

    def _mount_step(self, spec: MpsDaemonSpec, argv: list[str]) -> None:
        try:
            done = self.run(
                argv,
                capture_output=True,
                text=True,
                timeout=self.timeouts.command_s,
                check=False,
                env={"PATH": BASE_PATH + ":/usr/sbin:/sbin"},
            )
        except (subprocess.TimeoutExpired, OSError) as exc:
            raise self._error(spec, f"`{' '.join(argv)}` failed: {exc}") from None
        if done.returncode != 0:
            said = _one_line(done.stderr or done.stdout or "")
            raise self._error(spec, f"`{' '.join(argv)}` exited {done.returncode}: {said or '(no output)'}")

    # -- cgroup ---------------------------------------------------------------------------------------------------

    def _cgroup_dir(self, spec: MpsDaemonSpec) -> str | None:
        return None if self.cgroup_root is None else os.path.join(self.cgroup_root, CGROUP_PARENT, spec.id)

    def _escape_cgroup(self, spec: MpsDaemonSpec, pid: int) -> None:
        directory = self._cgroup_dir(spec)
        if directory is None:
            return
        try:
            os.makedirs(directory, exist_ok=True)
            with open(os.path.join(directory, "cgroup.procs"), "w") as f:
                f.write(f"{pid}\n")
        except OSError as exc:
            log.warning(
                "mps daemon left in the plugin's cgroup: it will not survive a restart of the plugin container",
                daemon=spec.id,
                pid=pid,
                cgroup=directory,
                error=str(exc),
            )

    def _remove_cgroup(self, spec: MpsDaemonSpec) -> None:
        directory = self._cgroup_dir(spec)
        if directory is None:
            return
        try:
            os.rmdir(directory)
        except FileNotFoundError:
            pass
        except OSError as exc:
            log.warning("mps daemon cgroup not removed", daemon=spec.id, cgroup=directory, error=str(exc))

    # -- helpers --------------------------------------------------------------------------------------------------

    def _poll(self, done: Callable[[], bool], timeout_s: float) -> bool:
        """True as soon as `done()` is; False when it still is not at the deadline (checked once more there)."""
        deadline = time.monotonic() + timeout_s
        while True:
            if done():
                return True
            left = deadline - time.monotonic()
            if left <= 0:
                return False
            time.sleep(min(self.timeouts.poll_interval_s, left))

    def _error(self, spec: MpsDaemonSpec, what: str) -> MpsError:
        return MpsError(f"MPS daemon {spec.id} ({spec.directory}): {what}; see {spec.log_directory}/{CONTROL_LOG}")


def _one_line(text: str) -> str:
    return " ".join(text.split())[:300]


__all__ = ["HostMpsControl", "MpsTimeouts", "Runner"]
