"""Device health as the kubelet's health stream sees it.

Until NVML health monitoring feeds it, every published device is reported HEALTHY with the time it was
last (re)published. `update` swaps in a new device list and wakes every open stream.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterable

from dra_driver.kubeletplugin.driver import DeviceHealth, HealthSnapshot


class DeviceHealthBoard:
    def __init__(self, pool: str, clock: Callable[[], float] = time.time) -> None:
        self._pool = pool
        self._clock = clock
        self._cond = threading.Condition()
        self._snapshot = HealthSnapshot(version=0)

    def update(self, device_names: Iterable[str], unhealthy: dict[str, str] | None = None) -> None:
        bad = unhealthy or {}
        now = int(self._clock())
        devices = tuple(
            DeviceHealth(self._pool, name, name not in bad, now, bad.get(name, "")) for name in sorted(device_names)
        )
        with self._cond:
            self._snapshot = HealthSnapshot(self._snapshot.version + 1, devices)
            self._cond.notify_all()

    def snapshot(self) -> HealthSnapshot:
        with self._cond:
            return self._snapshot

    def wait_for_change(self, after_version: int, timeout: float) -> HealthSnapshot:
        with self._cond:
            self._cond.wait_for(lambda: self._snapshot.version != after_version, timeout=timeout)
            return self._snapshot
