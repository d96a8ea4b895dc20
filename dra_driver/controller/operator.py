"""The controller as a kopf operator: handlers for GpuSharingPolicies, login from a kubeconfig, and running
kopf embedded (cluster-wide, standalone, with a liveness endpoint).

With leader election (`ControllerSettings.leader_election`, docs/policies.md "High availability") every replica
runs two kopf operators on one event loop: a *serving* one on all replicas (liveness, and the admission
webhook when enabled: admission must work whichever replica the Service picks) with no resource handlers,
and a *reconciling* one (policy handlers, timers, status counts, slice hygiene) started only while this
replica holds the Lease. Losing the Lease stops the reconciling operator and `operate` returns 1, so the
process exits non-zero and the pod restarts clean.

Each operator gets its own `kopf.OperatorRegistry`, so several can run in one process (the tests do) and
nothing is registered at import time. Handlers are synchronous: kopf runs them in its thread pool, and
they use the product's JSON REST client for the DeviceClasses.
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
import logging
import math
import socket
import threading
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

import kopf

from dra_driver import defaults
from dra_driver.backoff import Backoff
from dra_driver.cel.environment import DraCelEnvironment
from dra_driver.controller.clusterview import ClusterView
from dra_driver.controller.computedomains.loop import ComputeDomainController, ComputeDomainSettings
from dra_driver.controller.hygiene import Janitor
from dra_driver.controller.informer import (
    FEED_CLAIMS,
    FEED_NODES,
    FEED_SLICES,
    PAGE_TIMEOUT_S,
    SLICE_PAGE,
    Feed,
    Feeds,
    Query,
)
from dra_driver.controller.leader import LeaderElector, LeaseSettings
from dra_driver.controller.metrics import ControllerMetrics
from dra_driver.controller.reconcile import Outcome, reconcile, status_patch
from dra_driver.controller.webhook import WebhookSettings
from dra_driver.controller.webhook import register as register_webhook
from dra_driver.k8s.client import ApiError, JsonObject, KubeRest, WatchStream, connect
from dra_driver.k8s.events import EventRecorder
from dra_driver.k8s.kubeconfig import ApiConnection
from dra_driver.observability.endpoint import HttpEndpoint
from dra_driver.policy.model import GROUP, PLURAL, VERSION, PolicyError, decode_policy
from dra_driver.policy.render import selector_expressions
from dra_driver.ports import listening

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class ControllerSettings:
    driver_name: str
    kubeconfig: str | None = None
    healthz_port: int = 8080  # -1: no liveness endpoint
    healthz_host: str = "0.0.0.0"  # noqa: S104 - the kubelet's probe comes from outside the pod
    resync_seconds: float = 60.0  # re-check every policy's class (repairs drift, resolves freed conflicts)
    watch_timeout_seconds: int = 300
    webhook: WebhookSettings | None = None  # None: no admission webhook (docs/webhook.md)
    # status.devices/nodes/claims are recounted shortly after a change, but at most this often per policy.
    status_interval_seconds: float = defaults.CONTROLLER_STATUS_INTERVAL_S
    # The driver's ResourceSlices naming a Node missing this long are deleted; <= 0 turns the hygiene off.
    stale_slice_grace_seconds: float = 300.0
    # None: no leader election (one replica). Otherwise only the Lease holder reconciles (the one HA mechanism:
    # docs/policies.md "High availability").
    leader_election: LeaseSettings | None = None
    metrics_port: int = -1  # Prometheus /metrics; -1: not served (0: any free port, for tests)
    metrics_host: str = "0.0.0.0"  # noqa: S104 - Prometheus scrapes from outside the pod
    # None: no ComputeDomain reconciler (`--compute-domains` off; docs/compute-domains.md "The controller").
    compute_domains: ComputeDomainSettings | None = None


def connection_info(credentials: ApiConnection) -> kopf.ConnectionInfo:
    """kopf's credentials from the controller's own connection (kubeconfig or in-cluster), so that kopf and the
    handlers' `KubeRest` talk to the same server as the same user. kopf calls the login handler again on a 401:
    the token is then re-read (a rotated service-account token)."""
    c = credentials
    return kopf.ConnectionInfo(
        server=c.server,
        # kopf takes one of path or data; a kubeconfig may carry both (the loader reads both).
        ca_path=c.ca_file if c.ca_file and not c.ca_data else None,
        ca_data=c.ca_data,
        insecure=c.insecure,
        token=c.token,
        certificate_path=c.cert_file if not c.cert_data else None,
        certificate_data=c.cert_data,
        private_key_path=c.key_file if not c.key_data else None,
        private_key_data=c.key_data,
        username=c.username,
        password=c.password,
        proxy_url=c.proxy_url,
    )


def feeds(
    options: ControllerSettings, rest: KubeRest, view: ClusterView, domains: ComputeDomainController | None = None
) -> Feeds:
    """The view's feeds (not started): the driver's ResourceSlices (`spec.driver` selected on the server), every
    ResourceClaim (the policies' claim counts; the ComputeDomain loop's channel claims) and the Nodes (slice
    hygiene). Paths spelled out per request (the RBAC scan reads them)."""

    def claim(event_type: str, body: JsonObject) -> None:
        view.on_claim(event_type, body)
        if domains is not None:
            domains.on_claim(event_type, body)  # channel claims waiting for imex-ready (KEP-5007)

    def slices_page(query: Query) -> JsonObject:
        return rest.request("GET", FEED_SLICES, query=query, timeout=PAGE_TIMEOUT_S)

    def slices_watch(query: Query, timeout: int) -> WatchStream:
        return rest.watch(FEED_SLICES, query=query, timeout_seconds=timeout)

    def claims_page(query: Query) -> JsonObject:
        return rest.request("GET", FEED_CLAIMS, query=query, timeout=PAGE_TIMEOUT_S)

    def claims_watch(query: Query, timeout: int) -> WatchStream:
        return rest.watch(FEED_CLAIMS, query=query, timeout_seconds=timeout)

    def nodes_page(query: Query) -> JsonObject:
        return rest.request("GET", FEED_NODES, query=query, timeout=PAGE_TIMEOUT_S)

    def nodes_watch(query: Query, timeout: int) -> WatchStream:
        return rest.watch(FEED_NODES, query=query, timeout_seconds=timeout)

    by_driver = {"fieldSelector": f"spec.driver={options.driver_name}"}
    return Feeds(
        [
            Feed("slices", slices_page, slices_watch, view.on_slice, query=by_driver, page=SLICE_PAGE),
            Feed("claims", claims_page, claims_watch, claim),
            Feed("nodes", nodes_page, nodes_watch, view.on_node, by_name=True),
        ],
        watch_timeout_seconds=options.watch_timeout_seconds,
        on_synced=view.mark_synced,
    )


def build_registry(
    options: ControllerSettings,
    rest: KubeRest,
    view: ClusterView | None = None,
    metrics: ControllerMetrics | None = None,
    *,
    reconciling: bool = True,
    admission: bool = True,
    domains: ComputeDomainController | None = None,
) -> kopf.OperatorRegistry:
    """The operator's handlers, bound to one API client (and one view of slices, claims and nodes).
    `reconciling`: the policy handlers, timers and watches; `admission`: the webhook's handlers (when
    `options.webhook` is set)."""
    registry = kopf.OperatorRegistry()
    metrics = metrics if metrics is not None else ControllerMetrics()
    cel = DraCelEnvironment()
    view = view if view is not None else ClusterView(options.driver_name, cel)
    resource = (GROUP, VERSION, PLURAL)

    @kopf.on.login(registry=registry)
    def login(**_: Any) -> kopf.ConnectionInfo:
        return connection_info(rest.credentials())

    @kopf.on.startup(registry=registry)
    def configure(settings: kopf.OperatorSettings, **_: Any) -> None:
        settings.watching.server_timeout = options.watch_timeout_seconds
        settings.watching.client_timeout = options.watch_timeout_seconds + 30
        # kopf's own annotations (progress, last handled spec) and finalizer under our group, not zalando.org.
        settings.persistence.finalizer = f"{GROUP}/controller"
        settings.persistence.progress_storage = kopf.AnnotationsProgressStorage(prefix=GROUP)
        settings.persistence.diffbase_storage = kopf.AnnotationsDiffBaseStorage(prefix=GROUP)
        settings.posting.level = logging.INFO

    if options.webhook is not None and admission:
        register_webhook(registry, options.webhook, driver=options.driver_name, cel=cel, metrics=metrics)
    if not reconciling:
        return registry

    def handle(body: kopf.Body, patch: kopf.Patch, logger: kopf.Logger, timer: bool, retry: int = 0) -> None:
        started = time.perf_counter()
        try:
            outcome = reconcile(body, rest, driver=options.driver_name, cel=cel)
        except Exception:
            metrics.observe_reconcile("error", time.perf_counter() - started)
            raise
        metrics.observe_reconcile(
            "ready" if outcome.ready else "retry" if outcome.retry else "invalid", time.perf_counter() - started
        )
        changes = status_patch(body, outcome)
        for key, value in changes.items():
            patch.status[key] = value
        _log(logger, body, outcome, quiet=timer and not changes and outcome.action == "none")
        _event(body, outcome, transition="conditions" in changes)
        if outcome.retry and not timer:
            # The status is written with this attempt; kopf tries again later (the resync timer does too).
            # Backoff 1, 2, 4... s (at most 30 s or the resync interval): an API blip is repaired in about a
            # second, a long outage is not hammered.
            raise kopf.TemporaryError(outcome.message, delay=retry_delay(retry, options.resync_seconds))

    @kopf.on.resume(*resource, id="resume", registry=registry)
    @kopf.on.create(*resource, id="create", registry=registry)
    @kopf.on.update(*resource, id="update", registry=registry)
    def changed(body: kopf.Body, patch: kopf.Patch, logger: kopf.Logger, retry: int, **_: Any) -> None:
        handle(body, patch, logger, timer=False, retry=retry)

    @kopf.timer(
        *resource, id="resync", interval=options.resync_seconds, idle=options.resync_seconds / 2, registry=registry
    )
    def resync(body: kopf.Body, patch: kopf.Patch, logger: kopf.Logger, **_: Any) -> None:
        handle(body, patch, logger, timer=True)

    @kopf.on.event(*resource, id="policy-metrics", registry=registry)
    def policy_event(type: str | None, body: kopf.Body, **_: Any) -> None:
        metrics.observe_policy(type, body)
        view.notify()  # a policy's edit (its selectors, or its status) may need its counts written again

    # The view behind status counts and slice hygiene is fed by `feeds()` (informer.py: one paged LIST per
    # resource, then a watch), not by kopf: kopf would deliver a fleet's slices one event at a time through its
    # handler pipeline (86 s to the first counts at 1,000 nodes; docs/benchmarks.md).
    if domains is not None:
        # A domain created, changed or being deleted: the ComputeDomain loop runs a pass now (it also runs every
        # status interval). kopf.on.event adds no finalizer and no annotations: the loop owns the domain's.
        @kopf.on.event("gpu.dra.dev", "v1beta1", "computedomains", id="computedomains", registry=registry)
        def domain_event(**_: Any) -> None:
            domains.notify()

    @kopf.daemon(*resource, id="counts", registry=registry)
    async def counts(body: kopf.Body, stopped: kopf.DaemonStopped, **_: Any) -> None:
        name = str(body.get("metadata", {}).get("name"))

        def write(changes: dict[str, int | None]) -> None:
            rest.request(
                "PATCH",
                f"/apis/{GROUP}/{VERSION}/{PLURAL}/{name}/status",
                body={"status": changes},
                content_type="application/merge-patch+json",
            )

        await keep_counts(
            body, view, write, driver=options.driver_name, interval=options.status_interval_seconds, stopped=stopped
        )

    return registry


# A burst of events (a node's few slices, written one after the other) is counted once: a recount waits until the
# view has been quiet this long.
COUNTS_SETTLE_SECONDS = 0.2


class StopFlag(Protocol):
    """What keep_counts needs of kopf's `stopped` (kopf.DaemonStopped of an async daemon)."""

    def __bool__(self) -> bool: ...

    def wait(self, timeout: float | None = None) -> Awaitable[Any]: ...


