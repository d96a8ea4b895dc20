"""`ApiServer`: the in-process Kubernetes API server, served from a background thread.

aiohttp on a private event loop: one thread serves any number of concurrent watches cheaply, and
every state change happens on that loop, so the store needs no locks and a watch registration can
never race a write. Tests and other sandbox components talk to it over real HTTP only.
"""

from __future__ import annotations

import asyncio
import logging
import os
import tempfile
import threading
from collections.abc import Callable, Mapping, Sequence
from datetime import UTC, datetime
from pathlib import Path
from types import TracebackType
from typing import TYPE_CHECKING, Any, TypeVar

import yaml
from aiohttp import web

from .cleanup import CrdController, NamespaceController
from .errors import ApiError
from .gc import GarbageCollector
from .handlers import ServerContext, build_app
from .hooks import Faults, RequestLog
from .kinds import INITIAL_NAMESPACES
from .lifecycle import Clock, Resources, Target
from .registry import Registry, builtin_types
from .settings import Settings
from .shapes import ShapeRecorder
from .store import Store
from .validation.admission import Admission, CelSyntaxCheck
from .validation.options import parse_kube_version
from .webhooks import ValidatingWebhooks
from .workloads import WorkloadController

if TYPE_CHECKING:
    import kubernetes.client

    from dra_driver.k8s.client import KubeRest
    from dra_driver.k8s.kubeconfig import ApiConnection

LOG = logging.getLogger(__name__)
T = TypeVar("T")
START_TIMEOUT_S = 30.0
SANDBOX_USER_AGENT = "dra-sandbox"
STOP_TIMEOUT_S = 15.0


def utc_now() -> datetime:
    return datetime.now(UTC)


