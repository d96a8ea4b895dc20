"""A stand-in `nvidia-cuda-mps-control` for the tests of `dra_driver.nvml.real.mps`.

Installed as `<driver-root>/usr/bin/nvidia-cuda-mps-control` with a `#!<python>` line. Like the real program:

- `-d` forks a background daemon (double fork, new session) and returns; the daemon writes
  `nvidia-cuda-mps-control.pid` into $CUDA_MPS_PIPE_DIRECTORY, listens there on a unix socket, and appends every
  command to $CUDA_MPS_LOG_DIRECTORY/control.log.
- without arguments it is the front end: stdin lines go to the daemon, replies come on stdout; exit status 1
  when no daemon listens on the pipe directory.
- `quit` makes the daemon remove its pid file and socket and exit.

For the tests only, the daemon also writes into the log directory:
`standin-env.json` (the environment it was started with, and whether the `-d` front process led its own
session) and `standin-state.json` (defaults and servers after every command), and it takes
`standin_add_server <pid>` to pretend a server runs. Files the test puts in the log directory change behaviour:
`standin-ignore-quit` (answer `quit` but keep running; containing `term`: ignore SIGTERM as well).

Every daemon appends its pid to `<this file>.daemons` so that the test fixtures can kill any that is left, and
exits on its own after IDLE_EXIT_S without a connection in case a test run is killed before its teardown.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import sys
import traceback
from dataclasses import dataclass, field
from types import FrameType

PID_FILE = "nvidia-cuda-mps-control.pid"
SOCKET = "control"
CONTROL_LOG = "control.log"
ENV_FILE = "standin-env.json"
STATE_FILE = "standin-state.json"
IGNORE_QUIT = "standin-ignore-quit"
IDLE_EXIT_S = 300.0
RECORDED_ENV = ("CUDA_VISIBLE_DEVICES", "CUDA_MPS_PIPE_DIRECTORY", "CUDA_MPS_LOG_DIRECTORY", "PATH", "LD_LIBRARY_PATH")


@dataclass
class Server:
    active_thread_percentage: int | None = None
    pinned: dict[str, str] = field(default_factory=dict)


@dataclass
class Daemon:
    pipe: str
    log: str
    default_active_thread_percentage: int = 100
    default_pinned: dict[str, str] = field(default_factory=dict)
    servers: dict[int, Server] = field(default_factory=dict)
    running: bool = True

    def note(self, text: str) -> None:
        with open(os.path.join(self.log, CONTROL_LOG), "a") as f:
            f.write(f"[{os.getpid()}] {text}\n")

    def save(self) -> None:
        state = {
            "pid": os.getpid(),
            "default_active_thread_percentage": self.default_active_thread_percentage,
            "default_pinned": self.default_pinned,
            "servers": {
                str(pid): {"active_thread_percentage": s.active_thread_percentage, "pinned": s.pinned}
                for pid, s in self.servers.items()
            },
        }
        with open(os.path.join(self.log, STATE_FILE), "w") as f:
            json.dump(state, f)

    def handle(self, line: str) -> str:
        self.note(line)
        words = line.split()
        if not words:
            return ""
        match words:
            case ["get_default_active_thread_percentage"]:
                return f"{float(self.default_active_thread_percentage):.1f}"
            case ["set_default_active_thread_percentage", pct] if _percentage(pct):
                self.default_active_thread_percentage = int(pct)
                return ""
            case ["set_default_device_pinned_mem_limit", dev, value]:
                self.default_pinned[dev] = value
                return ""
            case ["get_default_device_pinned_mem_limit", dev]:
                return self.default_pinned.get(dev, "0")
            case ["get_server_list"]:
                return "\n".join(str(pid) for pid in self.servers)
            case ["set_active_thread_percentage", pid, pct] if _percentage(pct) and _server(self, pid):
                self.servers[int(pid)].active_thread_percentage = int(pct)
                return ""
            case ["set_device_pinned_mem_limit", pid, dev, value] if _server(self, pid):
                self.servers[int(pid)].pinned[dev] = value
                return ""
            case ["standin_add_server", pid] if pid.isdigit():
                self.servers[int(pid)] = Server()
                return ""
            case ["quit"]:
                if os.path.exists(os.path.join(self.log, IGNORE_QUIT)):
                    self.note("quit ignored")
                    return ""
                self.running = False
                return ""
        self.note(f"refused: {line}")
        return f"Invalid command or argument: {line}"


def _percentage(text: str) -> bool:
    return text.isdigit() and 1 <= int(text) <= 100


def _server(daemon: Daemon, pid: str) -> bool:
    return pid.isdigit() and int(pid) in daemon.servers


def serve(daemon: Daemon, listener: socket.socket) -> None:
    listener.settimeout(IDLE_EXIT_S)
    while daemon.running:
        try:
            conn, _ = listener.accept()
        except TimeoutError:
            daemon.note("idle for too long; exiting")
            return
        with conn:
            conn.settimeout(10.0)
            data = b""
            while chunk := conn.recv(65536):
                data += chunk
            replies = [daemon.handle(line) for line in data.decode().splitlines()]
            daemon.save()
            conn.sendall("".join(f"{r}\n" for r in replies if r).encode())


def run_daemon(pipe: str, log: str, front_led_session: bool, multi_user: bool = False) -> None:
    os.chdir(pipe)  # the socket is bound by relative name: tmp paths may exceed the 108-byte sun_path limit
    with open(f"{sys.argv[0]}.daemons", "a") as f:
        f.write(f"{os.getpid()}\n")
    daemon = Daemon(pipe=pipe, log=log)
    ignore = os.path.join(log, IGNORE_QUIT)
    if os.path.exists(ignore):
        with open(ignore) as f:
            if "term" in f.read():

                def ignore_term(signum: int, frame: FrameType | None) -> None:
                    daemon.note("SIGTERM ignored")

                signal.signal(signal.SIGTERM, ignore_term)
    with open(os.path.join(log, ENV_FILE), "w") as f:
        json.dump(
            {
                "env": {k: os.environ.get(k) for k in RECORDED_ENV},
                "front_led_session": front_led_session,
                "multi_user": multi_user,
            },
            f,
        )
    if os.path.exists(SOCKET):
        os.unlink(SOCKET)  # left by a daemon that was killed
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(SOCKET)
    listener.listen(8)
    daemon.save()
    # The pid file last: whoever reads it may connect right away.
    with open(PID_FILE + ".tmp", "w") as f:
        f.write(f"{os.getpid()}\n")
    os.rename(PID_FILE + ".tmp", PID_FILE)
    daemon.note("daemon started")
    try:
        serve(daemon, listener)
    finally:
        listener.close()
        daemon.note("daemon exiting")
        for name in (SOCKET, PID_FILE):
            with contextlib.suppress(FileNotFoundError):
                os.unlink(os.path.join(pipe, name))


def daemonise(pipe: str, log: str, multi_user: bool = False) -> int:
    front_led_session = os.getsid(0) == os.getpid()
    child = os.fork()
    if child:
        _, status = os.waitpid(child, 0)
        return os.waitstatus_to_exitcode(status)
    os.setsid()
    if os.fork():
        os._exit(0)
    # Stdout and stderr stay as inherited: the caller must not depend on a daemon closing them.
    try:
        run_daemon(pipe, log, front_led_session, multi_user)
    except BaseException:
        with open(os.path.join(log, CONTROL_LOG), "a") as f:
            f.write(traceback.format_exc())
    finally:
        os._exit(0)


def front(pipe: str) -> int:
    lines = sys.stdin.read()
    conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        os.chdir(pipe)
        conn.connect(SOCKET)
    except OSError as exc:
        print(f"Cannot find MPS control daemon process ({exc})", file=sys.stderr)
        return 1
    with conn:
        conn.settimeout(10.0)
        conn.sendall(lines.encode())
        conn.shutdown(socket.SHUT_WR)
        reply = b""
        while chunk := conn.recv(65536):
            reply += chunk
    sys.stdout.write(reply.decode())
    return 0


def main(argv: list[str]) -> int:
    pipe = os.environ.get("CUDA_MPS_PIPE_DIRECTORY", "/tmp/nvidia-mps")
    log = os.environ.get("CUDA_MPS_LOG_DIRECTORY", "/var/log/nvidia-mps")
    if argv in (["-d"], ["-d", "-M"]):
        return daemonise(pipe, log, multi_user=argv == ["-d", "-M"])
    if argv:
        print(f"usage: {os.path.basename(sys.argv[0])} [-d [-M]]", file=sys.stderr)
        return 2
    return front(pipe)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
