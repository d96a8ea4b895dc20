"""The bench's child processes (kubelet plugins, control-plane binaries, containerd): stopped as a kubelet stops a
container, SIGTERM first and SIGKILL when it does not exit in time."""

from __future__ import annotations

import signal
import subprocess

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
