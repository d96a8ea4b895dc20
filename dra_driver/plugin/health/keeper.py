"""The health keeper: feeds NVML problems into the ledger, heals devices whose healthy window passed (after an
NVML probe of their GPU), and reports every change — a log line, the `dra_driver_device_health_transitions_total`
counter and a Kubernetes Event on the Node — before handing the new taints to the plugin (slices + the kubelet's
health stream).

An admin's taints are DeviceTaintRules (`dra-driver health taint`), which kube-scheduler and kube-controller-manager
apply themselves: the keeper sends no API request (earlier releases polled the Node every --health-check-interval
for the annotation `<driver>/device-health`; `dra-driver health migrate` converts what is left of it, and the
plugin warns once at start when its Node still carries one).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

import structlog

from dra_driver.inventory.catalog import AllocatableDevice
from dra_driver.k8s.events import NORMAL, WARNING
from dra_driver.kubeletplugin.nodeevents import NodeEvents
from dra_driver.nvml.backend import NvmlBackend
from dra_driver.nvml.types import NvmlError
from dra_driver.observability.metrics import PluginMetrics
from dra_driver.plugin.health.healing import TAINTED, HealthLedger, Transition, annotation_key
from dra_driver.plugin.health.problems import DeviceProblem

log = structlog.get_logger(__name__)

Problems = Mapping[str, tuple[DeviceProblem, ...]]
EVENT_TAINTED, EVENT_UNTAINTED = "DeviceTainted", "DeviceUntainted"
EVENT_LEGACY_ANNOTATION = "LegacyDeviceHealthAnnotation"


@dataclass(frozen=True, kw_only=True)
class KeeperParts:
    """What the keeper works with (plugin/app.py): NVML and the catalog (the GPU probe), and where it reports."""

    nvml: NvmlBackend
    devices: Callable[[], Mapping[str, AllocatableDevice]]
    events: NodeEvents  # each taint and untaint, and the legacy annotation's warning, as Events on the Node
    metrics: PluginMetrics
    on_change: Callable[[Problems], None]  # the problems after a transition (the slices, the kubelet's stream)


class HealthKeeper:
    def __init__(
        self,
        ledger: HealthLedger,
        parts: KeeperParts,
        *,
        driver_name: str,
        clock: Callable[[], float] = time.monotonic,
        interval: float = 10.0,
    ) -> None:
        self.ledger = ledger
        self.parts = parts
        self._annotation = annotation_key(driver_name)
        self._clock = clock
        self._interval = interval
        self._lock = threading.Lock()
        self._warned: set[str] = set()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="health-keeper", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=5.0)

    def note_node(self, node: Mapping[str, object] | None) -> None:
        """The Node as the plugin read it at start: one still carrying the annotation of earlier releases gets one
        warning (log and Event): it is no longer applied, and `dra-driver health migrate` turns it into
        DeviceTaintRules. (The Events' uid is the plugin's NodeEvents' note of the same Node.)"""
        metadata = (node or {}).get("metadata")
        if not isinstance(metadata, Mapping):
            return
        annotations = metadata.get("annotations")
        legacy = annotations.get(self._annotation) if isinstance(annotations, Mapping) else None
        if legacy:
            message = (f"the Node annotation {self._annotation}={legacy!s} is no longer applied: admin taints are "
                       "DeviceTaintRules now; run `dra-driver health migrate` to convert it")
            log.warning("legacy device health annotation", annotation=self._annotation, value=str(legacy))
            self.parts.events.record(type=WARNING, reason=EVENT_LEGACY_ANNOTATION, message=message)

    def problems(self) -> dict[str, tuple[DeviceProblem, ...]]:
        with self._lock:
            return self.ledger.problems()

    def on_problem(self, names: Sequence[str], problem: DeviceProblem) -> None:
        """The NVML monitor saw a problem on these devices."""
        with self._lock:
            self._emit(self.ledger.record(names, problem, self._clock()))

    def tick(self) -> None:
        """One round: the devices whose healthy window has passed (no API request)."""
        with self._lock:
            transitions: list[Transition] = []
            now = self._clock()
            for name, needs_probe in self.ledger.due(now):
                if needs_probe and not self._probe(name):
                    continue
                transitions += self.ledger.heal(name, now)
            self.ledger.forget_quiet(now)
            self._emit(transitions)

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                self.tick()
            except Exception:
                log.exception("the device health round failed; retrying on the next one")
            self._stop.wait(self._interval)

    def _probe(self, name: str) -> bool:
        """The GPU is still enumerated and answers a query. A device no longer offered needs no probe."""
        device = self.parts.devices().get(name)
        if device is None:
            return True
        uuid = device.gpu.uuid
        try:
            ok = uuid in {g.uuid for g in self.parts.nvml.gpus()}
            if ok:
                self.parts.nvml.compute_mode(uuid)
        except NvmlError as exc:
            ok, detail = False, str(exc)
        else:
            detail = "" if ok else "the GPU is no longer enumerated"
        if not ok:
            key = f"probe:{name}:{detail}"
            if key not in self._warned:
                self._warned.add(key)
                log.warning("healthy window passed but the GPU probe failed; keeping the taint", device=name,
                            gpu_uuid=uuid, error=detail)  # fmt: skip
        return ok

    def _emit(self, transitions: list[Transition]) -> None:
        for t in transitions:
            fields = {"device": t.device, "reason": t.reason, "taint": f"{t.problem.key}={t.problem.value}"}
            if t.change == TAINTED:
                log.warning("device tainted", effect=t.problem.effect, detail=t.detail, **fields)
            else:
                log.info("device untainted", detail=t.detail, **fields)
            self.parts.metrics.device_health_transitions.labels(t.change, t.reason).inc()
            self.parts.events.record(
                type=WARNING if t.change == TAINTED else NORMAL,
                reason=EVENT_TAINTED if t.change == TAINTED else EVENT_UNTAINTED,
                message=t.message,
            )
        if transitions:
            self.parts.on_change(self.ledger.problems())
