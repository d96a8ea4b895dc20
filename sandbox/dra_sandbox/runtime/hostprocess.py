"""The host-process runtime: pods whose containers the sandbox must really run (the IMEX daemon pods) run as child
processes of the sandbox kubelet, with the kubelet's container lifecycle.

Unlike `ContainerRuntime.run` (start, report what the container saw, done), these containers keep running: each
pod gets a supervisor thread that runs the init containers one after the other, then the containers, and

- restarts exited containers as `restartPolicy` says, after the kubelet's crash-loop back-off (10 s doubling to
  300 s, reset after 10 minutes of running: `pkg/kubelet/kubelet.go` containerBackOffPeriod / MaxContainerBackOff,
  `pkg/kubelet/kuberuntime/kuberuntime_manager.go` doBackOff);
- runs exec probes as the kubelet's prober workers do (`pkg/kubelet/prober/worker.go`, `prober.go`): the startup
  probe first (readiness and liveness wait for it), `initialDelaySeconds`, `periodSeconds`, `timeoutSeconds` (a
  probe that overruns fails), `successThreshold`/`failureThreshold`; readiness starts as failure; a failed
  liveness or startup probe kills the container, which then restarts per policy;
- stops a pod as the kubelet kills containers (`pkg/kubelet/kuberuntime/kuberuntime_container.go` killContainer):
  SIGTERM to the container's process group, SIGKILL once the grace period is over.

Every container is its own process group (the daemon's `nvidia-imex` children go with it); stdout and stderr go
to `<log dir>/<namespace>_<pod>_<uid>/<container>/<restart>.log`, as under /var/log/pods.
Which pods run here, and how their argv and env are built, is the kubelet's business (kubelet/processpods.py).
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import subprocess
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Final

log = logging.getLogger(__name__)
NAME: Final = "host-process"
TICK_S: Final = 0.05


@dataclass(frozen=True)
class ExecProbe:
    """One exec probe of a container (`readinessProbe`, `livenessProbe`, `startupProbe`), API defaults applied."""

    kind: str  # "readiness" | "liveness" | "startup"
    argv: tuple[str, ...]
    period_s: float = 10.0
    timeout_s: float = 1.0
    initial_delay_s: float = 0.0
    success_threshold: int = 1
    failure_threshold: int = 3


@dataclass(frozen=True)
class ProcessContainer:
    name: str
    argv: tuple[str, ...]
    env: Mapping[str, str] = field(default_factory=dict)
    probes: tuple[ExecProbe, ...] = ()

    def probe(self, kind: str) -> ExecProbe | None:
        return next((p for p in self.probes if p.kind == kind), None)


@dataclass(frozen=True)
class ProcessPodRequest:
    namespace: str
    name: str
    uid: str
    containers: tuple[ProcessContainer, ...]
    init_containers: tuple[ProcessContainer, ...] = ()
    restart_policy: str = "Always"
    grace_period_s: float = 30.0

    @property
    def key(self) -> str:
        return f"{self.namespace}/{self.name}"


@dataclass(frozen=True)
class Termination:
    exit_code: int
    reason: str  # Completed | Error
    started_at: float
    finished_at: float
    message: str = ""


@dataclass(frozen=True)
class ContainerSnapshot:
    """One container as the kubelet's status manager would report it (times are wall-clock seconds)."""

    name: str
    state: str  # "waiting" | "running" | "terminated"
    reason: str = ""
    message: str = ""
    started_at: float | None = None
    terminated: Termination | None = None  # state "terminated": how it ended
    last_termination: Termination | None = None
    ready: bool = False
    started: bool = False
    restart_count: int = 0
    pid: int | None = None


@dataclass(frozen=True)
class PodSnapshot:
    init_containers: tuple[ContainerSnapshot, ...]
    containers: tuple[ContainerSnapshot, ...]
    initialized: bool
    # Every process is gone after a stop() (the kubelet may now unprepare the pod's claims and release it).
    stopped: bool
    failed_init: str | None = None  # restartPolicy Never: the init container that failed


@dataclass(frozen=True)
class RestartBackoff:
    """The kubelet's defaults (pkg/kubelet/kubelet.go containerBackOffPeriod and MaxContainerBackOff); the back-off
    is reset once a container ran for twice the maximum without a restart (flowcontrol.Backoff's GC of an idle
    entry)."""

    initial_s: float = 10.0
    maximum_s: float = 300.0
    reset_after_s: float = 600.0

    def delay(self, restarts: int) -> float:
        return float(min(self.initial_s * 2 ** max(restarts - 1, 0), self.maximum_s))


