"""Device health from NVML events: Xid errors, double-bit ECC errors and GPUs that fell off the bus.

A problem marks the affected devices — the whole GPU and every MIG device on it, or just the MIG device an
event names by its GPU/compute instance — with a taint in the ResourceSlices (so the scheduler stops placing
new claims there; the taint is also visible with kubectl) and as UNHEALTHY on the kubelet's health stream
(so pods that use them show it in `allocatedResourcesStatus`).

Application errors that leave the GPU healthy (Xid 13, 31, 43, 45, 68, 109, plus `--ignore-xids`) become
an informational taint with effect `None` and keep the device HEALTHY. With `on_problem` the monitor only
reports each problem and the health keeper (`keeper.py`, `healing.py`) decides how long it lasts; without it
(`on_change`) problems accumulate here and stay until the plugin restarts.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable, Mapping

import structlog

from dra_driver.inventory.catalog import AllocatableDevice, mig_device_name
from dra_driver.nvml.backend import NvmlBackend
from dra_driver.nvml.types import (
    EVENT_DOUBLE_BIT_ECC,
    EVENT_XID_CRITICAL,
    NO_INSTANCE,
    GpuEvent,
    NvmlError,
    NvmlReturn,
)
from dra_driver.plugin.health.problems import DEFAULT_IGNORED_XIDS, DeviceProblem, lost_problem, merge

log = structlog.get_logger(__name__)

WATCHED_EVENTS = EVENT_XID_CRITICAL | EVENT_DOUBLE_BIT_ECC


def affected_devices(
    event: GpuEvent, devices: Mapping[str, AllocatableDevice], instance_devices: Mapping[int, str]
) -> list[str]:
    """Device names an event concerns: the MIG device of the named GPU instance, else everything on the GPU.
    `instance_devices` maps the GPU's live GPU-instance ids to device names. Pure."""
    if event.gpu_instance_id != NO_INSTANCE and event.gpu_instance_id in instance_devices:
        return [instance_devices[event.gpu_instance_id]]
    return sorted(name for name, dev in devices.items() if dev.gpu.uuid == event.gpu_uuid)


def problem_for_event(event: GpuEvent, driver_name: str, ignored_xids: Iterable[int]) -> DeviceProblem | None:
    """Pure classification of one NVML event."""
    if event.event_type & EVENT_XID_CRITICAL:
        ignored = event.data in set(ignored_xids)
        return DeviceProblem(
            key=f"{driver_name}/xid",
            value=str(event.data),
            effect="None" if ignored else "NoSchedule",
            message=f"Xid {event.data}" + (" (application error; the GPU stays usable)" if ignored else ""),
        )
    if event.event_type & EVENT_DOUBLE_BIT_ECC:
        return DeviceProblem(f"{driver_name}/ecc", "double-bit", "NoSchedule", "double-bit ECC error")
    return None


