"""Every process of ours that listens on a port a flag names (kubelet plugin: --healthz-port, --metrics-port;
controller: --healthz-port, --metrics-port, --webhook-port; the sandbox API server: --port) exits non-zero with ONE
line naming the flag when the port is taken, never a traceback. Real processes, real taken ports."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from dra_sandbox.apiserver import ApiServer

ENV = {k: v for k, v in os.environ.items() if not k.startswith("DRA_DRIVER_")}


@pytest.fixture
def taken() -> Iterator[int]:
    """A port some other process listens on (as a metrics exporter already running on the node would)."""
    with socket.socket() as holder:
        holder.bind(("0.0.0.0", 0))
        holder.listen(1)
        yield int(holder.getsockname()[1])


@pytest.fixture
def kubeconfig(tmp_path: Path) -> Iterator[Path]:
    with ApiServer() as srv:
        yield srv.write_kubeconfig(tmp_path / "kubeconfig")


def _run(*argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, *argv], capture_output=True, text=True, timeout=120, check=False, env=ENV)


def _one_line_error(done: subprocess.CompletedProcess[str], expected: str) -> None:
    assert done.returncode == 1, done.stdout + done.stderr
    assert "Traceback" not in done.stderr
    lines = [line for line in done.stderr.splitlines() if expected in line]
    assert len(lines) == 1, done.stderr
    assert len(lines[0]) < 200


def _plugin(tmp_path: Path, kubeconfig: Path, *flags: str) -> subprocess.CompletedProcess[str]:
    (tmp_path / "boot_id").write_text("b\n")
    return _run("-m", "dra_driver.cli", "kubelet-plugin", "--node-name", "node-a", "--kubeconfig", str(kubeconfig),
                "--nvml", f"fake:l4x2,state={tmp_path / 'nvml.json'}", "--plugin-dir", str(tmp_path / "p"),
                "--registry-dir", str(tmp_path / "r"), "--cdi-root", str(tmp_path / "cdi"),
                "--boot-id-path", str(tmp_path / "boot_id"), *flags)  # fmt: skip


@pytest.mark.parametrize("flag", ["--metrics-port", "--healthz-port"])
def test_kubelet_plugin_with_a_taken_port(tmp_path: Path, kubeconfig: Path, taken: int, flag: str) -> None:
    other = "--healthz-port" if flag == "--metrics-port" else "--metrics-port"
    done = _plugin(tmp_path, kubeconfig, flag, str(taken), other, "-1")
    _one_line_error(done, f"cannot start: {flag} {taken}: address already in use; choose another port, or -1 to "
                          "disable it")  # fmt: skip
    assert not list((tmp_path / "r").glob("*.sock"))  # nothing was served


@pytest.mark.parametrize(("flag", "fix"), [
    ("--healthz-port", "or -1 to disable it"),
    ("--metrics-port", "or -1 to disable it"),
    ("--webhook-port", "choose another port"),
])  # fmt: skip
def test_controller_with_a_taken_port(kubeconfig: Path, taken: int, flag: str, fix: str) -> None:
    ports = {"--healthz-port": "-1", "--metrics-port": "-1", "--webhook-port": "0", flag: str(taken)}
    webhook = ["--webhook"] if flag == "--webhook-port" else []
    done = _run("-m", "dra_driver.cli", "controller", "--kubeconfig", str(kubeconfig), *webhook,
                *[x for pair in ports.items() for x in pair])  # fmt: skip
    _one_line_error(done, f"dra-driver controller: cannot start: {flag} {taken}: address already in use")
    assert fix in done.stderr


def test_sandbox_api_server_with_a_taken_port(tmp_path: Path, taken: int) -> None:
    done = _run("-m", "dra_sandbox", "apiserver", "--kubeconfig-out", str(tmp_path / "kc"), "--host", "0.0.0.0",
                "--port", str(taken))  # fmt: skip
    _one_line_error(done, f"sandbox apiserver: --port {taken}: address already in use")
    assert not (tmp_path / "kc").exists()