class _ProbeState:
    def __init__(self, probe: ExecProbe, now: float) -> None:
        self.probe = probe
        self.next_at = now + probe.initial_delay_s
        self.successes = 0
        self.failures = 0
        self.result: bool | None = None  # None: no result yet


class _Container:
    """One container's process and what the kubelet tracks about it. Touched only by its pod's supervisor."""

    def __init__(self, spec: ProcessContainer, log_dir: Path) -> None:
        self.spec = spec
        self.log_dir = log_dir
        self.proc: subprocess.Popen[bytes] | None = None
        self.started_wall: float | None = None
        self.started_mono = 0.0
        self.restart_count = 0
        self.backoff_count = 0  # restarts since the back-off was last reset
        self.pgid: int | None = None
        self.restart_at: float | None = None  # monotonic: when the back-off ends
        self.terminated: Termination | None = None
        self.last: Termination | None = None
        self.reason = "ContainerCreating"
        self.message = ""
        self.probes: dict[str, _ProbeState] = {}
        self.kill_reason = ""

    def snapshot(self) -> ContainerSnapshot:
        ready_probe = self.probes.get("readiness")
        started = self.proc is not None and ("startup" not in self.probes or self.probes["startup"].result is True)
        if self.proc is not None:
            ready = started and (ready_probe is None or ready_probe.result is True)
            return ContainerSnapshot(self.spec.name, "running", started_at=self.started_wall,
                                     last_termination=self.last, ready=ready, started=started,
                                     restart_count=self.restart_count, pid=self.proc.pid)
        if self.terminated is not None and self.restart_at is None:
            return ContainerSnapshot(self.spec.name, "terminated", terminated=self.terminated,
                                     last_termination=self.last, restart_count=self.restart_count)
        return ContainerSnapshot(self.spec.name, "waiting", reason=self.reason, message=self.message,
                                 last_termination=self.last if self.terminated is None else self.terminated,
                                 restart_count=self.restart_count)


