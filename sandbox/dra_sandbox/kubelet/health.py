"""Device health from the plugin's DRAResourceHealth.NodeWatchResources stream (v1 or v1alpha1, as registration
picked: the two protos have the same messages and field numbers).

`HealthStore` keeps the latest report per (driver, pool, device). A device not re-reported within its
timeout (health_check_timeout_seconds, else 30 s) reads as Unknown, as the kubelet treats it.
`HealthStream` keeps one stream open per registered plugin and re-opens it after a failure (5 s by
default, like the kubelet).
"""

from __future__ import annotations

import logging
import threading
from dataclasses import dataclass
from typing import Any

import grpc

from dra_driver._gen import (
    dra_health_v1_pb2,
    dra_health_v1_pb2_grpc,
    dra_health_v1alpha1_pb2,
    dra_health_v1alpha1_pb2_grpc,
)
from dra_sandbox.kubelet.clock import Clock
from dra_sandbox.kubelet.versions import HEALTH_V1, HEALTH_V1ALPHA1
from dra_sandbox.loopthread import LoopThread

log = logging.getLogger(__name__)
DEFAULT_HEALTH_TIMEOUT_S = 30.0
DEFAULT_REOPEN_S = 5.0
HEALTH_NAMES = {0: "Unknown", 1: "Healthy", 2: "Unhealthy"}
# Advertised service name -> (messages, stubs).
_HEALTH_APIS: dict[str, tuple[Any, Any]] = {
    HEALTH_V1: (dra_health_v1_pb2, dra_health_v1_pb2_grpc),
    HEALTH_V1ALPHA1: (dra_health_v1alpha1_pb2, dra_health_v1alpha1_pb2_grpc),
}
# The kubelet cuts longer messages to 1021 characters plus "..." (truncateHealthMessage, pkg/kubelet/cm/dra).
MAX_HEALTH_MESSAGE = 1024


@dataclass(frozen=True)
class DeviceHealth:
    driver: str
    pool: str
    device: str
    status: str  # Healthy | Unhealthy | Unknown
    last_updated: int  # Unix seconds, as the plugin reported
    timeout_s: float
    message: str
    received_at: float  # our monotonic clock


def health_from_response(driver: str, response: Any, received_at: float) -> list[DeviceHealth]:
    """Pure: one NodeWatchResourcesResponse -> records."""
    out: list[DeviceHealth] = []
    for dev in response.devices:
        timeout = float(dev.health_check_timeout_seconds)
        out.append(
            DeviceHealth(
                driver=driver,
                pool=dev.device.pool_name,
                device=dev.device.device_name,
                status=HEALTH_NAMES.get(int(dev.health), "Unknown"),
                last_updated=int(dev.last_updated_time),
                timeout_s=timeout if timeout > 0 else DEFAULT_HEALTH_TIMEOUT_S,
                message=truncate_message(dev.message),
                received_at=received_at,
            )
        )
    return out


def truncate_message(message: str) -> str:
    if len(message) <= MAX_HEALTH_MESSAGE:
        return message
    return message[: MAX_HEALTH_MESSAGE - 3] + "..."


class HealthStore:
    def __init__(self, clock: Clock) -> None:
        self._clock = clock
        self._lock = threading.Lock()
        self._latest: dict[tuple[str, str, str], DeviceHealth] = {}
        self.updates = 0

    def update(self, records: list[DeviceHealth]) -> None:
        with self._lock:
            for record in records:
                self._latest[(record.driver, record.pool, record.device)] = record
            self.updates += 1

    def get(self, driver: str, pool: str, device: str) -> DeviceHealth | None:
        with self._lock:
            return self._latest.get((driver, pool, device))

    def status(self, driver: str, pool: str, device: str) -> str:
        record = self.get(driver, pool, device)
        if record is None or self._clock.monotonic() - record.received_at > record.timeout_s:
            return "Unknown"
        return record.status

    def health_and_message(self, driver: str, pool: str, device: str) -> tuple[str, str]:
        """What the pod status shows for one device: its health (Unknown once stale) and the plugin's message."""
        status = self.status(driver, pool, device)
        record = self.get(driver, pool, device)
        return status, (record.message if record is not None and status != "Unknown" else "")

    def snapshot(self) -> dict[tuple[str, str, str], DeviceHealth]:
        with self._lock:
            return dict(self._latest)


class HealthStream:
    """Keeps NodeWatchResources open on one plugin's DRA channel until stopped."""

    def __init__(
        self,
        driver: str,
        channel: grpc.Channel,
        store: HealthStore,
        clock: Clock,
        reopen_s: float = DEFAULT_REOPEN_S,
        service: str = HEALTH_V1ALPHA1,
    ) -> None:
        self._driver = driver
        self.service = service
        self._messages, stubs = _HEALTH_APIS[service]
        self._stub = stubs.DRAResourceHealthStub(channel)
        self._store = store
        self._clock = clock
        self._reopen_s = reopen_s
        self._worker = LoopThread(self._run, f"health-{driver}")
        self._lock = threading.Lock()
        self._call: Any = None
        self.opened = 0  # how many times the stream was opened (tests and diagnostics)
        self.unimplemented = False  # the plugin answered Unimplemented: the stream is never re-opened

    def start(self) -> None:
        self._worker.start()

    def stop(self) -> None:
        self._worker.stopping.set()
        with self._lock:
            if self._call is not None:
                self._call.cancel()
        self._worker.join()

    def _run(self) -> None:
        while not self._worker.stopping.is_set():
            try:
                with self._lock:
                    if self._worker.stopping.is_set():
                        return
                    self._call = self._stub.NodeWatchResources(self._messages.NodeWatchResourcesRequest())
                    self.opened += 1
                for response in self._call:
                    self._store.update(health_from_response(self._driver, response, self._clock.monotonic()))
                log.info("health stream of %s ended; re-opening in %.1f s", self._driver, self._reopen_s)
            except (grpc.RpcError, ValueError) as exc:  # ValueError: the channel was closed under us
                if self._worker.stopping.is_set():
                    return
                if isinstance(exc, grpc.RpcError) and exc.code() is grpc.StatusCode.UNIMPLEMENTED:
                    # healthStreamTerminated (pkg/kubelet/cm/dra/plugin): no service, never asked again.
                    log.info("health stream of %s: %s is not implemented; not re-opening", self._driver, self.service)
                    self.unimplemented = True
                    return
                log.info("health stream of %s failed (%s); re-opening in %.1f s", self._driver, exc, self._reopen_s)
            if self._clock.wait(self._worker.stopping, self._reopen_s):
                return