async def keep_counts(
    body: Mapping[str, Any],
    view: ClusterView,
    write: Callable[[dict[str, int | None]], None],
    *,
    driver: str,
    interval: float,
    stopped: StopFlag,
) -> None:
    """Keep one policy's status.devices/nodes/claims current until `stopped`: recount when the view, the policy's
    spec or those status fields changed, once nothing changed for COUNTS_SETTLE_SECONDS (or one interval passed),
    and at most once per `interval` (a steady stream of changes makes one recount and at most one status patch
    per interval); write only the fields that differ.

    `body` is kopf's live view of the policy. A recount of an unchanged view costs a lookup (ClusterView memo), a
    changed view the changed slices. Counting and writing run in the executor: on a large fleet they may take a
    while and must not hold up kopf's event loop."""
    loop = asyncio.get_running_loop()
    wake = asyncio.Event()

    def woken() -> None:  # in the thread of the event
        with contextlib.suppress(RuntimeError):  # the loop closed while the operator stops
            loop.call_soon_threadsafe(wake.set)

    unsubscribe = view.subscribe(woken)
    counted: tuple[Any, ...] | None = None  # the state last counted, as it reads once our patch is seen
    last = -math.inf  # when
    try:
        while not stopped:
            # Nothing is counted before the view holds every feed's first LIST (a part of the fleet is no count).
            if not view.synced or _counts_state(view, body) == counted:
                wake.clear()
                # Until a change (or the stop flag; kopf's own events may not wake us, so look again now and then).
                waits = [asyncio.ensure_future(wake.wait()), asyncio.ensure_future(stopped.wait(max(interval, 1.0)))]
                try:
                    await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
                finally:
                    for waiting in waits:
                        waiting.cancel()
                continue
            # Debounce: until nothing changed for COUNTS_SETTLE_SECONDS (a node's slices arrive one after the
            # other), but no longer than one interval; then at most one recount per interval.
            noticed, seen = loop.time(), _counts_state(view, body)
            while True:
                await stopped.wait(COUNTS_SETTLE_SECONDS)
                now = _counts_state(view, body)
                if stopped or now == seen or loop.time() >= noticed + interval:
                    break
                seen = now
            await stopped.wait(max(0.0, last + interval - loop.time()))
            if stopped:
                break
            last = loop.time()
            state = _counts_state(view, body)
            snapshot = copy.deepcopy(dict(body))  # kopf updates the live body while the executor reads it
            changes = await loop.run_in_executor(None, counts_patch, snapshot, view, driver)
            if changes:
                try:
                    await loop.run_in_executor(None, write, changes)
                except ApiError as exc:
                    log.warning("policy %s: status counts not written: %s", body.get("metadata", {}).get("name"), exc)
                    counted = None  # try again after the interval
                    continue
            # Our own patch, once the watch brings it back, is no change.
            counted = (*state[:2], *(changes.get(k, v) for k, v in zip(_COUNTS, state[2:], strict=True)))
    finally:
        unsubscribe()