class ProcessPod:
    """A pod's containers as host processes under one supervisor thread."""

    def __init__(self, request: ProcessPodRequest, log_root: Path, on_change: Callable[[], None],
                 backoff: RestartBackoff) -> None:
        self.request = request
        pod_dir = log_root / f"{request.namespace}_{request.name}_{request.uid}"
        self._init = [_Container(c, pod_dir / c.name) for c in request.init_containers]
        self._main = [_Container(c, pod_dir / c.name) for c in request.containers]
        self._on_change = on_change
        self._backoff = backoff
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._stop_requested: float | None = None  # monotonic deadline for SIGKILL
        self._stopped = threading.Event()
        self._initialized = not self._init
        self._failed_init: str | None = None
        self._thread = threading.Thread(target=self._run, name=f"pod-{request.key}", daemon=True)

    # ---- the kubelet's side ----------------------------------------------------------------------

    def start(self) -> None:
        self._thread.start()

    def stop(self, grace_period_s: float | None = None) -> None:
        """Begin killing the pod's containers (SIGTERM now, SIGKILL after the grace period); returns at once."""
        grace = self.request.grace_period_s if grace_period_s is None else grace_period_s
        with self._lock:
            deadline = time.monotonic() + max(grace, 0.0)
            if self._stop_requested is None or deadline < self._stop_requested:
                self._stop_requested = deadline
        self._wake.set()

    def wait_stopped(self, timeout: float) -> bool:
        return self._stopped.wait(timeout)

    def snapshot(self) -> PodSnapshot:
        with self._lock:
            return PodSnapshot(tuple(c.snapshot() for c in self._init), tuple(c.snapshot() for c in self._main),
                               self._initialized, self._stopped.is_set(), self._failed_init)

    # ---- the supervisor --------------------------------------------------------------------------

    def _changed(self) -> None:
        try:
            self._on_change()
        except Exception as exc:  # the kubelet's kick must never kill the supervisor
            log.warning("pod %s: status callback failed: %s", self.request.key, exc)

    def _launch(self, c: _Container) -> None:
        c.log_dir.mkdir(mode=0o750, parents=True, exist_ok=True)
        log = c.log_dir / f"{c.restart_count}.log"
        try:
            with open(log, "ab") as out:
                os.chmod(log, 0o640)
                # Its own process group: SIGTERM/SIGKILL reach the container's children too, as a container's
                # PID namespace would end them.
                c.proc = subprocess.Popen(list(c.spec.argv), env=dict(c.spec.env), stdout=out,
                                          stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, process_group=0,
                                          cwd="/")
        except OSError as exc:
            now = time.time()
            c.proc = None
            # What a runtime reports when the process never started (CreateContainerError / StartError, 128).
            c.terminated = Termination(128, "StartError", now, now, f"cannot start {c.spec.argv[0]}: {exc}")
            c.reason, c.message = "StartError", c.terminated.message
            c.last = c.terminated
            self._exited_start_error(c)
            return
        c.pgid = c.proc.pid
        c.started_wall = time.time()
        c.started_mono = time.monotonic()
        c.terminated = None
        c.restart_at = None
        c.kill_reason = ""
        now = time.monotonic()
        c.probes = {p.kind: _ProbeState(p, now) for p in c.spec.probes}

    def _exited(self, c: _Container, code: int) -> None:
        assert c.proc is not None
        now = time.time()
        reason = "Completed" if code == 0 else "Error"
        # A signal ends the process with -N here; a runtime reports 128+N.
        exit_code = 128 - code if code < 0 else code
        c.terminated = Termination(exit_code, reason, c.started_wall or now, now, c.kill_reason)
        c.last = c.terminated
        ran_s = time.monotonic() - c.started_mono
        c.proc = None
        c.probes = {}
        # Whatever the container left in its process group dies with it (its PID namespace would end them).
        _killpg(c.pgid, signal.SIGKILL)
        restart = self._stop_requested is None and (
            self.request.restart_policy == "Always" or (self.request.restart_policy == "OnFailure" and exit_code))
        if restart:
            if ran_s >= self._backoff.reset_after_s:
                c.backoff_count = 0
            c.backoff_count += 1
            delay = self._backoff.delay(c.backoff_count)
            c.restart_at = time.monotonic() + delay
            c.reason = "CrashLoopBackOff"
            c.message = (f"back-off {delay:.0f}s restarting failed container={c.spec.name} "
                         f"pod={self.request.name}_{self.request.namespace}({self.request.uid})")
        else:
            c.restart_at = None

    def _probe(self, c: _Container, state: _ProbeState) -> None:
        probe = state.probe
        state.next_at = time.monotonic() + probe.period_s
        try:
            done = subprocess.run(list(probe.argv), env=dict(c.spec.env), stdin=subprocess.DEVNULL,
                                  stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, timeout=probe.timeout_s,
                                  check=False, cwd="/")
            ok = done.returncode == 0
        except (subprocess.TimeoutExpired, OSError):
            ok = False
        if ok:
            state.successes, state.failures = state.successes + 1, 0
            if state.successes >= probe.success_threshold:
                state.result = True
        else:
            state.failures, state.successes = state.failures + 1, 0
            if state.failures >= probe.failure_threshold:
                state.result = False

    def _tick_container(self, c: _Container) -> bool:
        """One step of a main container; True when something a status shows changed."""
        before = c.snapshot()
        if c.proc is not None:
            code = c.proc.poll()
            if code is not None:
                self._exited(c, code)
            else:
                now = time.monotonic()
                startup = c.probes.get("startup")
                started = startup is None or startup.result is True
                for kind in ("startup", "readiness", "liveness"):
                    state = c.probes.get(kind)
                    if state is None or now < state.next_at or (kind != "startup" and not started):
                        continue
                    if kind == "startup" and state.result is True:
                        continue  # a startup probe stops once it succeeded
                    self._probe(c, state)
                    if kind in ("startup", "liveness") and state.result is False:
                        # The kubelet kills the container (grace: the pod's), then restarts it per policy.
                        c.kill_reason = f"Container {c.spec.name} failed {kind} probe, will be restarted"
                        _signal_group(c.proc, signal.SIGTERM)
                        try:
                            c.proc.wait(self.request.grace_period_s)
                        except subprocess.TimeoutExpired:
                            _signal_group(c.proc, signal.SIGKILL)
                            c.proc.wait()
                        self._exited(c, c.proc.returncode)
                        break
        elif c.restart_at is not None and time.monotonic() >= c.restart_at:
            c.restart_count += 1
            self._launch(c)
        elif c.restart_at is None and c.terminated is None:
            self._launch(c)
        return c.snapshot() != before

    def _run_init(self) -> bool:
        """Init containers, one after the other, each to completion. False: stop requested or failed for good."""
        for c in self._init:
            while True:
                if self._stop_requested is not None:
                    return False
                with self._lock:
                    if c.proc is None and (c.restart_at is None or time.monotonic() >= c.restart_at):
                        if c.restart_at is not None:
                            c.restart_count += 1
                        self._launch(c)
                    proc = c.proc
                self._changed()
                if proc is None:
                    if c.restart_at is None:
                        self._failed_init = c.spec.name
                        return False
                    self._wake.wait(TICK_S)
                    continue
                code = _wait_or_stop(proc, self)
                if code is None:
                    return False
                with self._lock:
                    self._exited(c, code)
                    # An init container that succeeded is done; policy Always/OnFailure retries a failed one.
                    if code == 0:
                        c.restart_at = None
                        break
                    if self.request.restart_policy == "Never":
                        c.restart_at = None
                        self._failed_init = c.spec.name
                        return False
        return True

    def _exited_start_error(self, c: _Container) -> None:
        if self.request.restart_policy != "Never":
            c.backoff_count += 1
            c.restart_at = time.monotonic() + self._backoff.delay(c.backoff_count)

    def _run(self) -> None:
        try:
            if self._init and not self._run_init():
                return
            with self._lock:
                self._initialized = True
            self._changed()
            while self._stop_requested is None:
                changed = False
                with self._lock:
                    for c in self._main:
                        changed = self._tick_container(c) or changed
                if changed:
                    self._changed()
                self._wake.wait(TICK_S)
                self._wake.clear()
        finally:
            self._kill_all()
            self._stopped.set()
            self._changed()

    def _kill_all(self) -> None:
        """killContainer for every running process: SIGTERM, then SIGKILL at the grace deadline."""
        with self._lock:
            running = [c for c in (*self._init, *self._main) if c.proc is not None]
            deadline = self._stop_requested if self._stop_requested is not None else time.monotonic()
        for c in running:
            assert c.proc is not None
            _signal_group(c.proc, signal.SIGTERM)
        for c in running:
            assert c.proc is not None
            try:
                c.proc.wait(max(deadline - time.monotonic(), 0.0))
            except subprocess.TimeoutExpired:
                _signal_group(c.proc, signal.SIGKILL)
                c.proc.wait()
        with self._lock:
            for c in running:
                assert c.proc is not None
                self._exited(c, c.proc.returncode)


