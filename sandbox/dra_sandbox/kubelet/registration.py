"""Plugin registration as the kubelet does it, one session per registration socket.

A session: GetInfo -> validate -> pick the DRA service -> dial ``unix:<endpoint>`` (insecure) ->
register -> NotifyRegistrationStatus(true). Any failed step sends NotifyRegistrationStatus(false)
with the error (best effort) and the session starts over after a backoff. Once registered it keeps
calling GetInfo every `poll_interval_s` and deregisters after `failures_to_deregister` failures in a
row, then re-registers as soon as the socket answers again. A plugin that advertises
"v1alpha1.DRAResourceHealth" gets its health stream opened.

Unlike the kubelet (which connects lazily), the simulator waits until the DRA endpoint accepts a
connection before it reports success, so a wrong endpoint fails registration visibly.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial
from typing import TypeVar

import grpc

from dra_driver._gen import pluginregistration_v1_pb2, pluginregistration_v1_pb2_grpc
from dra_sandbox.kubelet.clock import Backoff, Clock
from dra_sandbox.kubelet.draclient import DEFAULT_CALL_TIMEOUT_S, DraClient
from dra_sandbox.kubelet.health import DEFAULT_REOPEN_S, HealthStore, HealthStream
from dra_sandbox.kubelet.versions import (
    KubeletGates,
    Registration,
    RegistrationError,
    validate_plugin_info,
)
from dra_sandbox.loopthread import LoopThread

log = logging.getLogger(__name__)
_T = TypeVar("_T")


class _Stopping(Exception):
    """stop() has closed the channels: the registration thread ends."""
QUIET_ATTEMPTS = 3  # failed registrations in a row logged at debug before the first warning


@dataclass(frozen=True)
class RegistrationConfig:
    poll_interval_s: float = 10.0
    failures_to_deregister: int = 2
    get_info_timeout_s: float = 10.0
    dial_timeout_s: float = 10.0
    backoff: Backoff = field(default_factory=lambda: Backoff(initial=0.5, factor=2.0, maximum=30.0))
    health_reopen_s: float = DEFAULT_REOPEN_S
    call_timeout_s: float = DEFAULT_CALL_TIMEOUT_S
    # The kubelet's version and gates: which health service it opens (KubeletSimulator sets it from KubeletConfig).
    gates: KubeletGates = field(default_factory=KubeletGates)


@dataclass(frozen=True)
class RegisteredPlugin:
    driver: str
    socket_path: str
    endpoint: str
    service: str
    health_service: str  # "" when no health stream is open
    registered_at: float
    client: DraClient


class PluginStore:
    """Registered plugins by registration socket; the newest plugin of a driver serves its calls."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._plugins: dict[str, RegisteredPlugin] = {}
        self._listeners: list[Callable[[], None]] = []

    def subscribe(self, listener: Callable[[], None]) -> None:
        with self._lock:
            self._listeners.append(listener)

    def _notify(self) -> None:
        with self._lock:
            listeners = list(self._listeners)
        for listener in listeners:
            listener()

    def add(self, plugin: RegisteredPlugin) -> None:
        with self._lock:
            self._plugins[plugin.socket_path] = plugin
        self._notify()

    def remove(self, socket_path: str) -> RegisteredPlugin | None:
        with self._lock:
            plugin = self._plugins.pop(socket_path, None)
        if plugin is not None:
            self._notify()
        return plugin

    def get(self, driver: str) -> RegisteredPlugin | None:
        with self._lock:
            candidates = [p for p in self._plugins.values() if p.driver == driver]
        return max(candidates, key=lambda p: p.registered_at, default=None)

    def drivers(self) -> frozenset[str]:
        with self._lock:
            return frozenset(p.driver for p in self._plugins.values())

    def all(self) -> list[RegisteredPlugin]:
        with self._lock:
            return list(self._plugins.values())


