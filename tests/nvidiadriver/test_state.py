"""The driver-state board: changes notify listeners once, repeats do not."""

from __future__ import annotations

from dra_driver.nvidiadriver.state import (
    DriverState,
    DriverStatus,
    DriverStatusBoard,
    PluginProbes,
)


def test_changes_notify_and_repeats_do_not() -> None:
    board = DriverStatusBoard(clock=lambda: 5.0)
    seen: list[tuple[DriverState, DriverState]] = []
    board.listen(lambda before, after: seen.append((before.state, after.state)))
    assert not board.ready and board.status().reason == "not checked yet"
    board.set(DriverState.NOT_READY, "no /dev/nvidiactl")
    board.set(DriverState.NOT_READY, "no  /dev/nvidiactl\n")  # the same reason, spaced differently
    ready = board.set(DriverState.READY, driver_version="580.1.2")
    assert ready == DriverStatus(DriverState.READY, "", 5.0, "580.1.2") and board.ready
    reloading = board.set(DriverState.RELOADING, "driver 580.1.2 unloaded")
    assert reloading.driver_version == "580.1.2" and reloading.annotation() == "reloading: driver 580.1.2 unloaded"
    assert seen == [
        (DriverState.NOT_READY, DriverState.NOT_READY),
        (DriverState.NOT_READY, DriverState.READY),
        (DriverState.READY, DriverState.RELOADING),
    ]


def test_a_plugins_probes_say_driver_then_start_then_sockets() -> None:
    asked: list[str] = []

    def sockets() -> tuple[bool, str]:
        asked.append("sockets")
        return False, "registration socket: connection refused"

    board = DriverStatusBoard()
    probes = PluginProbes(board, starting="starting: x")
    board.set(DriverState.NOT_READY, "no libnvidia-ml.so.1")
    assert probes.readiness() == (False, "driver not ready: no libnvidia-ml.so.1")
    assert probes.liveness() == (True, "alive, not serving yet (driver not ready: no libnvidia-ml.so.1)")
    board.set(DriverState.READY, driver_version="580.65.06")
    assert probes.readiness() == (False, "starting: x")
    assert asked == []  # the sockets are asked only once the plugin serves
    probes.serving(sockets)
    assert probes.readiness() == (False, "registration socket: connection refused")
    assert probes.liveness()[0] is False and asked == ["sockets", "sockets"]