class ApiServer:
    """A Kubernetes API server in memory. `start()` returns once it is listening on `url`."""

    def __init__(
        self,
        host: str = "127.0.0.1",
        port: int = 0,
        *,
        kube_version: str = "1.37.0",
        watch_history: int = 1000,
        bookmark_interval: float = 60.0,
        default_watch_timeout: float = 1800.0,
        max_hang_seconds: float = 30.0,
        garbage_collection: bool = True,
        clock: Clock = utc_now,
        faults: Faults | None = None,
        webhook_service_urls: Mapping[str, str] | None = None,
        feature_gates: Mapping[str, bool] | None = None,
        pod_log_roots: Sequence[Path] = (),
    ) -> None:
        self.host = host
        self._requested_port = port
        self.settings = Settings(
            kube_version=kube_version,
            watch_history=watch_history,
            bookmark_interval=bookmark_interval,
            default_watch_timeout=default_watch_timeout,
            max_hang_seconds=max_hang_seconds,
            garbage_collection=garbage_collection,
            webhook_service_urls=dict(webhook_service_urls or {}),
            feature_gates=dict(feature_gates or {}),
            pod_log_roots=tuple(pod_log_roots),
        )
        self.request_log = RequestLog()
        # Pass a subclass (chaos.ChaosFaults: random faults, outages) to get more than one-shot faults.
        self.faults = faults if faults is not None else Faults(max_hang_seconds)
        self._clock = clock
        self._thread: threading.Thread | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stop_event: asyncio.Event | None = None
        self._ready = threading.Event()
        self._error: BaseException | None = None
        self._port: int | None = None
        self._ctx: ServerContext | None = None

    # -- lifecycle --------------------------------------------------------------------------

    def start(self) -> ApiServer:
        if self._thread is not None:
            raise RuntimeError("ApiServer.start() was already called; create a new ApiServer to serve again")
        self._thread = threading.Thread(target=self._run, name="sandbox-apiserver", daemon=True)
        self._thread.start()
        if not self._ready.wait(START_TIMEOUT_S):
            raise RuntimeError(f"sandbox API server did not start listening within {START_TIMEOUT_S:.0f}s")
        if self._error is not None:
            self._thread.join(STOP_TIMEOUT_S)
            raise RuntimeError(f"sandbox API server failed to start on {self.host}:{self._requested_port}: "
                               f"{self._error}") from self._error
        return self

    def stop(self) -> None:
        """Stop serving: open watches end, hanging faults are released. Safe to call twice."""
        thread, loop, stop = self._thread, self._loop, self._stop_event
        if thread is None or loop is None or stop is None or not thread.is_alive():
            return
        loop.call_soon_threadsafe(stop.set)
        thread.join(STOP_TIMEOUT_S)

    def __enter__(self) -> ApiServer:
        return self.start()

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.stop()

    def _run(self) -> None:
        loop = asyncio.new_event_loop()
        self._loop = loop
        try:
            loop.run_until_complete(self._serve())
        except BaseException as exc:  # surfaced by start()
            self._error = exc
        finally:
            self._ready.set()
            loop.close()

    def _build_context(self, loop: asyncio.AbstractEventLoop) -> ServerContext:
        registry = Registry(builtin_types(self.settings.kube_minor, self.settings.validation_options().enabled_gates))
        store = Store(self.settings.watch_history)
        cel_check = CelSyntaxCheck(parse_kube_version(self.settings.kube_version))
        admission = Admission(self.settings.validation_options(cel_check=cel_check, derived_check=cel_check.derived))
        resources = Resources(store, registry, admission, self._clock)
        resources.webhooks = ValidatingWebhooks(store, self.settings.webhook_service_urls)

        def schedule(work: Callable[[], None]) -> None:
            def run() -> None:
                try:
                    work()
                except ApiError as exc:  # a controller lost a race with a client; the next change retries
                    LOG.debug("sandbox apiserver controller: %s", exc.message)

            loop.call_soon(run)

        def schedule_after(delay: float, work: Callable[[], None]) -> None:
            loop.call_later(delay, lambda: schedule(work))

        resources.add_listener(CrdController(resources, schedule))
        resources.add_listener(NamespaceController(resources, schedule))
        resources.add_listener(WorkloadController(resources, schedule, schedule_after))
        if self.settings.garbage_collection:
            resources.add_listener(GarbageCollector(resources, schedule))
        ns_rt = registry.by_key(("", "namespaces"))
        assert ns_rt is not None
        for name in INITIAL_NAMESPACES:
            resources.create(Target(ns_rt, "v1"), {"metadata": {"name": name}})
        return ServerContext(resources, registry, self.settings, self.request_log, self.faults, asyncio.Event(),
                             self._clock, ShapeRecorder.from_environment(os.environ))

    async def _serve(self) -> None:
        loop = asyncio.get_running_loop()
        self._stop_event = asyncio.Event()
        ctx = self._build_context(loop)
        self._ctx = ctx
        runner = web.AppRunner(build_app(ctx), handle_signals=False, access_log=None, handler_cancellation=True,
                               shutdown_timeout=2.0)
        await runner.setup()
        try:
            site = web.TCPSite(runner, self.host, self._requested_port)
            await site.start()
            address = runner.addresses[0]
            self._port = int(address[1])
            self._ready.set()
            await self._stop_event.wait()
            ctx.shutdown.set()
            ctx.resources.store.close_watchers()
        finally:
            await runner.cleanup()

    # -- access -----------------------------------------------------------------------------

    @property
    def port(self) -> int:
        if self._port is None:
            raise RuntimeError("the API server is not running: call start() first")
        return self._port

    @property
    def url(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}"

    def write_kubeconfig(self, path: str | os.PathLike[str], *, namespace: str = "default",
                         context: str = "sandbox") -> Path:
        """Write a kubeconfig (mode 0600) for kubernetes.config, kubectl and kopf; returns the path."""
        target = Path(path)
        doc = {
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [{"name": context, "cluster": {"server": self.url}}],
            # The server does not authenticate; a token keeps clients that insist on credentials happy.
            "users": [{"name": context, "user": {"token": "sandbox"}}],
            "contexts": [{"name": context, "context": {"cluster": context, "user": context, "namespace": namespace}}],
            "current-context": context,
            "preferences": {},
        }
        target.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=target.parent, prefix=".kubeconfig-")
        try:
            with os.fdopen(fd, "w") as fh:
                yaml.safe_dump(doc, fh, sort_keys=False)
            os.chmod(tmp, 0o600)
            os.replace(tmp, target)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise
        return target

    def api_client(self) -> kubernetes.client.ApiClient:
        """A `kubernetes.client.ApiClient` for this server (the global default configuration is untouched)."""
        import kubernetes.client  # imported lazily: the server itself does not need the client

        config = kubernetes.client.Configuration(host=self.url)
        config.api_key = {"BearerToken": "sandbox"}
        config.api_key_prefix = {"BearerToken": "Bearer"}
        return kubernetes.client.ApiClient(config)

    def connection(self) -> ApiConnection:
        """The product's connection to this server (what its loader makes of `write_kubeconfig`'s file)."""
        from dra_driver.k8s.kubeconfig import ApiConnection  # imported lazily: the server itself needs no client

        # The server does not authenticate; the same placeholder token as in write_kubeconfig's file.
        return ApiConnection(server=self.url, token="sandbox", source=f"sandbox API server {self.url}")  # noqa: S106

    def rest(self, timeout: float = 10.0) -> KubeRest:
        """The product's JSON client (`dra_driver.k8s.client.KubeRest`) for this server."""
        from dra_driver.k8s.client import KubeRest

        # The sandbox's own User-Agent: requests from a process of the bench (the scheduler stand-in of
        # `dra-sandbox up`...) are not the product's (shapes.py); the test suite marks in-process ones itself.
        return KubeRest(self.connection(), timeout, user_agent=SANDBOX_USER_AGENT)

    def _call(self, fn: Callable[[], T]) -> T:
        """Run `fn` on the server's loop (where all state lives) and return its result."""
        loop = self._loop
        if loop is None or self._ctx is None:
            raise RuntimeError("the API server is not running: call start() first")

        async def run() -> T:
            return fn()

        return asyncio.run_coroutine_threadsafe(run(), loop).result(STOP_TIMEOUT_S)

    @property
    def resource_version(self) -> int:
        """The current global resourceVersion (etcd revision)."""
        ctx = self._ctx
        assert ctx is not None, "the API server is not running"
        return self._call(lambda: ctx.resources.store.resource_version)

    @property
    def encodings_rendered(self) -> int:
        """How many object encodings the server has computed so far (encoding.py): LIST items and watch events
        served from the cache add none. For tests and benches that check the cache."""
        ctx = self._ctx
        assert ctx is not None, "the API server is not running"
        return self._call(lambda: ctx.resources.store.encodings.renders)

    def compact(self) -> int:
        """Drop all watch history, like an etcd compaction: watches from older versions now get 410.

        Returns the resourceVersion that history now starts after."""
        ctx = self._ctx
        assert ctx is not None, "the API server is not running"

        def run() -> int:
            ctx.resources.store.compact()
            return ctx.resources.store.resource_version

        return self._call(run)

    def snapshot(self, group: str, plural: str) -> list[dict[str, Any]]:
        """Stored objects of one resource, for test assertions that must not go through HTTP."""
        ctx = self._ctx
        assert ctx is not None, "the API server is not running"
        return self._call(lambda: [dict(o) for o in ctx.resources.store.objects((group, plural))])