class PluginSession:
    """Registers one socket and keeps it registered while it answers; runs in its own thread."""

    def __init__(
        self,
        socket_path: str,
        store: PluginStore,
        health: HealthStore,
        clock: Clock,
        config: RegistrationConfig,
    ) -> None:
        self.socket_path = socket_path
        self._store = store
        self._health = health
        self._clock = clock
        self._config = config
        self._worker = LoopThread(self._run, f"plugin-{socket_path}", join_timeout_s=10.0)
        self._lock = threading.Lock()
        self._channels: list[grpc.Channel] = []
        self._health_stream: HealthStream | None = None
        self._dra_channel: grpc.Channel | None = None
        self._closing = False  # under _lock: stop() closed the channels; nothing may open or use one after that
        self.state = "new"
        self.last_error: str | None = None
        self.registrations = 0
        self.failures = 0

    def start(self) -> None:
        self._worker.start()

    def stop(self) -> None:
        self._worker.stopping.set()
        with self._lock:
            self._closing = True  # from here on the thread opens, activates and makes stubs on nothing
            stream, self._health_stream = self._health_stream, None
        if stream is not None:
            stream.stop()  # joins its thread: it makes no stub on a channel after this
        # Closed under the lock that stub creation takes: grpc's C core crashes the process (SIGSEGV in
        # _get_registered_call_handle) when a channel is closed while another thread registers a method on it.
        with self._lock:
            for channel in self._channels:
                channel.close()  # cancels an in-flight GetInfo so the thread notices at once
        self._worker.join()
        self._deregister("registration socket removed")
        self.state = "stopped"

    # ---- thread ------------------------------------------------------------------------------------

    def _open(self, target: str) -> grpc.Channel:
        with self._lock:
            if self._closing:
                raise _Stopping
            channel = grpc.insecure_channel(f"unix:{target}")
            self._channels.append(channel)
        return channel

    def _on_open_channel(self, make: Callable[[], _T]) -> _T:
        """`make()` (a stub or client over one of our channels) while no stop() can close the channel under it."""
        with self._lock:
            if self._closing:
                raise _Stopping
            return make()

    def _close(self, channel: grpc.Channel) -> None:
        with self._lock:
            if channel in self._channels:
                self._channels.remove(channel)
        channel.close()

    def _run(self) -> None:
        try:
            self._loop()
        except (ValueError, _Stopping):
            # grpc raises ValueError for a call on a channel that stop() closed under this thread: stopping.
            if not self._worker.stopping.is_set():
                raise

    def _loop(self) -> None:
        attempt = 0
        lost = False  # deregistered after failed polls: retry at the poll pace, without backoff growth
        while not self._worker.stopping.is_set():
            reg_channel = self._open(self.socket_path)
            stub = self._on_open_channel(partial(pluginregistration_v1_pb2_grpc.RegistrationStub, reg_channel))
            try:
                self.state = "registering"
                self._register_once(stub)
            except (RegistrationError, grpc.RpcError) as exc:
                self._close(reg_channel)
                if self._worker.stopping.is_set():
                    return
                self.failures += 1
                self.last_error = str(exc) if isinstance(exc, RegistrationError) else _rpc_message(exc)
                self.state = "failed"
                # A socket seen a moment before its server listens, or a plugin restarting, fails once or twice
                # and is retried: a warning only once it keeps failing.
                level = logging.WARNING if attempt + 1 >= QUIET_ATTEMPTS or lost else logging.DEBUG
                log.log(level, "registration of %s failed: %s", self.socket_path, self.last_error)
                if not lost:
                    self._notify_failure(self.socket_path, self.last_error)
                attempt += 1
                delay = self._config.poll_interval_s if lost else self._config.backoff.delay(attempt)
                if self._clock.wait(self._worker.stopping, delay):
                    return
                continue
            attempt = 0
            lost = False
            self._monitor(stub)
            self._close(reg_channel)
            if self._worker.stopping.is_set():
                return
            lost = True

    @property
    def health_stream(self) -> HealthStream | None:
        """The open health stream of the registered plugin (None before registration or without one)."""
        return self._health_stream

    def _register_once(self, stub: pluginregistration_v1_pb2_grpc.RegistrationStub) -> None:
        info = stub.GetInfo(pluginregistration_v1_pb2.InfoRequest(), timeout=self._config.get_info_timeout_s)
        registration = validate_plugin_info(info, self._config.gates)
        dra_channel = self._open(registration.endpoint)
        if not self._wait_ready(dra_channel):
            self._close(dra_channel)
            raise RegistrationError(
                f"cannot connect to the DRA endpoint {registration.endpoint} within {self._config.dial_timeout_s} s"
            )
        plugin = RegisteredPlugin(
            driver=registration.driver,
            socket_path=self.socket_path,
            endpoint=registration.endpoint,
            service=registration.service,
            health_service=registration.health_service,
            registered_at=self._clock.monotonic(),
            client=self._on_open_channel(
                partial(DraClient, dra_channel, registration.service, self._config.call_timeout_s)),
        )
        try:
            stub.NotifyRegistrationStatus(
                pluginregistration_v1_pb2.RegistrationStatus(plugin_registered=True),
                timeout=self._config.get_info_timeout_s,
            )
        except grpc.RpcError:
            self._close(dra_channel)
            raise
        self._activate(plugin, registration, dra_channel)

    def _wait_ready(self, channel: grpc.Channel) -> bool:
        """Wait for the connection in short slices, so that stop() is not held up by a dead endpoint.
        A real deadline (time.monotonic), not the injectable clock: this bounds real network I/O."""
        future = grpc.channel_ready_future(channel)
        deadline = time.monotonic() + self._config.dial_timeout_s
        while True:
            try:
                future.result(timeout=min(0.1, max(0.0, deadline - time.monotonic())))
                return True
            except grpc.FutureTimeoutError:
                if self._worker.stopping.is_set() or time.monotonic() >= deadline:
                    future.cancel()
                    return False

    def _activate(self, plugin: RegisteredPlugin, registration: Registration, dra_channel: grpc.Channel) -> None:
        with self._lock:  # a stop() now either sees the stream (and stops it) or makes this raise
            if self._closing:
                raise _Stopping
            self._dra_channel = dra_channel
            if registration.health:
                stream = HealthStream(
                    plugin.driver, dra_channel, self._health, self._clock, reopen_s=self._config.health_reopen_s,
                    service=registration.health_service,
                )
                self._health_stream = stream
                stream.start()
        self._store.add(plugin)
        self.registrations += 1
        self.state = "registered"
        self.last_error = None
        log.info("registered DRA driver %s (%s) from %s", plugin.driver, plugin.service, self.socket_path)

    def _monitor(self, stub: pluginregistration_v1_pb2_grpc.RegistrationStub) -> None:
        failures = 0
        while not self._clock.wait(self._worker.stopping, self._config.poll_interval_s):
            try:
                stub.GetInfo(pluginregistration_v1_pb2.InfoRequest(), timeout=self._config.get_info_timeout_s)
                failures = 0
            except grpc.RpcError as exc:
                if self._worker.stopping.is_set():
                    return
                failures += 1
                log.info("GetInfo on %s failed (%d in a row): %s", self.socket_path, failures, _rpc_message(exc))
                if failures >= self._config.failures_to_deregister:
                    self._deregister(f"GetInfo failed {failures} times in a row")
                    return

    def _deregister(self, reason: str) -> None:
        plugin = self._store.remove(self.socket_path)
        stream, self._health_stream = self._health_stream, None
        if stream is not None:
            stream.stop()
        with self._lock:
            channel, self._dra_channel = self._dra_channel, None
        if channel is not None:
            self._close(channel)
        if plugin is not None:
            self.state = "deregistered"
            log.info("deregistered DRA driver %s from %s: %s", plugin.driver, self.socket_path, reason)

    def _notify_failure(self, socket_path: str, error: str) -> None:
        # Best effort on a fresh channel: the plugin may be the reason the registration failed.
        channel = grpc.insecure_channel(f"unix:{socket_path}")
        try:
            pluginregistration_v1_pb2_grpc.RegistrationStub(channel).NotifyRegistrationStatus(
                pluginregistration_v1_pb2.RegistrationStatus(plugin_registered=False, error=error),
                timeout=self._config.get_info_timeout_s,
            )
        except grpc.RpcError:
            pass  # the Go helper answers plugin_registered=false with an error; nothing to do either way
        finally:
            with contextlib.suppress(Exception):
                channel.close()


