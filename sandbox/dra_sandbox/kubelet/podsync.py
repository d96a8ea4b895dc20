"""The kubelet's pod side, against the API server through the official `kubernetes` client.

At start it deletes this node's ResourceSlices (as the kubelet does). Then it watches the pods bound to
this node and, on every event and every resync tick, reconciles:

* an active pod whose claims are all allocated and reserved for it gets NodePrepareResources (per
  driver, for the claims that driver appears in), then its containers start through the container
  runtime with the CDI ids of the claims they reference, then its status and the
  ``sandbox.dra.dev/containers`` annotation (what each container saw) are written;
* a failed prepare sets PodReadyToStartContainers=False with the error, emits a Warning event and is
  retried with exponential backoff;
* prepared claims no active pod on the node uses any more get NodeUnprepareResources (retried with
  backoff); a pod being deleted is then confirmed with a grace-period-0 delete, as the kubelet does;
* when every plugin of a driver has been gone for `wiping_delay_s`, that driver's slices on this node
  are deleted.

Every started pod gets a pod IP from the node's range (`podips`; a hostNetwork pod the node's InternalIP). Pods
whose containers run `dra-driver` run as host processes (`processpods`, `dra_sandbox.runtime.hostprocess`): they
keep running, their probes drive Ready, a deletion stops them (SIGTERM, then SIGKILL after the grace period) before
their claims are unprepared and the deletion is confirmed.

The decisions are the pure functions of `lifecycle`; this module only fetches and writes.
"""

from __future__ import annotations

import json
import logging
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, TypeVar

from kubernetes import client as k8s
from kubernetes import watch as k8s_watch
from kubernetes.client.exceptions import ApiException

from dra_driver.cdi import CdiError
from dra_sandbox.kubelet import lifecycle as lc
from dra_sandbox.kubelet.admission import Admission, admit, rejected_status
from dra_sandbox.kubelet.clock import Backoff, Clock
from dra_sandbox.kubelet.devicemanager import DeviceAllocationError, DeviceManager, container_requests
from dra_sandbox.kubelet.draclient import ClaimRef, PreparedDevice
from dra_sandbox.kubelet.health import HealthStore
from dra_sandbox.kubelet.kubeviews import claim_view, pod_view
from dra_sandbox.kubelet.nodestatus import NodeFacts, NodeResources, node_labels, node_object
from dra_sandbox.kubelet.podips import PodIpAllocator, PodIpRangeFull
from dra_sandbox.kubelet.processpods import (
    PodAddresses,
    ProcessPodError,
    ProcessPodSettings,
    container_status,
    grace_period_s,
    process_pod_phase,
    process_pod_request,
    runs_as_process,
)
from dra_sandbox.kubelet.registration import PluginStore
from dra_sandbox.rest import MERGE_PATCH
from dra_sandbox.runtime.cdi import ContainerConfig, apply_edits, load_registry
from dra_sandbox.runtime.hostprocess import HostProcessRuntime, ProcessPod
from dra_sandbox.runtime.types import ContainerRequest, ContainerResult, ContainerRuntime

log = logging.getLogger(__name__)
CONTAINERS_ANNOTATION = "sandbox.dra.dev/containers"
PREPARE_FAILED = "FailedPrepareDynamicResources"
WAITING = "WaitingForResourceClaims"
_TIME_KEYS = frozenset({"lastTransitionTime", "startedAt", "finishedAt", "startTime", "lastProbeTime"})
T = TypeVar("T")


@dataclass(frozen=True)
class PodSyncConfig:
    resync_interval_s: float = 1.0
    backoff: Backoff = field(default_factory=lambda: Backoff(initial=1.0, factor=2.0, maximum=30.0))
    wiping_delay_s: float = 30.0
    watch_timeout_s: int = 60
    request_timeout_s: float = 30.0
    # ResourceHealthStatusMessage (1.36+): `message` in allocatedResourcesStatus (KubeletSimulator sets it from
    # KubeletConfig.gates).
    health_message: bool = True
    # How long the kubelet's stop waits for its process pods (SIGTERM, then SIGKILL after this grace).
    stop_grace_s: float = 5.0


