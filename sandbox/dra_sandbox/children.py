"""The bench's child processes (kubelet plugins, control-plane binaries, containerd): stopped as a kubelet stops a
container, SIGTERM first and SIGKILL when it does not exit in time."""

from __future__ import annotations

import signal
import subprocess
from pathlib import Path

KILL_WAIT_S = 10.0  # for a SIGKILLed process to be reaped


def terminate(process: subprocess.Popen[bytes] | None, timeout: float) -> int | None:
    """SIGTERM, then SIGKILL when the process has not exited within `timeout` seconds; its exit status (None: it
    never started)."""
    if process is None:
        return None
    if process.poll() is not None:
        return process.returncode
    process.send_signal(signal.SIGTERM)
    try:
        return process.wait(timeout)
    except subprocess.TimeoutExpired:
        process.kill()
        return process.wait(KILL_WAIT_S)


def kill(process: subprocess.Popen[bytes] | None) -> None:
    """SIGKILL a running process and reap it (a crash, as the campaigns make them)."""
    if process is not None and process.poll() is None:
        process.kill()
        process.wait(KILL_WAIT_S)


def cmdline(pid: int) -> list[str]:
    """The argv of process `pid` as /proc shows it; [] when it is gone (or not ours to read)."""
    try:
        raw = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return []
    return [part.decode(errors="replace") for part in raw.split(b"\0") if part]


def alive(pid: int) -> bool:
    """Process `pid` exists and has not exited (a zombie, exited but not yet reaped, is not alive)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[-1].split()[0] != "Z"
