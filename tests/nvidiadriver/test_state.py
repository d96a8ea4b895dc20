"""The driver-state board: changes notify listeners once, repeats do not."""

from __future__ import annotations

from dra_driver.nvidiadriver.state import DriverState, DriverStatus, DriverStatusBoard


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
