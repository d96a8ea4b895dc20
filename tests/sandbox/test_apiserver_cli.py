"""`dra-sandbox apiserver` in the foreground: flags and DRA_DRIVER_* env, kubeconfig, clean stop."""

from __future__ import annotations

import json
import os
import signal
import stat
import subprocess
import sys
import urllib.request
from pathlib import Path

import pytest
import yaml

from dra_sandbox import cli
from tests.polling import wait_for


def wait_for_file(path: Path, proc: subprocess.Popen[str], timeout: float = 20.0) -> None:
    def written() -> bool:
        if path.exists():
            return True
        if proc.poll() is not None:
            raise AssertionError(f"server exited early: {proc.communicate()}")
        return False

    wait_for(written, timeout, f"the server to write its kubeconfig {path}")


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_serves_until_signalled(tmp_path: Path, sig: signal.Signals) -> None:
    kubeconfig = tmp_path / "kube" / "config"
    env = {**os.environ, "DRA_DRIVER_KUBE_VERSION": "1.36.1", "DRA_DRIVER_KUBECONFIG_OUT": str(kubeconfig)}
    proc = subprocess.Popen([sys.executable, "-m", "dra_sandbox", "apiserver"], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        wait_for_file(kubeconfig, proc)
        assert stat.S_IMODE(kubeconfig.stat().st_mode) == 0o600
        server = yaml.safe_load(kubeconfig.read_text())["clusters"][0]["cluster"]["server"]
        with urllib.request.urlopen(server + "/version", timeout=5) as resp:
            assert json.loads(resp.read())["gitVersion"] == "v1.36.1"
        proc.send_signal(sig)
        out, err = proc.communicate(timeout=15)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, err
    assert f"listening on {server}" in out and "stopped" in out


def test_port_in_use_fails_cleanly(tmp_path: Path) -> None:
    from dra_sandbox.apiserver import ApiServer

    with ApiServer() as busy:
        result = subprocess.run([sys.executable, "-m", "dra_sandbox", "apiserver",
                                 "--kubeconfig-out", str(tmp_path / "config"), "--port", str(busy.port)],
                                capture_output=True, text=True, timeout=30)
    assert result.returncode == 1
    assert f"sandbox apiserver: --port {busy.port}: address already in use" in result.stderr
    assert "Traceback" not in result.stderr
    assert not (tmp_path / "config").exists()


def test_bench_parser_has_the_apiserver_and_requires_a_subcommand() -> None:
    args = cli.parser().parse_args(["apiserver", "--kubeconfig-out", "/tmp/x", "--port", "7443"])
    assert (args.command, args.port, args.kube_version) == ("apiserver", 7443, "1.37.0")
    with pytest.raises(SystemExit):
        cli.parser().parse_args([])  # a subcommand is required
