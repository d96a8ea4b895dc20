"""The GPU plugin's background loops (re-discovery, stale-claim cleanup) and how its components stop."""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence

import structlog

from dra_driver.plugin.driverreload import DriverReloadWatcher
from dra_driver.plugin.ownership import RecoveryReport
from dra_driver.plugin.recovery import Recovery

log = structlog.get_logger(__name__)


def rediscovery_loop(
    *, stopped: threading.Event, wake: threading.Event, interval: float, reload: DriverReloadWatcher,
    rediscover: Callable[[], object],
) -> None:  # fmt: skip
    """Re-read the hardware every `interval` and when woken (SIGHUP, a failed rebind), except while the NVIDIA
    driver is away (its watcher re-discovers once it is back)."""
    while not stopped.is_set():
        wake.wait(interval)
        wake.clear()
        if stopped.is_set():
            return
        if reload.check():
            continue  # the driver went or changed: its watcher re-discovers once it is back
        try:
            rediscover()
        except Exception:
            if reload.check():
                continue
            log.exception("re-discovery failed; keeping the previous inventory")


def cleanup_loop(
    *, stopped: threading.Event, wake: threading.Event, interval: float, reload: DriverReloadWatcher,
    recovery: Recovery, recovered: Callable[[RecoveryReport], None], swept: Callable[[], object],
) -> None:  # fmt: skip
    """Rebuild claim ownership where it is not known, release claims that are gone (`swept` then removes what the
    released claims left beside the engine's own records), every `interval` and when woken."""
    # Startup first: claims deleted while the plugin was down are released right away.
    while not stopped.is_set():
        if reload.reloading:  # releases need the driver: the next round, once it is back
            wake.wait(interval)
            wake.clear()
            continue
        try:
            # A checkpoint lost while serving, or ownership that could not be rebuilt at startup.
            report = recovery.reconcile()
            if report is not None:
                recovered(report)
        except Exception:
            log.exception("rebuilding claim ownership failed; retrying on the next round")
        try:
            recovery.cleanup_stale()
            # Claims the cleanup unprepared went without the kubelet: their metadata goes here.
            swept()
        except Exception:
            log.exception("stale-claim cleanup failed")
        wake.wait(interval)
        wake.clear()


def stop_side_by_side(stops: Sequence[Callable[[], None]]) -> None:
    """Run each stop in its own thread and wait for all; one that fails is logged and does not keep the rest from
    stopping (each bounds its own wait)."""

    def run(stop: Callable[[], None]) -> None:
        try:
            stop()
        except Exception:
            log.exception("stopping a component failed", component=getattr(stop, "__qualname__", repr(stop)))

    threads = [threading.Thread(target=run, args=(stop,), name="stop", daemon=True) for stop in stops]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
