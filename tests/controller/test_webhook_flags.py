"""The webhook's listening flags of the controller command: `--webhook-bind-address` (env DRA_DRIVER_WEBHOOK_BIND_ADDRESS)
decides where it listens, and bad values of it or of `--webhook-max-request-bytes` stop the controller with one line
naming the flag (exit 2) before anything is served."""

from __future__ import annotations

import http.client
import json
import os
import socket
import ssl
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from dra_driver.cli import main
from dra_sandbox.apiserver import ApiServer
from dra_sandbox.cluster import free_tcp_port, make_test_certs
from tests.polling import wait_for

ENV = {k: v for k, v in os.environ.items() if not k.startswith("DRA_DRIVER_")}
TIMEOUT = 30.0


@pytest.fixture
def kubeconfig(tmp_path: Path) -> Iterator[Path]:
    with ApiServer() as srv:
        yield srv.write_kubeconfig(tmp_path / "kubeconfig")


def controller(kubeconfig: Path, *flags: str) -> list[str]:
    return [sys.executable, "-m", "dra_driver.cli", "controller", "--kubeconfig", str(kubeconfig), "--healthz-port",
            "-1", "--metrics-port", "-1", "--webhook", *flags]


@pytest.mark.parametrize(("flags", "env", "expected"), [
    (("--webhook-bind-address", "pod-ip"), {}, "--webhook-bind-address 'pod-ip' is not an IP address; give 0.0.0.0 "
     "(every IPv4 address), :: (every IPv6 address) or one of this host's addresses"),
    ((), {"DRA_DRIVER_WEBHOOK_BIND_ADDRESS": ""}, "--webhook-bind-address '' is not an IP address"),
    (("--webhook-max-request-bytes", "65536"), {}, "--webhook-max-request-bytes 65536 is below 1048576 (1 MiB); the "
     "API server sends reviews of several MiB (docs/webhook.md)"),
])  # fmt: skip
def test_a_bad_flag_stops_the_controller_naming_it(tmp_path: Path, flags: tuple[str, ...], env: dict[str, str],
                                                  expected: str, monkeypatch: pytest.MonkeyPatch,
                                                  capsys: pytest.CaptureFixture[str]) -> None:
    """In process (the checks come before any connection); the API server is never reached."""
    for name in [k for k in os.environ if k.startswith("DRA_DRIVER_")]:
        monkeypatch.delenv(name)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    argv = controller(tmp_path / "no-kubeconfig", *flags)[3:]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"dra-driver controller: {expected}"), err
    assert len(err.splitlines()) == 1, err


def accepts(host: str, port: int) -> bool:
    try:
        with socket.create_connection((host, port), timeout=1):
            return True
    except OSError:
        return False


def test_the_webhook_listens_on_the_bind_address_only(tmp_path: Path, kubeconfig: Path) -> None:
    """127.0.0.2 is a loopback address of its own on Linux: listening there, the webhook does not answer on
    127.0.0.1 (as the chart's pod IP keeps it off the pod's loopback)."""
    make_test_certs(tmp_path)
    port = free_tcp_port()
    flags = ("--webhook-port", str(port), "--webhook-cert", str(tmp_path / "tls.crt"), "--webhook-key",
             str(tmp_path / "tls.key"))
    proc = subprocess.Popen(controller(kubeconfig, *flags), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            env={**ENV, "DRA_DRIVER_WEBHOOK_BIND_ADDRESS": "127.0.0.2"})
    try:
        wait_for(lambda: accepts("127.0.0.2", port) or proc.poll() is not None, TIMEOUT, "the webhook listening")
        assert proc.poll() is None, proc.communicate()[0]
        assert not accepts("127.0.0.1", port)
        # It is our webhook there: the test certificate names 127.0.0.1 only, so the name is not checked.
        context = ssl.create_default_context(cafile=str(tmp_path / "ca.crt"))
        context.check_hostname = False
        conn = http.client.HTTPSConnection("127.0.0.2", port, context=context, timeout=TIMEOUT)
        try:
            conn.request("POST", "/elsewhere", body=b"{}", headers={"Content-Type": "application/json"})
            answer = conn.getresponse()
            assert answer.status == 404
            assert json.loads(answer.read())["message"].startswith("no admission webhook at '/elsewhere'")
        finally:
            conn.close()
    finally:
        proc.terminate()
        output = proc.communicate(timeout=TIMEOUT)[0]
    assert proc.returncode == 0, output