_COUNTS = ("devices", "nodes", "claims")


def _counts_state(view: ClusterView, body: Mapping[str, Any]) -> tuple[Any, ...]:
    """What the policy's counts depend on or show: the view's version, the spec's generation, the counts shown."""
    status = body.get("status") or {}
    return (view.version, body.get("metadata", {}).get("generation"), *(status.get(k) for k in _COUNTS))


def retry_delay(retry: int, resync_seconds: float) -> float:
    """Seconds before kopf retries a reconcile that failed for the `retry`-th time (0 first)."""
    return Backoff(1.0, min(30.0, max(resync_seconds, 1.0))).delay(retry)


def counts_patch(body: Any, view: ClusterView, driver: str) -> dict[str, int | None]:
    """status.devices/nodes/claims to merge-patch (only those that differ); removed for an invalid policy."""
    try:
        policy = decode_policy(body)
    except PolicyError:
        wanted: dict[str, int | None] = {"devices": None, "nodes": None, "claims": None}
    else:
        found = view.counts(selector_expressions(policy, driver), policy.device_class_name)
        wanted = {"devices": found.devices, "nodes": found.nodes, "claims": found.claims}
    status = body.get("status") or {}
    return {k: v for k, v in wanted.items() if status.get(k) != v}


def _event(body: kopf.Body, outcome: Outcome, *, transition: bool) -> None:
    """A Kubernetes Event on the policy when its class is written or its Ready condition changes (posted by
    kopf in the background, independent of the log level)."""
    if outcome.action != "none":
        reason = "DeviceClassCreated" if outcome.action == "created" else "DeviceClassUpdated"
        kopf.info(body, reason=reason, message=f"DeviceClass {outcome.device_class_name} {outcome.action}")
    elif transition and outcome.ready:
        kopf.info(body, reason=outcome.reason, message=outcome.message)
    elif transition:
        kopf.warn(body, reason=outcome.reason, message=outcome.message)


