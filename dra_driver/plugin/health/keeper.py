"""The health keeper: feeds NVML problems into the ledger, heals devices whose healthy window passed (after an
NVML probe of their GPU), applies the admin's Node annotation, and reports every change — a log line, the
`dra_driver_device_health_transitions_total` counter and a Kubernetes Event on the Node — before handing the new
taints to the plugin (slices + the kubelet's health stream).

The annotation is polled with `GET` on the plugin's own Node (which the plugin may already read): no watch and no
write permission is needed on the node side; `dra-driver health` (with the admin's kubeconfig) writes it.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Mapping, Sequence

import structlog

from dra_driver.inventory.catalog import AllocatableDevice
from dra_driver.k8s.client import ApiError, KubeRest
from dra_driver.k8s.events import NORMAL, WARNING, EventRecorder, InvolvedObject
from dra_driver.nvml.backend import NvmlBackend
from dra_driver.nvml.types import NvmlError
from dra_driver.observability.metrics import PluginMetrics
from dra_driver.plugin.health.healing import TAINTED, HealthLedger, Transition, annotation_key, parse_overrides
from dra_driver.plugin.health.monitor import DeviceProblem

log = structlog.get_logger(__name__)

Problems = Mapping[str, tuple[DeviceProblem, ...]]
EVENT_TAINTED, EVENT_UNTAINTED = "DeviceTainted", "DeviceUntainted"


class HealthKeeper:
    def __init__(
        self,
        ledger: HealthLedger,
        *,
        nvml: NvmlBackend,
        rest: KubeRest,
        node_name: str,
        driver_name: str,
        devices: Callable[[], Mapping[str, AllocatableDevice]],
        on_change: Callable[[Problems], None],
        metrics: PluginMetrics,
        events: EventRecorder | None,
        clock: Callable[[], float] = time.monotonic,
        interval: float = 10.0,
        read_overrides: bool = True,
    ) -> None:
        self.ledger = ledger
        self.rest = rest
        self._nvml = nvml
        self._node = node_name
        self._annotation = annotation_key(driver_name)
        self._devices = devices
        self._on_change = on_change
        self._metrics = metrics
        self._events = events
        self._clock = clock
        self._interval = interval
        self._read_overrides = read_overrides
        self._lock = threading.Lock()
        self._node_uid = ""
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
        """The Node as the plugin read it at start: its uid goes into the Events from the first one on (an Xid can
        arrive before the first round reads the Node, and `kubectl describe node` matches Events by uid)."""
        metadata = (node or {}).get("metadata")
        if isinstance(metadata, Mapping) and metadata.get("uid"):
            self._node_uid = str(metadata["uid"])

    def problems(self) -> dict[str, tuple[DeviceProblem, ...]]:
        with self._lock:
            return self.ledger.problems()

    def on_problem(self, names: Sequence[str], problem: DeviceProblem) -> None:
        """The NVML monitor saw a problem on these devices."""
        with self._lock:
            self._emit(self.ledger.record(names, problem, self._clock()))

    def tick(self) -> None:
        """One round: the admin's annotation, then the devices whose healthy window has passed."""
        entries = self._overrides() if self._read_overrides else None  # an API call: outside the lock
        with self._lock:
            transitions: list[Transition] = []
            if entries is not None:
                transitions += self.ledger.apply_overrides(entries, f"annotation {self._annotation}")
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

    def _overrides(self) -> dict[str, str] | None:
        """The annotation's entries for devices of this node; None when the Node cannot be read (keep the last)."""
        try:
            # resourceVersion=0: served from the API server's watch cache, not a quorum read from etcd. Every node
            # polls every --health-check-interval (the fleet's most frequent request); a cache a moment behind is fine
            # for an admin's annotation.
            node = self.rest.get(f"/api/v1/nodes/{self._node}", query={"resourceVersion": "0"})
        except ApiError as exc:
            log.debug("could not read this node's health overrides", error=str(exc))
            return None
        metadata = (node or {}).get("metadata") or {}
        self._node_uid = str(metadata.get("uid") or self._node_uid)
        text = str((metadata.get("annotations") or {}).get(self._annotation) or "")
        entries, problems = parse_overrides(text)
        known = self._devices()
        for problem in problems + [f"{d}: no such device on this node" for d in entries if d not in known]:
            if problem not in self._warned:
                self._warned.add(problem)
                log.warning("ignoring a device health override", annotation=self._annotation, problem=problem)
        return {d: v for d, v in entries.items() if d in known}

    def _probe(self, name: str) -> bool:
        """The GPU is still enumerated and answers a query. A device no longer offered needs no probe."""
        device = self._devices().get(name)
        if device is None:
            return True
        uuid = device.gpu.uuid
        try:
            ok = uuid in {g.uuid for g in self._nvml.gpus()}
            if ok:
                self._nvml.compute_mode(uuid)
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
            self._metrics.device_health_transitions.labels(t.change, t.reason).inc()
            if self._events is not None:
                self._events.record(
                    InvolvedObject("v1", "Node", self._node, uid=self._node_uid),
                    type=WARNING if t.change == TAINTED else NORMAL,
                    reason=EVENT_TAINTED if t.change == TAINTED else EVENT_UNTAINTED,
                    message=t.message,
                    namespace="default",
                )
        if transitions:
            self._on_change(self.ledger.problems())
