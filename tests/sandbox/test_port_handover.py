"""Ports of the sandbox's own servers cannot be taken by anyone else between choosing and binding (issue 38):
each kubelet plugin binds port 0 and reports the ports the kernel gave it (`--ports-file`), and the controller's
webhook port is held by the sandbox (reserve_tcp_port) from before the server binds it until after it stopped."""

from __future__ import annotations

import json
import shutil
import socket
import stat
import tempfile
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from dra_driver.ports import read_ports_file, write_ports_file
from dra_sandbox.cluster import ClusterConfig, NodeSpec, SandboxCluster, reserve_tcp_port


def test_a_ports_file_is_written_whole_and_read_back(tmp_path: Path) -> None:
    path = tmp_path / "ports.json"
    assert read_ports_file(path) is None
    write_ports_file(path, {"healthz": 40123, "metrics": 40124})
    assert json.loads(path.read_text()) == {"healthz": 40123, "metrics": 40124}
    assert read_ports_file(path) == {"healthz": 40123, "metrics": 40124}
    assert stat.S_IMODE(path.stat().st_mode) == 0o644
    assert [p.name for p in tmp_path.iterdir()] == ["ports.json"]  # no temp file left


@pytest.mark.parametrize("text", ["", "[1]", '{"healthz": "x"}', '{"healthz": 0}', '{"healthz": true}'])
def test_a_file_that_is_not_a_ports_file_is_an_error(tmp_path: Path, text: str) -> None:
    path = tmp_path / "ports.json"
    path.write_text(text)
    with pytest.raises(ValueError, match="not a ports file"):
        read_ports_file(path)


def test_a_held_port_is_refused_to_others_and_joined_by_the_server() -> None:
    held = reserve_tcp_port()
    port = held.getsockname()[1]
    try:
        for host in ("127.0.0.1", "0.0.0.0"):  # the wildcard overlaps the held address too
            with socket.socket() as other, pytest.raises(OSError):
                other.bind((host, port))
        # The server (the webhook's aiohttp site: reuse_address) binds it beside the reservation and gets the
        # connections: the held socket never listens. Once it listens, nobody else binds the port at all.
        with socket.socket() as server:
            server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            server.bind(("127.0.0.1", port))
            server.listen(1)
            with socket.socket() as late, pytest.raises(OSError):
                late.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
                late.bind(("127.0.0.1", port))
            with socket.create_connection(("127.0.0.1", port), timeout=5):
                conn, _ = server.accept()
                conn.close()
    finally:
        held.close()
    with socket.socket() as after:
        after.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # the connection above is in TIME_WAIT
        after.bind(("127.0.0.1", port))  # let go on close


def test_reservations_never_share_a_port_and_bind_0_never_gets_one() -> None:
    held = [reserve_tcp_port() for _ in range(500)]
    try:
        ports = {h.getsockname()[1] for h in held}
        assert len(ports) == len(held)
        for _ in range(500):
            with socket.socket() as other:
                other.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
                other.bind(("127.0.0.1", 0))
                assert other.getsockname()[1] not in ports
    finally:
        for h in held:
            h.close()


def _get(port: int, path: str) -> int:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=5) as answer:
        return int(answer.status)


@pytest.fixture
def short_dir() -> Iterator[Path]:
    path = Path(tempfile.mkdtemp(dir="/tmp", prefix="ports-t-"))  # short: AF_UNIX paths
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.mark.slow  # sandboxes one after another; one start and stop is in every sandbox test
def test_a_sandbox_started_and_stopped_again_and_again_never_collides(short_dir: Path) -> None:
    """Starts and stops a one-node sandbox with the controller's webhook several times in a row, each time with
    a second one running beside it: every plugin serves on the ports it reported, the webhook on the held port."""
    beside = SandboxCluster(ClusterConfig(work_dir=short_dir / "beside", nodes=[NodeSpec("b1", "fake:l4x2")],
                                          runtime="cdi-check"))
    with beside:
        seen: list[int] = []
        for round_ in range(4):
            config = ClusterConfig(work_dir=short_dir / f"run{round_}", nodes=[NodeSpec("n1", "fake:l4x2")],
                                   runtime="cdi-check", controller=round_ % 2 == 0, webhook=round_ % 2 == 0)
            with SandboxCluster(config) as cluster:
                plugin = cluster.plugins["n1"]
                ports = plugin.ports()
                assert ports is not None and set(ports) == {"healthz", "metrics"}
                assert int((plugin.dir / "healthz-port").read_text()) == ports["healthz"]
                assert _get(ports["healthz"], "/readyz") == 200
                assert _get(ports["metrics"], "/metrics") == 200
                assert beside.plugins["b1"].healthz() is not None  # the neighbour still serves on its own port
                if config.webhook:
                    with socket.socket() as other, pytest.raises(OSError):
                        other.bind(("127.0.0.1", cluster.webhook_port))  # held while it serves
                seen += ports.values()
        assert len(seen) == 8