def _log(logger: kopf.Logger, body: kopf.Body, outcome: Outcome, *, quiet: bool) -> None:
    if quiet:
        return
    if outcome.ready:
        logger.info(
            "policy %s: DeviceClass %s %s",
            body.get("metadata", {}).get("name"),
            outcome.device_class_name,
            outcome.action if outcome.action != "none" else "unchanged",
        )
    else:
        logger.warning("policy %s: %s: %s", body.get("metadata", {}).get("name"), outcome.reason, outcome.message)


async def operate(
    options: ControllerSettings,
    rest: KubeRest,
    *,
    stop_flag: threading.Event | asyncio.Event | None = None,
    ready_flag: threading.Event | asyncio.Event | None = None,
    metrics: ControllerMetrics | None = None,
) -> int:
    """Run the operator until `stop_flag` is set (or, in the main thread, SIGINT/SIGTERM). Returns the exit
    status: 0 after a stop, 1 when this replica lost the leader Lease."""
    metrics = metrics if metrics is not None else ControllerMetrics()
    server = serve_metrics(options, metrics)
    try:
        if options.leader_election is None:
            metrics.leader.set(1)
            await _reconciler(options, rest, metrics, stop_flag=stop_flag, ready_flag=ready_flag, serving=True)
            return 0
        return await _elected(options, options.leader_election, rest, metrics, stop_flag, ready_flag)
    finally:
        if server is not None:
            server.stop()


