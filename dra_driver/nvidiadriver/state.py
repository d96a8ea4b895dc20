"""Whether the node's NVIDIA driver can serve now: one board the driver-lifecycle parts share.

The plugin does not assume the driver is there and stays there (docs/kubelet-plugin.md "The NVIDIA driver's
lifecycle"): it waits for it before it registers (NOT_READY: the GPU Operator's driver container still installing,
NVIDIA/k8s-dra-driver-gpu#1008), and notices a reload under it (RELOADING: the `nvidia` module unloaded and loaded,
NVIDIA/k8s-driver-manager#203). Who reports the state (the log, `/healthz` readiness, a Node Event, the Node's
annotation that `dra-driver status` reads) listens on this board; who must not act while the driver is away (the
prepare path, the publisher) asks it.
"""

from __future__ import annotations

import enum
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

# On the Node, what `dra-driver status` shows: "<state>" or "<state>: <reason>" (kept short: a reason is one line).
NODE_ANNOTATION = "gpu.dra.dev/nvidia-driver"


class DriverState(enum.Enum):
    READY = "ready"
    NOT_READY = "not-ready"  # no usable driver yet (never served since this process started)
    RELOADING = "reloading"  # served before; the driver went away or changed under the plugin


@dataclass(frozen=True)
class DriverStatus:
    state: DriverState
    reason: str = ""  # why not ready, one line naming what to fix; empty when READY
    since: float = 0.0  # time.monotonic() of the change
    driver_version: str | None = None  # the loaded driver's version once known

    @property
    def ready(self) -> bool:
        return self.state is DriverState.READY

    def annotation(self) -> str:
        return self.state.value if not self.reason else f"{self.state.value}: {self.reason}"


Listener = Callable[[DriverStatus, DriverStatus], None]  # (previous, current)


class DriverStatusBoard:
    """The current DriverStatus; listeners run on every change, in the thread that made it, outside the lock."""

    def __init__(self, initial: DriverStatus | None = None, *, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._lock = threading.Lock()
        self._status = initial if initial is not None else DriverStatus(DriverState.NOT_READY, "not checked yet")
        self._listeners: list[Listener] = []

    def status(self) -> DriverStatus:
        with self._lock:
            return self._status

    @property
    def ready(self) -> bool:
        return self.status().ready

    def listen(self, listener: Listener) -> None:
        with self._lock:
            self._listeners.append(listener)

    def set(self, state: DriverState, reason: str = "", *, driver_version: str | None = None) -> DriverStatus:
        """Move to `state`; a repeat of the same state and reason changes nothing and notifies nobody."""
        reason = " ".join(reason.split())
        with self._lock:
            previous = self._status
            version = driver_version if driver_version is not None else previous.driver_version
            if previous.state is state and previous.reason == reason and previous.driver_version == version:
                return previous
            current = DriverStatus(state, reason, self._clock(), version)
            self._status = current
            listeners = list(self._listeners)
        for listener in listeners:
            listener(previous, current)
        return current


def readiness(status: DriverStatus) -> tuple[bool, str]:
    """What /healthz and /readyz say about the driver (the sockets are asked only when it is ready)."""
    if status.state is DriverState.NOT_READY:
        return False, f"driver not ready: {status.reason or 'not checked yet'}"
    if status.state is DriverState.RELOADING:
        return False, f"driver reloading: {status.reason or 'the NVIDIA driver changed'}"
    return True, "ok"


Probe = Callable[[], tuple[bool, str]]


class PluginProbes:
    """A kubelet plugin's /healthz, /readyz and /livez answers, from its driver's board and, once it serves, its
    kubelet sockets' probe (`serving`). Ready: the driver is ready, the plugin serves (`starting` says what comes
    first) and the sockets answer. Alive while it waits for the driver or starts (a restart would not help: the
    kubelet would only crash-loop the pod); once serving, the sockets must answer."""

    def __init__(self, board: DriverStatusBoard, *, starting: str) -> None:
        self._board = board
        self._starting = starting
        self._sockets: Probe | None = None  # None: not serving yet

    def serving(self, sockets: Probe) -> None:
        """The kubelet sockets are up: from now on the probes ask them."""
        self._sockets = sockets

    def readiness(self) -> tuple[bool, str]:
        ok, reason = readiness(self._board.status())
        if not ok:
            return ok, reason
        if self._sockets is None:
            return False, self._starting
        return self._sockets()

    def liveness(self) -> tuple[bool, str]:
        if self._sockets is None:
            return True, f"alive, not serving yet ({readiness(self._board.status())[1]})"
        return self._sockets()