@dataclass
class _Retry:
    attempts: int
    next_at: float
    error: str


@dataclass
class _Started:
    claims: Mapping[str, lc.ClaimView]
    outcomes: tuple[lc.ContainerOutcome, ...]
    started_at: str
    finished_at: str


def rfc3339(seconds: float) -> str:
    return datetime.fromtimestamp(seconds, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _fingerprint(value: Any) -> str:
    """JSON of a status without its timestamps: used to skip writes that would change nothing."""

    def strip(v: Any) -> Any:
        if isinstance(v, dict):
            return {k: strip(x) for k, x in v.items() if k not in _TIME_KEYS}
        if isinstance(v, list):
            return [strip(x) for x in v]
        return v

    return json.dumps(strip(value), sort_keys=True)


def _api_error(exc: Exception) -> str:
    if isinstance(exc, ApiException):
        return f"{exc.status} {exc.reason}"
    return str(exc)


class PodSync:
    def __init__(
        self,
        node_name: str,
        api_client: k8s.ApiClient,
        plugins: PluginStore,
        runtime: ContainerRuntime,
        clock: Clock,
        config: PodSyncConfig | None = None,
        health: HealthStore | None = None,
        *,
        pod_ips: PodIpAllocator | None = None,
        processes: HostProcessRuntime | None = None,
        process_settings: ProcessPodSettings | None = None,
    ) -> None:
        self.node_name = node_name
        self.pod_ips = pod_ips
        self.processes = processes
        self._process_settings = process_settings
        self._process_pods: dict[str, ProcessPod] = {}  # pod uid -> its host processes (under _sync_lock)
        self._raw: Mapping[str, Mapping[str, Any]] = {}
        self._api = api_client
        self._core = k8s.CoreV1Api(api_client)
        self._resource = k8s.ResourceV1Api(api_client)
        self._plugins = plugins
        self._runtime = runtime
        self._clock = clock
        self._config = config or PodSyncConfig()
        self._health = health
        self._stop = threading.Event()
        self._wake = threading.Event()
        self._sync_lock = threading.Lock()
        self._threads: list[threading.Thread] = []
        self._watch: k8s_watch.Watch | None = None
        # State below is only touched under _sync_lock.
        self._prepared: dict[str, dict[str, tuple[PreparedDevice, ...]]] = {}  # claim uid -> driver -> devices
        self._claim_refs: dict[str, ClaimRef] = {}
        self._pod_claims: dict[str, frozenset[str]] = {}  # pod uid -> claim uids
        self._started: dict[str, _Started] = {}
        self._admitted: set[str] = set()  # pod uids that passed admission (they hold the node's resources)
        self._retry: dict[str, _Retry] = {}
        self._written_status: dict[str, str] = {}
        self._reported: dict[str, str] = {}
        self._drivers_seen: set[str] = set()
        self._driver_gone_since: dict[str, float] = {}
        self.syncs = 0
        # The device manager (device-plugin resources, devicemanager.py); None: no device plugin on this node.
        self.devices: DeviceManager | None = None
        self._device_cdi: dict[str, dict[str, list[str]]] = {}  # pod uid -> container -> CDI names from Allocate

    # ---- lifecycle ----------------------------------------------------------------------------------

    def start(self) -> None:
        self.delete_node_slices()
        self._plugins.subscribe(self.kick)
        for target, name in ((self._loop, "pod-sync"), (self._watch_loop, "pod-watch")):
            thread = threading.Thread(target=target, name=f"{name}-{self.node_name}", daemon=True)
            self._threads.append(thread)
            thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._wake.set()
        watch = self._watch
        if watch is not None:
            watch.stop()  # type: ignore[no-untyped-call]  # kubernetes.watch is untyped
        for thread in self._threads:
            thread.join(timeout=5)
        if self.processes is not None:  # the node goes away with its pods: no process outlives the sandbox
            self.processes.stop_all(self._config.stop_grace_s, self._config.stop_grace_s + 5.0)

    def kick(self) -> None:
        """Reconcile soon (a pod event, a plugin (de)registration)."""
        self._wake.set()

    def prepared_claims(self) -> dict[str, dict[str, tuple[PreparedDevice, ...]]]:
        with self._sync_lock:
            return {uid: dict(drivers) for uid, drivers in self._prepared.items()}

    # ---- API helpers --------------------------------------------------------------------------------

    def _call(self, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        return fn(*args, _request_timeout=self._config.request_timeout_s, **kwargs)

    def _delete(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> None:
        # A DELETE may answer with a Status instead of the object (the apiserver does for immediate
        # deletions); the typed client cannot decode that as the resource, so the body is not decoded.
        response = self._call(fn, *args, _preload_content=False, **kwargs)
        response.read()
        response.release_conn()

    def delete_node_slices(self, driver: str | None = None) -> int:
        """Delete this node's ResourceSlices (of one driver, or all): the kubelet does so at start."""
        selector = f"spec.nodeName={self.node_name}" + (f",spec.driver={driver}" if driver else "")
        deleted = 0
        try:
            slices = self._call(self._resource.list_resource_slice, field_selector=selector).items
        except ApiException as exc:
            log.warning("cannot list ResourceSlices of node %s: %s", self.node_name, _api_error(exc))
            return 0
        for item in slices:
            name = item.metadata.name if item.metadata else None
            # Filter again on our side: never delete another node's slices.
            if not name or item.spec.node_name != self.node_name or (driver and item.spec.driver != driver):
                continue
            try:
                self._delete(self._resource.delete_resource_slice, name)
                deleted += 1
            except ApiException as exc:
                if exc.status != 404:
                    log.warning("cannot delete ResourceSlice %s: %s", name, _api_error(exc))
        return deleted

    def _list_pods(self) -> tuple[list[lc.PodView], dict[str, dict[str, Any]]]:
        """The views of this node's pods, and each pod as JSON by uid (for admission)."""
        pods = self._call(
            self._core.list_pod_for_all_namespaces, field_selector=f"spec.nodeName={self.node_name}"
        ).items
        serialize: Callable[[Any], Any] = self._api.sanitize_for_serialization
        views = [pod_view(p, serialize) for p in pods]
        raw = {v.uid: dict(serialize(p)) for v, p in zip(views, pods, strict=True) if v.node_name == self.node_name}
        return [v for v in views if v.node_name == self.node_name], raw

    def _node(self) -> dict[str, Any]:
        """The Node as the kubelet sees it; before it is registered, the kubelet's own initial view of it
        (`getNodeAnyWay`: this machine's allocatable and the kubelet's labels)."""
        try:
            node = self._call(self._core.read_node, self.node_name)
            serialize: Callable[[Any], Any] = self._api.sanitize_for_serialization
            return dict(serialize(node))
        except ApiException as exc:
            if exc.status != 404:
                raise
        facts = NodeFacts.from_host(self.node_name, self._runtime.name)
        resources = NodeResources.from_host()
        status = {"capacity": resources.capacity(), "allocatable": resources.allocatable()}
        return node_object(self.node_name, node_labels(self.node_name, facts, {}), status)

    def _read_claims(self, pod: lc.PodView) -> dict[tuple[str, str], lc.ClaimView]:
        out: dict[tuple[str, str], lc.ClaimView] = {}
        for name in lc.claim_names_for_pod(pod).names.values():
            try:
                claim = self._call(self._resource.read_namespaced_resource_claim, name, pod.namespace)
            except ApiException as exc:
                if exc.status == 404:
                    continue
                raise
            out[(pod.namespace, name)] = claim_view(claim)
        return out

    def _write_status(self, pod: lc.PodView, status: dict[str, Any]) -> None:
        fingerprint = _fingerprint(status)
        if self._written_status.get(pod.uid) == fingerprint:
            return
        try:
            self._call(self._core.patch_namespaced_pod_status, pod.name, pod.namespace, {"status": status},
                       _content_type=MERGE_PATCH)
            self._written_status[pod.uid] = fingerprint
        except ApiException as exc:
            log.warning("cannot update status of pod %s: %s", pod.key, _api_error(exc))

    def _event(self, pod: lc.PodView, reason: str, message: str, kind: str = "Warning") -> None:
        now = rfc3339(self._clock.wall())
        body = {
            "metadata": {"generateName": f"{pod.name}.", "namespace": pod.namespace},
            "involvedObject": {"apiVersion": "v1", "kind": "Pod", "namespace": pod.namespace, "name": pod.name,
                               "uid": pod.uid},
            "reason": reason,
            "message": message[:1024],
            "type": kind,
            "source": {"component": "kubelet", "host": self.node_name},
            "reportingComponent": "kubelet",
            "reportingInstance": self.node_name,
            "firstTimestamp": now,
            "lastTimestamp": now,
            "count": 1,
        }
        try:
            self._call(self._core.create_namespaced_event, pod.namespace, body)
        except ApiException as exc:  # events are best effort, as in the kubelet
            log.info("cannot record event for pod %s: %s", pod.key, _api_error(exc))

    # ---- threads ------------------------------------------------------------------------------------

    def _next_retry_in(self) -> float:
        now = self._clock.monotonic()
        delays = [r.next_at - now for r in self._retry.values()]
        return max(0.0, min([self._config.resync_interval_s, *delays]))

    def _loop(self) -> None:
        while not self._stop.is_set():
            self._wake.clear()  # before the pass: a kick that arrives during it triggers the next one
            try:
                self.sync_once()
            except Exception as exc:  # a failed pass must not end the kubelet; the next tick retries
                log.warning("pod sync on node %s failed: %s", self.node_name, _api_error(exc))
            if self._clock.wait(self._wake, self._next_retry_in()) and self._stop.is_set():
                return

    def _watch_loop(self) -> None:
        while not self._stop.is_set():
            watch = k8s_watch.Watch()  # type: ignore[no-untyped-call]  # kubernetes.watch is untyped
            self._watch = watch
            try:
                for _event in watch.stream(  # type: ignore[no-untyped-call]
                    self._core.list_pod_for_all_namespaces,
                    field_selector=f"spec.nodeName={self.node_name}",
                    timeout_seconds=self._config.watch_timeout_s,
                    _request_timeout=self._config.watch_timeout_s + 5,
                ):
                    self.kick()
                    if self._stop.is_set():
                        break
            except Exception as exc:  # connection reset, 410 Gone, server restart: start a new watch
                if self._stop.is_set():
                    return
                log.info("pod watch on node %s ended: %s; restarting", self.node_name, _api_error(exc))
                self._clock.wait(self._stop, 1.0)
            finally:
                self._watch = None

    # ---- one reconcile pass -------------------------------------------------------------------------

    def sync_once(self) -> None:
        with self._sync_lock:
            self.syncs += 1
            pods, raw = self._list_pods()
            self._raw = raw
            rejected = self._admit_new(pods, raw)
            if self.devices is not None:
                self.devices.retain({p.uid for p in pods if p.active})
            for pod in pods:
                if not pod.active or pod.uid in rejected:
                    continue
                try:  # one pod's API error must not hold up the others
                    if pod.uid in self._started:
                        self._refresh_started(pod)
                    else:
                        self._try_start(pod)
                except ApiException as exc:
                    log.warning("pod %s: API error, retrying on the next pass: %s", pod.key, _api_error(exc))
            self._stop_processes(pods)
            self._unprepare_unused(pods)
            self._release_pods(pods)
            self._wipe_gone_drivers()

    def _admit_new(self, pods: list[lc.PodView], raw: Mapping[str, Mapping[str, Any]]) -> set[str]:
        """Admit the active pods not yet admitted, oldest first (HandlePodAdditions), each against the pods
        admitted before it; reject the others as the kubelet does. Returns the uids rejected now."""
        active = {p.uid for p in pods if p.active}
        self._admitted &= active  # a finished or deleted pod gives its resources back
        new = [p for p in pods if p.active and p.uid not in self._admitted and p.uid not in self._started]
        if not new:
            return set()
        node = self._node()

        def created(pod: lc.PodView) -> tuple[str, str]:
            return (str((raw[pod.uid].get("metadata") or {}).get("creationTimestamp") or ""), pod.key)

        rejected: set[str] = set()
        for pod in sorted(new, key=created):
            verdict = admit(raw[pod.uid], node, [raw[uid] for uid in self._admitted if uid in raw])
            if verdict.admit:
                self._admitted.add(pod.uid)
                continue
            self._reject(pod, verdict)
            rejected.add(pod.uid)
        return rejected

    def _reject(self, pod: lc.PodView, verdict: Admission) -> None:
        """rejectPod: a Warning event with the reason, then phase Failed."""
        log.warning("pod %s rejected: %s: %s", pod.key, verdict.reason, verdict.message)
        self._event(pod, verdict.reason, verdict.message)
        try:
            self._call(self._core.patch_namespaced_pod_status, pod.name, pod.namespace,
                       {"status": rejected_status(verdict)}, _content_type=MERGE_PATCH)
        except ApiException as exc:
            log.warning("cannot update status of pod %s: %s", pod.key, _api_error(exc))

    def _try_start(self, pod: lc.PodView) -> None:
        retry = self._retry.get(f"pod/{pod.uid}")
        if retry is not None and self._clock.monotonic() < retry.next_at:
            return
        now = rfc3339(self._clock.wall())
        if self.devices is not None and pod.uid not in self._device_cdi:
            try:  # the device manager's admission: Allocate before anything of the pod starts
                self._device_cdi[pod.uid] = self.devices.allocate(pod.uid, pod.namespace, pod.name,
                                                                  container_requests(self._raw.get(pod.uid) or {}))
            except DeviceAllocationError as exc:
                self._reject(pod, Admission(False, "UnexpectedAdmissionError", str(exc)))
                return
        plan = lc.plan_prepare(
            pod,
            self._read_claims(pod),
            self._plugins.drivers(),
            [(uid, d) for uid, drivers in self._prepared.items() for d in drivers],
        )
        if not plan.ready:
            self._write_status(pod, lc.pending_status(pod, WAITING, plan.waiting or "", now))
            return
        # Remember the pod's claims before calling out, so a deletion mid-way still unprepares them.
        self._pod_claims[pod.uid] = frozenset(c.ref.uid for c in plan.claims.values())
        errors: list[str] = []
        for driver, refs in plan.calls.items():
            plugin = self._plugins.get(driver)
            if plugin is None:
                errors.append(f"DRA driver {driver} is not registered on this node")
                continue
            for uid, result in plugin.client.prepare(refs).items():
                ref = next(r for r in refs if r.uid == uid)
                if result.ok:
                    self._prepared.setdefault(uid, {})[driver] = result.devices
                    self._claim_refs[uid] = ref
                else:
                    errors.append(f"{driver}: claim {ref.namespace}/{ref.name}: {result.error}")
        if errors:
            self._prepare_failed(pod, "; ".join(errors), now)
            return
        self._retry.pop(f"pod/{pod.uid}", None)
        self._reported.pop(pod.uid, None)
        self._run_containers(pod, plan.claims, now)

    def _prepare_failed(self, pod: lc.PodView, message: str, now: str) -> None:
        key = f"pod/{pod.uid}"
        attempts = self._retry[key].attempts + 1 if key in self._retry else 1
        delay = self._config.backoff.delay(attempts)
        self._retry[key] = _Retry(attempts, self._clock.monotonic() + delay, message)
        full = f"NodePrepareResources failed (attempt {attempts}, retry in {delay:.1f} s): {message}"
        log.warning("pod %s: %s", pod.key, full)
        self._write_status(pod, lc.pending_status(pod, PREPARE_FAILED, full, now))
        if self._reported.get(pod.uid) != message:
            self._reported[pod.uid] = message
            self._event(pod, PREPARE_FAILED, f"Failed to prepare dynamic resources: {message}")

    def _pod_ip(self, pod: lc.PodView) -> str | None:
        raw = self._raw.get(pod.uid) or {}
        if (raw.get("spec") or {}).get("hostNetwork"):
            return self._host_ip()
        if self.pod_ips is None:
            return None
        try:
            return self.pod_ips.assign(pod.uid)
        except PodIpRangeFull as exc:
            log.warning("pod %s: %s", pod.key, exc)
            return None

    def _host_ip(self) -> str:
        try:
            addresses = (self._node().get("status") or {}).get("addresses") or []
        except ApiException:
            addresses = []
        return next((str(a.get("address")) for a in addresses if a.get("type") == "InternalIP"), "")

    def _process_failed(self, pod: lc.PodView, claims: Mapping[str, lc.ClaimView], now: str, message: str) -> None:
        """The pod cannot run as processes: every container fails to start (128), with the reason."""
        log.warning("pod %s: %s", pod.key, message)
        self._event(pod, "Failed", message)
        outcomes = tuple(lc.ContainerOutcome(c.name, False, 128, message) for c in pod.containers)
        self._started[pod.uid] = _Started(claims, outcomes, now, now)
        self._refresh_started(pod)

    def _start_processes(self, pod: lc.PodView, claims: Mapping[str, lc.ClaimView], now: str,
                         pod_ip: str | None) -> None:
        assert self.processes is not None and self._process_settings is not None
        registry = load_registry(self._process_settings.cdi_dirs)
        cdi: dict[str, ContainerConfig] = {}
        ids_of: dict[str, tuple[str, ...]] = {}
        try:
            for container in (*pod.init_containers, *pod.containers):
                ids = lc.cdi_ids_for_container(container, claims, self._prepared)
                ids_of[container.name] = ids
                cdi[container.name] = apply_edits(ContainerConfig(), registry.resolve(ids)) if ids \
                    else ContainerConfig()
            addresses = PodAddresses(pod_ip or "", self._host_ip())
            request = process_pod_request(self._raw.get(pod.uid) or {}, cdi, addresses, self._process_settings)
        except (ProcessPodError, CdiError) as exc:
            self._process_failed(pod, claims, now, str(getattr(exc, "message", exc)))
            return
        handle = self.processes.start(request, self.kick)
        self._process_pods[pod.uid] = handle
        self._started[pod.uid] = _Started(claims, (), now, now)
        record = {c.name: {"runtime": self.processes.name, "executed": True, "exitCode": 0,
                           "cdiDevices": list(ids_of.get(c.name, ())), "argv": list(c.argv), "env": dict(c.env),
                           "mounts": [{"target": m.container_path, "source": m.host_path, "type": m.type or "bind",
                                       "options": list(m.options)} for m in cdi[c.name].mounts],
                           "deviceNodes": [{"path": d.path, "type": d.type or "?", "major": d.major, "minor": d.minor}
                                           for d in cdi[c.name].device_nodes],
                           "note": "runs as a host process of the sandbox kubelet (docs/sandbox.md)"}
                  for c in (*request.init_containers, *request.containers)}
        self._annotate(pod, record)
        log.info("pod %s started as host processes: %s", pod.key, {c.name: c.argv for c in request.containers})
        self._refresh_started(pod)

    def _annotate(self, pod: lc.PodView, record: Mapping[str, Any]) -> None:
        try:
            # Through pods/status: a kubelet's RBAC (system:node) allows no write to pods, and kube-apiserver keeps
            # the annotations a status write carries (podStatusStrategy resets only spec and owners).
            self._call(self._core.patch_namespaced_pod_status, pod.name, pod.namespace,
                       {"metadata": {"annotations": {CONTAINERS_ANNOTATION: json.dumps(record, sort_keys=True)}}},
                       _content_type=MERGE_PATCH)
        except ApiException as exc:
            log.warning("cannot annotate pod %s: %s", pod.key, _api_error(exc))

    def _run_containers(self, pod: lc.PodView, claims: Mapping[str, lc.ClaimView], now: str) -> None:
        pod_ip = self._pod_ip(pod)
        if self.processes is not None and self._process_settings is not None:
            try:
                as_process = runs_as_process(self._raw.get(pod.uid) or {})
            except ProcessPodError as exc:
                self._process_failed(pod, claims, now, str(exc))
                return
            if as_process:
                self._start_processes(pod, claims, now, pod_ip)
                return
        results: dict[str, ContainerResult] = {}
        # Init containers run first, one at a time and in order; the first failure stops the pod there.
        for container in (*pod.init_containers, *pod.containers):
            if any(not results[c.name].ok for c in pod.init_containers if c.name in results):
                break
            ids = lc.cdi_ids_for_container(container, claims, self._prepared)
            ids = (*ids, *self._device_cdi.get(pod.uid, {}).get(container.name, ()))
            results[container.name] = self._runtime.run(
                ContainerRequest(
                    name=f"{pod.key}/{container.name}",
                    cdi_devices=ids,
                    env=container.env,
                    inspect_paths=container.reads,
                )
            )
        outcomes = tuple(lc.ContainerOutcome(n, r.ok, r.exit_code, r.error) for n, r in results.items())
        finished = rfc3339(self._clock.wall())
        self._started[pod.uid] = _Started(claims, outcomes, now, finished)
        self._annotate(pod, {name: r.to_json() for name, r in results.items()})
        log.info("pod %s started with %s: %s", pod.key, self._runtime.name,
                 {n: (r.ok, r.cdi_devices) for n, r in results.items()})
        self._refresh_started(pod)

    def _refresh_started(self, pod: lc.PodView) -> None:
        handle = self._process_pods.get(pod.uid)
        status = self._process_status(pod, handle) if handle is not None else self._run_status(pod)
        ip = self.pod_ips.get(pod.uid) if self.pod_ips is not None else None
        if (self._raw.get(pod.uid) or {}).get("spec", {}).get("hostNetwork"):
            ip = self._host_ip() or None
        if ip:
            status["podIP"] = ip
            status["podIPs"] = [{"ip": ip}]
        self._write_status(pod, status)

    def _process_status(self, pod: lc.PodView, handle: ProcessPod) -> dict[str, Any]:
        """generateAPIPodStatus for a process pod: phase, conditions and container statuses from its processes."""
        snap = handle.snapshot()
        started = self._started[pod.uid]
        images = {c.name: c.image for c in (*pod.init_containers, *pod.containers)}
        phase = process_pod_phase(snap, pod.restart_policy)
        statuses = [container_status(pod.uid, images.get(c.name, ""), c) for c in snap.containers]
        unready = [c.name for c in snap.containers if not c.ready]
        ready = phase == "Running" and not unready
        now = rfc3339(self._clock.wall())

        def cond(kind: str, ok: bool, reason: str = "", message: str = "") -> dict[str, Any]:
            out: dict[str, Any] = {"type": kind, "status": "True" if ok else "False", "lastTransitionTime": now}
            if not ok and reason:
                out.update(reason=reason, message=message)
            return out

        not_ready = f"containers with unready status: [{' '.join(unready)}]"
        status: dict[str, Any] = {
            "phase": phase,
            "startTime": started.started_at,
            "conditions": lc.merge_conditions(pod.conditions, [
                cond("PodReadyToStartContainers", True),
                cond("Initialized", snap.initialized, "ContainersNotInitialized",
                     "containers with incomplete status: [" + " ".join(
                         c.name for c in snap.init_containers if c.state != "terminated") + "]"),
                cond("ContainersReady", ready, "ContainersNotReady", not_ready),
                cond("Ready", ready, "ContainersNotReady", not_ready),
            ]),
            "containerStatuses": statuses,
        }
        if snap.init_containers:
            status["initContainerStatuses"] = [container_status(pod.uid, images.get(c.name, ""), c)
                                               for c in snap.init_containers]
        return status

    def _stop_processes(self, pods: list[lc.PodView]) -> None:
        """killPod for process pods being deleted (or gone from the API): SIGTERM now, SIGKILL after the grace."""
        present = {p.uid: p for p in pods}
        for uid, handle in list(self._process_pods.items()):
            pod = present.get(uid)
            if pod is None:
                handle.stop()
            elif pod.deleting:
                handle.stop(grace_period_s(self._raw.get(uid) or {}))
            if handle.snapshot().stopped and pod is None:
                self._forget(uid)

    def _processes_alive(self) -> set[str]:
        return {uid for uid, handle in self._process_pods.items() if not handle.snapshot().stopped}

    def _run_status(self, pod: lc.PodView) -> dict[str, Any]:
        started = self._started[pod.uid]
        health: dict[str, tuple[lc.ResourceHealth, ...]] = {}
        if self._health is not None:
            store = self._health
            for container in pod.containers:
                health[container.name] = lc.health_entries(container, started.claims, self._prepared,
                                                           store.health_and_message, self._config.health_message)
        return lc.started_status(pod, started.outcomes, started.started_at, started.finished_at, health)

    def _unprepare_unused(self, pods: list[lc.PodView]) -> None:
        # A pod whose processes still run holds its claims until they are gone (the kubelet unprepares after the
        # containers stopped).
        active = [p.uid for p in pods if p.active] + sorted(self._processes_alive())
        for uid in lc.claims_to_unprepare(self._prepared, self._pod_claims, active):
            key = f"unprepare/{uid}"
            retry = self._retry.get(key)
            if retry is not None and self._clock.monotonic() < retry.next_at:
                continue
            ref = self._claim_refs[uid]
            errors: list[str] = []
            for driver in list(self._prepared[uid]):
                plugin = self._plugins.get(driver)
                if plugin is None:
                    errors.append(f"DRA driver {driver} is not registered on this node")
                    continue
                error = plugin.client.unprepare([ref]).get(uid)
                if error is None:
                    del self._prepared[uid][driver]
                else:
                    errors.append(f"{driver}: {error}")
            if not self._prepared[uid]:
                del self._prepared[uid]
                self._claim_refs.pop(uid, None)
                self._retry.pop(key, None)
                log.info("unprepared claim %s/%s (%s)", ref.namespace, ref.name, uid)
                continue
            attempts = retry.attempts + 1 if retry else 1
            delay = self._config.backoff.delay(attempts)
            self._retry[key] = _Retry(attempts, self._clock.monotonic() + delay, "; ".join(errors))
            log.warning("NodeUnprepareResources for claim %s/%s failed (attempt %d, retry in %.1f s): %s",
                        ref.namespace, ref.name, attempts, delay, "; ".join(errors))

    def _release_pods(self, pods: list[lc.PodView]) -> None:
        alive = self._processes_alive()
        active = [p.uid for p in pods if p.active] + sorted(alive)
        present = {p.uid for p in pods}
        for pod in pods:
            if not pod.deleting or pod.uid in alive:
                continue
            if not lc.pod_may_go(pod.uid, self._pod_claims, self._prepared, active):
                continue
            # The sandbox is gone: its address is free before the deletion is confirmed, as the kubelet tears the
            # pod's network down (CNI DEL) before its status manager removes the pod object.
            if self.pod_ips is not None:
                self.pod_ips.release(pod.uid)
            # The kubelet's confirmation: everything is cleaned up, the API server may remove the pod now.
            try:
                self._delete(self._core.delete_namespaced_pod, pod.name, pod.namespace, grace_period_seconds=0)
            except ApiException as exc:
                if exc.status not in (404, 409):
                    log.warning("cannot confirm deletion of pod %s: %s", pod.key, _api_error(exc))
                    continue
            self._forget(pod.uid)
        for uid in [u for u in self._pod_claims if u not in present]:
            if lc.pod_may_go(uid, self._pod_claims, self._prepared, active):
                self._forget(uid)
        for uid in [u for u in self._started if u not in present and u not in self._process_pods]:
            self._started.pop(uid, None)
            if self.pod_ips is not None:
                self.pod_ips.release(uid)

    def _forget(self, pod_uid: str) -> None:
        for table in (self._pod_claims, self._started, self._written_status, self._reported, self._device_cdi):
            table.pop(pod_uid, None)
        if self._process_pods.pop(pod_uid, None) is not None and self.processes is not None:
            self.processes.forget(pod_uid)
        if self.pod_ips is not None:
            self.pod_ips.release(pod_uid)  # the pod's sandbox is gone: its address may be handed out again
        self._retry.pop(f"pod/{pod_uid}", None)

    def _wipe_gone_drivers(self) -> None:
        now = self._clock.monotonic()
        current = self._plugins.drivers()
        for driver in current:
            self._driver_gone_since.pop(driver, None)
        for driver in self._drivers_seen - current:
            self._driver_gone_since.setdefault(driver, now)
        self._drivers_seen |= current
        for driver, since in list(self._driver_gone_since.items()):
            if now - since >= self._config.wiping_delay_s:
                deleted = self.delete_node_slices(driver)
                log.info("driver %s gone for %.0f s: deleted %d ResourceSlices", driver, now - since, deleted)
                del self._driver_gone_since[driver]
                self._drivers_seen.discard(driver)