def serve_metrics(options: ControllerSettings, metrics: ControllerMetrics) -> HttpEndpoint | None:
    """Prometheus' /metrics in a background thread (None when disabled), on the product's one HTTP endpoint (the
    plugin's too). The bound port is `.port` (`metrics_port=0` picks a free one). /healthz stays kopf's liveness
    endpoint: it answers from kopf's event loop, so a stalled loop fails the probe (a thread would not notice)."""
    if options.metrics_port < 0:
        return None
    server = listening(
        "--metrics-port",
        options.metrics_port,
        lambda: HttpEndpoint(
            registry=metrics.registry, host=options.metrics_host, port=options.metrics_port, name="metrics"
        ),
    )
    server.start()
    return server


async def _reconciler(
    options: ControllerSettings,
    rest: KubeRest,
    metrics: ControllerMetrics,
    *,
    stop_flag: threading.Event | asyncio.Event | None,
    ready_flag: threading.Event | asyncio.Event | None = None,
    serving: bool,
) -> None:
    """The reconciling kopf operator (plus slice hygiene). `serving`: also the liveness endpoint and the
    webhook (no leader election: one operator does everything)."""
    liveness = None
    if serving and options.healthz_port >= 0:
        liveness = f"http://{options.healthz_host}:{options.healthz_port}/healthz"
    view = ClusterView(options.driver_name, DraCelEnvironment())
    domains = None
    domains_task = None
    domains_stop = asyncio.Event()
    events = None
    if options.compute_domains is not None:
        events = EventRecorder(rest, component="dra-driver-controller", host=socket.gethostname())
        domains = ComputeDomainController(rest, options.compute_domains, metrics, events=events)
        domains_task = asyncio.create_task(domains.run(domains_stop), name="compute-domains")
    janitor = None
    if options.stale_slice_grace_seconds > 0:
        janitor = asyncio.create_task(
            Janitor(
                view,
                rest,
                grace_seconds=options.stale_slice_grace_seconds,
                on_deleted=lambda names: metrics.stale_slices_deleted.inc(len(names)),
            ).run(),
            name="slice-hygiene",
        )
    view_feeds = feeds(options, rest, view, domains)
    view_feeds.start()
    try:
        await kopf.operator(
            registry=build_registry(options, rest, view, metrics, admission=serving, domains=domains),
            clusterwide=True,
            standalone=True,  # no kopf peering: several replicas coordinate through the leader Lease
            liveness_endpoint=liveness,
            stop_flag=stop_flag,
            ready_flag=ready_flag,
        )
    finally:
        await asyncio.get_running_loop().run_in_executor(None, view_feeds.stop)
        if janitor is not None:
            janitor.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await janitor
        if domains_task is not None:
            domains_stop.set()
            with contextlib.suppress(Exception):
                await domains_task
        if events is not None:
            await asyncio.get_running_loop().run_in_executor(None, events.close)


