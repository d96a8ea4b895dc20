"""Who says what the DriverStatusBoard says: the log, a Node Event, the Node annotation (and /healthz, which reads
the board itself: `readiness`).

Generic over the states: NOT_READY (waiting at start, nvidiadriver/wait.py) and RELOADING (the driver went away
under a running plugin) are reported alike, READY ends the episode. Within one episode each distinct reason is
logged and recorded once, however often the board flips between reasons; the annotation follows every change.
"""

from __future__ import annotations

import threading

import structlog

from dra_driver.backoff import Backoff, Retries
from dra_driver.k8s.client import ApiError, KubeRest
from dra_driver.k8s.events import NORMAL, WARNING
from dra_driver.kubeletplugin.nodeevents import NodeEvents
from dra_driver.nvidiadriver.state import NODE_ANNOTATION, DriverState, DriverStatus, readiness

log = structlog.get_logger(__name__)

NOT_READY_EVENT = "NvidiaDriverNotReady"
READY_EVENT = "NvidiaDriverReady"
ANNOTATION_RETRY_MAX_S = 30.0


class DriverReporter:
    """A board listener: log lines and Node Events per distinct reason, READY once an episode ends."""

    def __init__(self, events: NodeEvents | None) -> None:
        self._events = events
        self._lock = threading.Lock()
        self._said: set[tuple[DriverState, str]] = set()  # reasons reported in this episode

    def __call__(self, previous: DriverStatus, current: DriverStatus) -> None:
        if current.state is DriverState.READY:
            with self._lock:
                episode, self._said = bool(self._said), set()
            log.info("NVIDIA driver ready", driver_version=current.driver_version, was=previous.state.value)
            if episode and self._events is not None:
                self._events.record(type=NORMAL, reason=READY_EVENT,
                                    message=f"NVIDIA driver {current.driver_version or '(unknown version)'} is ready")
            return
        key = (current.state, current.reason)
        with self._lock:
            if key in self._said:
                return
            self._said.add(key)
        log.warning("NVIDIA driver not usable; waiting" if current.state is DriverState.NOT_READY
                    else "NVIDIA driver reloading", state=current.state.value, reason=current.reason)
        if self._events is not None:
            self._events.record(type=WARNING, reason=NOT_READY_EVENT, message=current.reason or readiness(current)[1])


class NodeAnnotator:
    """Keeps the Node annotation `gpu.dra.dev/nvidia-driver` equal to the board's `annotation()`: a JSON merge patch
    of the Node from a thread of its own (a slow API server never holds up the one that changed the board), the
    latest value winning, retried with backoff until it is written or the plugin stops."""

    def __init__(self, rest: KubeRest, node_name: str) -> None:
        self._rest = rest
        self._node = node_name
        self._cond = threading.Condition()
        self._wanted: str | None = None
        self._written: str | None = None
        self._stopped = False
        self._thread = threading.Thread(target=self._run, name="driver-annotation", daemon=True)
        self._thread.start()

    def __call__(self, previous: DriverStatus, current: DriverStatus) -> None:
        with self._cond:
            self._wanted = current.annotation()
            self._cond.notify_all()

    @property
    def written(self) -> str | None:
        with self._cond:
            return self._written

    def stop(self) -> None:
        with self._cond:
            self._stopped = True
            self._cond.notify_all()
        self._thread.join(timeout=5.0)

    def _run(self) -> None:
        retries = Retries(Backoff(1.0, ANNOTATION_RETRY_MAX_S))
        while True:
            with self._cond:
                while not self._stopped and (self._wanted is None or self._wanted == self._written):
                    self._cond.wait()
                if self._stopped:
                    return
                value = self._wanted
            assert value is not None
            try:
                self._patch(value)
            except ApiError as exc:
                retry = retries.next()
                log.warning("could not annotate the Node with the driver state; retrying", annotation=NODE_ANNOTATION,
                            error=str(exc), retry_in_s=retry)
                with self._cond:
                    self._cond.wait_for(lambda: self._stopped, timeout=retry)
                continue
            retries.reset()
            with self._cond:
                self._written = value

    def _patch(self, value: str) -> None:
        self._rest.request(
            "PATCH",
            f"/api/v1/nodes/{self._node}",
            body={"metadata": {"annotations": {NODE_ANNOTATION: value}}},
            content_type="application/merge-patch+json",
        )