class HealthMonitor:
    """Waits on NVML events in a thread and reports the devices' problems through `on_change`."""

    def __init__(
        self,
        nvml: NvmlBackend,
        *,
        driver_name: str,
        devices: Callable[[], Mapping[str, AllocatableDevice]],
        on_change: Callable[[Mapping[str, DeviceProblem]], None] | None = None,
        on_problem: Callable[[list[str], DeviceProblem], None] | None = None,
        ignored_xids: Iterable[int] = DEFAULT_IGNORED_XIDS,
        wait_ms: int = 1000,
        on_wait_error: Callable[[NvmlError], bool] | None = None,
    ) -> None:
        self._nvml = nvml
        self._driver = driver_name
        self._devices = devices
        self._on_change = on_change
        self._on_problem = on_problem
        self._ignored = frozenset(ignored_xids)
        self._wait_ms = wait_ms
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="health-monitor", daemon=True)
        self.problems: dict[str, DeviceProblem] = {}
        # A driver reload (plugin/driverreload.py): `on_wait_error` says whether a failed wait is the driver, not a
        # GPU; then the loop parks outside the NVML wait (NVML is shut down and opened again under it) until resume().
        self._on_wait_error = on_wait_error
        self._active = threading.Event()
        self._active.set()
        self._parked = threading.Event()

    def start(self) -> None:
        gpus = self._register()
        if gpus:
            self._thread.start()

    def _register(self) -> list[str]:
        gpus = sorted({d.gpu.uuid for d in self._devices().values()})
        if not gpus:
            return gpus
        mask = self._nvml.register_events(gpus, WATCHED_EVENTS)
        log.info("watching GPU health events", gpus=len(gpus), event_mask=mask)
        return gpus

    def park(self, timeout: float | None = None) -> bool:
        """Stop calling NVML and wait until the loop is out of its event wait (True), or `timeout` passed."""
        self._active.clear()
        if not self._thread.is_alive():
            return True
        return self._parked.wait(self._wait_ms / 1000 + 1 if timeout is None else timeout)

    def resume(self) -> None:
        """After a driver reload: register the events again (a new NVML session has none) and wait on them."""
        if self._thread.is_alive():
            try:
                self._register()
            except NvmlError as exc:
                log.warning("GPU health events are not available after the driver reload; devices are not monitored",
                            error=str(exc))  # fmt: skip
                return
        self._parked.clear()
        self._active.set()

    def request_stop(self) -> None:
        """Ask the loop to end after its current NVML wait, without waiting for it (see stop)."""
        self._stop.set()

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=self._wait_ms / 1000 + 5)

    def _run(self) -> None:
        while not self._stop.is_set():
            if not self._active.is_set():
                self._parked.set()
                self._active.wait(0.5)
                continue
            try:
                event = self._nvml.wait_event(self._wait_ms)
            except NvmlError as exc:
                if self._on_wait_error is not None and self._on_wait_error(exc):
                    self._active.clear()  # the driver, not a GPU: parked until the reload is over
                    continue
                if exc.code is NvmlReturn.GPU_IS_LOST:
                    self._report_lost(exc.detail)
                    continue
                log.warning("waiting for GPU events failed", error=str(exc))
                self._stop.wait(1.0)
                continue
            if event is not None:
                self.handle(event)

    def handle(self, event: GpuEvent) -> None:
        problem = problem_for_event(event, self._driver, self._ignored)
        if problem is None:
            return
        devices = self._devices()
        names = affected_devices(event, devices, self._instance_devices(event.gpu_uuid, devices))
        log.warning("GPU health event", gpu_uuid=event.gpu_uuid, problem=problem.message, devices=names)
        self._report(names, problem)

    def _report_lost(self, gpu_uuid: str) -> None:
        devices = self._devices()
        # The lost GPU is named in the error when the backend knows it; else every GPU is suspect.
        names = sorted(n for n, d in devices.items() if not gpu_uuid or d.gpu.uuid == gpu_uuid)
        log.error("GPU lost", gpu_uuid=gpu_uuid or "unknown", devices=names)
        self._report(names, lost_problem(self._driver))

    def _report(self, names: list[str], problem: DeviceProblem) -> None:
        if self._on_problem is not None:
            self._on_problem(names, problem)
            return
        problems = merge(self.problems, names, problem)
        if problems != self.problems:
            self.problems = problems
            if self._on_change is not None:
                self._on_change(dict(problems))

    def _instance_devices(self, gpu_uuid: str, devices: Mapping[str, AllocatableDevice]) -> dict[int, str]:
        """Live GPU-instance id -> the device name that placement is published under."""
        gpu = next((d.gpu for d in devices.values() if d.gpu.uuid == gpu_uuid), None)
        if gpu is None:
            return {}
        try:
            instances = self._nvml.gpu_instances(gpu_uuid)
        except NvmlError:
            return {}
        out = {}
        for gi in instances:
            profile = gpu.profile_by_id(gi.profile_id)
            if profile is not None:
                name = mig_device_name(gpu, profile, gi.placement)
                if name in devices:
                    out[gi.id] = name
        return out