async def _elected(
    options: ControllerSettings,
    lease: LeaseSettings,
    rest: KubeRest,
    metrics: ControllerMetrics,
    stop_flag: threading.Event | asyncio.Event | None,
    ready_flag: threading.Event | asyncio.Event | None,
) -> int:
    """Serve on every replica; reconcile while holding the Lease. 1 when the Lease was lost."""
    stop = asyncio.Event()
    mirror = asyncio.create_task(_mirror(stop_flag, stop), name="stop-flag")
    liveness = None if options.healthz_port < 0 else f"http://{options.healthz_host}:{options.healthz_port}/healthz"
    serving_stop = asyncio.Event()
    serving = asyncio.create_task(
        kopf.operator(
            registry=build_registry(options, rest, None, metrics, reconciling=False),
            clusterwide=True,
            standalone=True,
            liveness_endpoint=liveness,
            stop_flag=serving_stop,
            ready_flag=ready_flag,
        ),
        name="serving-operator",
    )
    elector = LeaderElector(rest, lease)
    code = 0
    try:
        # Whatever ends first ends the replica: the stop flag, a signal (kopf's handler stops one operator),
        # the serving operator failing, or (while leading) the reconciling operator ending.
        if await _first(elector.acquire(stop), serving, stop):
            metrics.leader.set(1)
            reconcile_stop = asyncio.Event()
            reconciling = asyncio.create_task(
                _reconciler(options, rest, metrics, stop_flag=reconcile_stop, serving=False),
                name="reconciling-operator",
            )
            kept = await _first(elector.keep(stop), serving, stop, reconciling)
            reconcile_stop.set()
            with contextlib.suppress(Exception):
                await reconciling
            metrics.leader.set(0)
            metrics.forget_policies()
            if not kept:
                log.error("no longer the leader: stopped reconciling; exiting so the pod restarts clean")
                code = 1
            elif lease.release_on_stop:
                await asyncio.get_running_loop().run_in_executor(None, elector.release)
    finally:
        serving_stop.set()
        with contextlib.suppress(Exception):
            await serving
        mirror.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await mirror
    return code


async def _first(
    main: Awaitable[bool],
    *others: asyncio.Task[Any] | asyncio.Event,
) -> bool:
    """`main`'s result; if one of `others` (a task, or `stop` when set) ends first, set the last Event among
    them (the stop event) and still wait for `main`, which returns promptly once stop is set."""
    stop = next(o for o in others if isinstance(o, asyncio.Event))
    main_task = asyncio.ensure_future(main)
    watchers = [o if isinstance(o, asyncio.Task) else asyncio.create_task(o.wait()) for o in others]
    try:
        await asyncio.wait([main_task, *watchers], return_when=asyncio.FIRST_COMPLETED)
        if not main_task.done():
            stop.set()
        return await main_task
    finally:
        for w, o in zip(watchers, others, strict=True):
            if not isinstance(o, asyncio.Task):
                w.cancel()


async def _mirror(source: threading.Event | asyncio.Event | None, target: asyncio.Event) -> None:
    """Set `target` once `source` is set (a thread's Event is polled)."""
    if source is None:
        return
    if isinstance(source, asyncio.Event):
        await source.wait()
    else:
        while not source.is_set():
            await asyncio.sleep(0.1)
    target.set()


def run(
    options: ControllerSettings,
    *,
    stop_flag: threading.Event | None = None,
    ready_flag: threading.Event | None = None,
    metrics: ControllerMetrics | None = None,
) -> int:
    """Blocking: load credentials, then run the operator on a new event loop. Returns the exit status."""
    rest = connect(options.kubeconfig, component="controller")
    try:
        return asyncio.run(operate(options, rest, stop_flag=stop_flag, ready_flag=ready_flag, metrics=metrics))
    finally:
        rest.close()
