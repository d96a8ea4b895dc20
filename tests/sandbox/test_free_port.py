"""`free_tcp_port` hands out ports the kernel never gives a bind(0) or an outgoing connection (below the ephemeral
range), so a port picked now and bound later cannot be taken meanwhile by another process's ephemeral bind."""

from __future__ import annotations

import secrets
import socket
from pathlib import Path

import pytest

from dra_sandbox.cluster import _ephemeral_low, free_tcp_port


def test_ports_are_below_the_ephemeral_range_and_bindable() -> None:
    low = _ephemeral_low()
    for _ in range(20):
        port = free_tcp_port()
        assert 10000 <= port < low
        with socket.socket() as s:
            s.bind(("127.0.0.1", port))  # still free


def test_a_port_in_use_is_passed_over(monkeypatch: pytest.MonkeyPatch) -> None:
    import dra_sandbox.cluster as cluster

    low = cluster._PICKED_PORTS[0]
    held_port, spare = free_tcp_port(), free_tcp_port()
    with socket.socket() as held:
        held.bind(("127.0.0.1", held_port))
        held.listen(1)
        picks = iter([held_port - low, spare - low])
        monkeypatch.setattr(secrets, "randbelow", lambda n: next(picks))
        assert free_tcp_port() == spare  # the held one was tried first and skipped


def test_the_range_file_is_read_and_a_bad_one_falls_back(tmp_path: Path) -> None:
    good = tmp_path / "range"
    good.write_text("40000\t60999\n")
    assert _ephemeral_low(good) == 40000
    assert _ephemeral_low(tmp_path / "missing") == 32768
    (tmp_path / "bad").write_text("x\n")
    assert _ephemeral_low(tmp_path / "bad") == 32768
