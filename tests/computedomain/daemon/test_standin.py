"""The stand-in nvidia-imex / nvidia-imex-ctl alone (dra_sandbox/imex): real TCP between loopback addresses,
quorum once every listed resolvable peer is connected, reload on SIGUSR1, the control tool's answers."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from dra_driver.computedomain.daemon.config import ImexConfig, render_hosts, render_imex_config, render_node_config
from dra_sandbox.imex import install_standins
from dra_sandbox.imex.standin import RELOAD_INTERVAL_ENV, STATE_FILE
from tests.computedomain.daemon.harness import DOMAIN_UID, Addresses
from tests.polling import wait_for

TIMEOUT = 20.0


class Node:
    def __init__(self, root: Path, bin_dir: Path, ip: str) -> None:
        self.dir = root / ip
        self.dir.mkdir()
        self.bin_dir = bin_dir
        self.ip = ip
        self.config = ImexConfig(str(self.dir), ip)
        Path(self.config.config_path).write_text(render_imex_config(self.config))
        Path(self.config.node_config_path).write_text(render_node_config(DOMAIN_UID, 4))
        self.process: subprocess.Popen[bytes] | None = None

    def hosts(self, addresses: tuple[str, ...]) -> None:
        Path(self.config.hosts_path).write_text(render_hosts(DOMAIN_UID, addresses))

    def start(self, reload_interval: float = 0.0) -> None:
        env = {**os.environ, RELOAD_INTERVAL_ENV: str(reload_interval)}
        self.process = subprocess.Popen([str(self.bin_dir / "nvidia-imex"), "-c", self.config.config_path], env=env,
                                        stderr=subprocess.PIPE)

    def ctl(self, flag: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([str(self.bin_dir / "nvidia-imex-ctl"), "-c", self.config.config_path, flag],
                              capture_output=True, text=True, timeout=TIMEOUT, check=False)

    def state(self) -> dict[str, Any]:
        value: dict[str, Any] = json.loads((self.dir / STATE_FILE).read_text())
        return value

    def query(self) -> str:
        return self.ctl("-q").stdout


@pytest.fixture
def nodes(tmp_path: Path) -> Iterator[list[Node]]:
    bin_dir = tmp_path / "bin"
    install_standins(bin_dir)
    addresses = Addresses()
    made = [Node(tmp_path, bin_dir, addresses.take()) for _ in range(3)]
    yield made
    for node in made:
        if node.process is not None and node.process.poll() is None:
            node.process.kill()
        if node.process is not None:
            node.process.wait(10)
            assert node.process.stderr is not None
            node.process.stderr.close()


def test_install_writes_executable_scripts_run_by_this_python(tmp_path: Path) -> None:
    install_standins(tmp_path / "b")
    for name in ("nvidia-imex", "nvidia-imex-ctl"):
        script = tmp_path / "b" / name
        assert os.access(script, os.X_OK)
        assert script.read_text().splitlines()[0] == f"#!{sys.executable} -IS"


def test_quorum_once_every_listed_peer_is_connected(nodes: list[Node]) -> None:
    a, b, _ = nodes
    mapping = (a.ip, b.ip, "127.0.0.2", "127.0.0.2")  # unused slots do not count
    for node in (a, b):
        node.hosts(mapping)
    a.start()
    wait_for(lambda: a.ctl("-q").returncode == 0, TIMEOUT, "a's control port answers")
    assert a.query() == "NOT_READY\n"  # b listed, not running
    table = a.ctl("-N").stdout
    assert f"   0  *  {a.ip}" in table and f"   1  N  {b.ip}" in table and "   2  I  127.0.0.2" in table
    b.start()
    wait_for(lambda: a.query() == "READY\n" and b.query() == "READY\n", TIMEOUT, "both READY")
    assert f"   1  C  {b.ip}" in a.ctl("-N").stdout
    # b goes away: a sees it disconnected and is not ready until the mapping drops it.
    assert b.process is not None
    b.process.terminate()
    assert b.process.wait(TIMEOUT) == 0
    wait_for(lambda: f"   1  D  {b.ip}" in a.ctl("-N").stdout, TIMEOUT, "b disconnected")
    assert a.query() == "NOT_READY\n"


def test_sigusr1_reloads_the_hosts_file_without_a_restart(nodes: list[Node]) -> None:
    a, b, c = nodes
    a.hosts((a.ip, b.ip, c.ip, "127.0.0.2"))
    b.hosts((a.ip, b.ip, c.ip, "127.0.0.2"))
    a.start()
    b.start()
    wait_for(lambda: a.ctl("-q").returncode == 0, TIMEOUT, "a answers")
    pid = a.state()["pid"]
    assert a.query() == "NOT_READY\n"  # c listed but absent
    a.hosts((a.ip, b.ip, "127.0.0.2", "127.0.0.2"))
    assert a.process is not None
    a.process.send_signal(signal.SIGUSR1)
    wait_for(lambda: a.query() == "READY\n", TIMEOUT, "a READY after the reload")
    state = a.state()
    assert (state["pid"], state["reloads"]) == (pid, 1) and a.process.poll() is None
    assert state["peers"] == {f"compute-domain-daemon-{DOMAIN_UID[:8]}-0001": {"address": b.ip, "state": "C"}}


def test_sigusr1_sooner_than_the_interval_is_dropped(nodes: list[Node]) -> None:
    a = nodes[0]
    a.hosts((a.ip,))
    a.start(reload_interval=60.0)
    wait_for(lambda: a.query() == "READY\n", TIMEOUT, "a alone READY")
    assert a.process is not None
    a.process.send_signal(signal.SIGUSR1)
    wait_for(lambda: a.state()["reloads"] == 1, TIMEOUT, "first reload")
    a.process.send_signal(signal.SIGUSR1)
    a.hosts((a.ip, nodes[1].ip))  # any later save shows the dropped count; a reload would add nodes[1]
    a.process.send_signal(signal.SIGUSR1)
    wait_for(lambda: a.ctl("-q").returncode == 0 and a.state()["reloads"] == 1, TIMEOUT, "still one reload")
    assert a.query() == "READY\n"  # the new mapping was not read


def test_a_node_that_is_not_in_its_own_map_is_not_ready(nodes: list[Node]) -> None:
    a, b, _ = nodes
    a.hosts((b.ip,))
    a.start()
    wait_for(lambda: a.ctl("-q").returncode == 0, TIMEOUT, "a answers")
    assert a.query() == "NOT_READY\n"


def test_sigterm_exits_0_and_ctl_then_fails_naming_the_address(nodes: list[Node]) -> None:
    a = nodes[0]
    a.hosts((a.ip,))
    a.start()
    wait_for(lambda: a.query() == "READY\n", TIMEOUT, "a READY")
    assert a.process is not None
    a.process.terminate()
    assert a.process.wait(TIMEOUT) == 0
    done = a.ctl("-q")
    assert (done.returncode, done.stdout) == (1, "") and f"{a.ip}:50005" in done.stderr


def test_a_config_it_cannot_serve_is_refused(nodes: list[Node]) -> None:
    a = nodes[0]
    Path(a.config.config_path).write_text(render_imex_config(a.config).replace("DAEMONIZE=0", "DAEMONIZE=1"))
    a.start()
    assert a.process is not None and a.process.wait(TIMEOUT) == 1
    assert a.process.stderr is not None and b"DAEMONIZE=1" in a.process.stderr.read()