def _rpc_message(exc: grpc.RpcError) -> str:
    if isinstance(exc, grpc.Call):
        return f"{exc.code().name}: {exc.details()}"
    return str(exc)


class PluginManager:
    """Glue between the plugin watcher and the sessions: a socket appears -> session; removed -> stop it."""

    def __init__(self, store: PluginStore, health: HealthStore, clock: Clock, config: RegistrationConfig) -> None:
        # Every session registers into the one store, with the kubelet's health store, clock and settings.
        self._new_session = partial(PluginSession, store=store, health=health, clock=clock, config=config)
        self._lock = threading.Lock()
        self._sessions: dict[str, PluginSession] = {}

    def socket_added(self, path: str) -> None:
        with self._lock:
            old = self._sessions.pop(path, None)
        if old is not None:
            old.stop()
        session = self._new_session(path)
        with self._lock:
            self._sessions[path] = session
        session.start()

    def socket_removed(self, path: str) -> None:
        with self._lock:
            session = self._sessions.pop(path, None)
        if session is not None:
            session.stop()

    def session(self, path: str) -> PluginSession | None:
        with self._lock:
            return self._sessions.get(path)

    def stop(self) -> None:
        with self._lock:
            sessions = list(self._sessions.values())
            self._sessions.clear()
        for session in sessions:
            session.stop()