def _signal_group(proc: subprocess.Popen[bytes], sig: signal.Signals) -> None:
    _killpg(proc.pid, sig)


def _killpg(pgid: int | None, sig: signal.Signals) -> None:
    if pgid is None:
        return
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, sig)


def _wait_or_stop(proc: subprocess.Popen[bytes], pod: ProcessPod) -> int | None:
    """Wait for an init container to exit; None when a stop was requested first (the supervisor kills it)."""
    while True:
        code = proc.poll()
        if code is not None:
            return code
        if pod._stop_requested is not None:
            return None
        pod._wake.wait(TICK_S)


class HostProcessRuntime:
    """Runs and tracks ProcessPods by pod uid."""

    def __init__(self, log_root: Path, backoff: RestartBackoff | None = None) -> None:
        self._log_root = log_root
        self._backoff = backoff or RestartBackoff()
        self._pods: dict[str, ProcessPod] = {}
        self._lock = threading.Lock()

    @property
    def name(self) -> str:
        return NAME

    def start(self, request: ProcessPodRequest, on_change: Callable[[], None]) -> ProcessPod:
        with self._lock:
            existing = self._pods.get(request.uid)
            if existing is not None:
                return existing
            pod = ProcessPod(request, self._log_root, on_change, self._backoff)
            self._pods[request.uid] = pod
        pod.start()
        return pod

    def get(self, uid: str) -> ProcessPod | None:
        with self._lock:
            return self._pods.get(uid)

    def forget(self, uid: str) -> None:
        with self._lock:
            pod = self._pods.get(uid)
            if pod is not None and pod.snapshot().stopped:
                del self._pods[uid]

    def alive(self) -> set[str]:
        """Uids of pods with a process that may still run (not stopped yet)."""
        with self._lock:
            pods = dict(self._pods)
        return {uid for uid, pod in pods.items() if not pod.snapshot().stopped}

    def stop_all(self, grace_period_s: float, timeout_s: float) -> None:
        with self._lock:
            pods = list(self._pods.values())
        for pod in pods:
            pod.stop(grace_period_s)
        deadline = time.monotonic() + timeout_s
        for pod in pods:
            pod.wait_stopped(max(deadline - time.monotonic(), 0.0))
