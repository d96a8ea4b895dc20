"""The ComputeDomain reconcile loop: level-triggered passes over every domain, on the leader only.

One pass (every `status_interval_seconds`, 2 s by default as NVIDIA's; sooner when kopf's watch sees a domain or a
channel claim change) reads, in this order: the domains (all namespaces), the cliques and the daemon pods (driver
namespace, label-selected) — cliques before pods, so an entry a new daemon wrote always finds its pod. Then, per
domain:

- live: the finalizer `gpu.dra.dev/computeDomain`; the workload ResourceClaimTemplate, the daemon template and the
  DaemonSet (objects.py; created when missing, the DaemonSet replaced when its pod template changed; a template of
  that name that is not the domain's is left alone and the domain says so); the cliques pruned of entries whose
  node has no daemon pod; status.nodes / status.status / the Ready condition (status.py), written when they differ;
  Events on created objects, Ready/NotReady transitions and refusals;
- being deleted: the templates (finalizer first), the DaemonSet, the cliques, the node labels, then the finalizer;
- channel claims waiting for binding conditions (binding.py): node label, then imex-ready / imex-failed.

Every step that fails is counted (`dra_driver_controller_compute_domain_reconcile_errors{step}`), logged, and tried
again on the next pass; nothing is lost in between because nothing is remembered that the API does not hold
(except which node labels this controller set for binding, docs/compute-domains.md "Limits").
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import logging
import threading
from collections.abc import Callable, Iterable, Mapping
from dataclasses import KW_ONLY, dataclass, field
from typing import Any
from urllib.parse import quote

from dra_driver.computedomain import names
from dra_driver.computedomain.model import ComputeDomain, ComputeDomainClique, parse_clique, parse_compute_domain
from dra_driver.controller.computedomains import binding, objects, reasons, status
from dra_driver.controller.metrics import ControllerMetrics
from dra_driver.controller.reconcile import now_rfc3339
from dra_driver.k8s.client import ApiError, JsonObject, KubeRest
from dra_driver.k8s.events import NORMAL, WARNING, EventRecorder, InvolvedObject
from dra_driver.k8s.liststream import list_all
from dra_driver.resourceapi.fields import InvalidObjectError

log = logging.getLogger(__name__)

MERGE = "application/merge-patch+json"


@dataclass(frozen=True)
class ComputeDomainSettings:
    daemon: objects.DaemonSetSettings
    status_interval_seconds: float = 2.0
    binding_timeout_seconds: float = binding.DEFAULT_BINDING_TIMEOUT_S


def _q(text: str) -> str:
    return quote(text, safe="")


@dataclass
class _Memory:
    """What passes remember between them: only what the API cannot tell again cheaply."""

    shown: dict[str, str] = field(default_factory=dict)  # domain uid -> status.status last seen (for Events)
    refused: dict[str, str] = field(default_factory=dict)  # domain uid -> refusal last reported
    labelled: dict[str, tuple[str, str]] = field(default_factory=dict)  # claim uid -> (node, domain) we labelled


def _utc_now() -> dt.datetime:
    return dt.datetime.now(dt.UTC)


def _asleep() -> None:
    """No loop runs: nothing to wake."""


@dataclass(eq=False)
class ComputeDomainController:
    """Thread-safe feeds (`notify`, `on_claim`) from kopf's watches; `sync` does one pass (blocking, in an
    executor); `run` repeats it until stopped."""

    rest: KubeRest
    settings: ComputeDomainSettings
    metrics: ControllerMetrics
    _: KW_ONLY
    events: EventRecorder | None = None
    clock: Callable[[], dt.datetime] = _utc_now
    _lock: threading.Lock = field(default_factory=threading.Lock, init=False)
    _claims: dict[str, JsonObject] = field(default_factory=dict, init=False)  # uid -> claim awaiting our condition
    _allocated: set[str] = field(default_factory=set, init=False)  # uids of claims allocated a channel with it
    _memory: _Memory = field(default_factory=_Memory, init=False)
    _wake: Callable[[], None] = field(default_factory=lambda: _asleep, init=False)  # wakes `run`'s loop

    # -- feeds (kopf's event handlers; any thread) -------------------------------------------------------

    def notify(self) -> None:
        self._wake()

    def on_claim(self, event_type: str | None, body: Mapping[str, Any]) -> None:
        """kopf's claims watch: keep the claims that wait for our binding condition; forget the others."""
        uid = str((body.get("metadata") or {}).get("uid") or "")
        waiting = event_type != "DELETED" and any(not c.settled for c in binding.channel_claims(body))
        allocated = event_type != "DELETED" and bool(binding.channel_claims(body))
        with self._lock:
            if waiting:
                self._claims[uid] = dict(body)
            else:
                self._claims.pop(uid, None)
            if allocated:
                self._allocated.add(uid)
            else:
                self._allocated.discard(uid)
            lost = uid in self._memory.labelled and not allocated
        if waiting or lost:
            self._wake()

    # -- the loop ----------------------------------------------------------------------------------------

    async def run(self, stopped: asyncio.Event) -> None:
        loop = asyncio.get_running_loop()
        wake = asyncio.Event()

        def woken() -> None:
            with contextlib.suppress(RuntimeError):  # the loop closed while the operator stops
                loop.call_soon_threadsafe(wake.set)

        self._wake = woken
        try:
            while not stopped.is_set():
                wake.clear()
                started = loop.time()
                try:
                    await loop.run_in_executor(None, self.sync)
                except Exception:  # a bug must not end the loop; the next pass tries again
                    log.exception("ComputeDomain pass failed")
                # The next pass one interval after this one began, or sooner when woken (a domain or a claim
                # changed), but never sooner than a quarter interval: a burst of events makes one pass.
                interval = self.settings.status_interval_seconds
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(stopped.wait(), max(0.0, interval / 4 - (loop.time() - started)))
                if stopped.is_set():
                    break
                waits = [asyncio.ensure_future(wake.wait()), asyncio.ensure_future(stopped.wait())]
                try:
                    await asyncio.wait(waits, timeout=max(0.0, interval - (loop.time() - started)),
                                       return_when=asyncio.FIRST_COMPLETED)
                finally:
                    for waiting in waits:
                        waiting.cancel()
        finally:
            self._wake = _asleep

    def sync(self) -> None:
        """One pass over every domain and every waiting channel claim."""
        try:
            raw_domains = list_all(self.rest, "/apis/gpu.dra.dev/v1beta1/computedomains")
            raw_cliques = list_all(self.rest,
                                   f"/apis/gpu.dra.dev/v1beta1/namespaces/{_q(self._ns)}/computedomaincliques")
            pods = list_all(self.rest, f"/api/v1/namespaces/{_q(self._ns)}/pods",
                            {"labelSelector": names.DOMAIN_LABEL})
        except ApiError as exc:
            self.metrics.compute_domain_errors.labels("status").inc()
            log.warning("ComputeDomains: listing failed, next pass tries again: %s", exc)
            return
        domains: list[tuple[ComputeDomain, JsonObject]] = []
        for obj in raw_domains:
            try:
                domains.append((parse_compute_domain(obj), obj))
            except InvalidObjectError as exc:
                log.warning("ComputeDomain skipped: %s", exc)  # the CRD schema makes this rare
        cliques: list[ComputeDomainClique] = []
        for obj in raw_cliques:
            try:
                cliques.append(parse_clique(obj))
            except InvalidObjectError as exc:
                log.warning("ComputeDomainClique skipped: %s", exc)
        live = [status.Domain(d, str((obj.get("metadata") or {}).get("creationTimestamp") or ""))
                for d, obj in domains]
        pods_by_domain: dict[str, list[JsonObject]] = {}
        for pod in pods:
            uid = ((pod.get("metadata") or {}).get("labels") or {}).get(names.DOMAIN_LABEL, "")
            pods_by_domain.setdefault(uid, []).append(pod)
        # Cliques of domains that are gone altogether (deleted past a finalizer someone removed by hand): deleted.
        known = {d.uid for d, _ in domains}
        for orphan in [c for c in cliques if c.domain_uid not in known]:
            try:
                self._delete_clique(orphan.name)
                log.info("clique %s deleted: its ComputeDomain is gone", orphan.name)
            except ApiError as exc:
                self.metrics.compute_domain_errors.labels("cleanup").inc()
                log.info("orphaned clique %s not deleted yet: %s", orphan.name, exc)
        cliques = [c for c in cliques if c.domain_uid in known]
        # Clique entries of nodes without a daemon pod go first, so that ownership and status see the same thing.
        cliques = [self._prune(c, pods_by_domain.get(c.domain_uid, [])) for c in cliques]
        owners = status.clique_owners(live, cliques)
        totals: dict[str, int] = {}
        node_totals: dict[str, int] = {}
        for view, (domain, obj) in zip(live, domains, strict=True):
            if domain.deleting:
                if names.DOMAIN_FINALIZER in domain.finalizers:
                    self._cleanup(domain, obj, cliques)
                continue
            shown = self._reconcile(view, obj, cliques, owners)
            if shown is not None:
                totals[shown.status] = totals.get(shown.status, 0) + 1
                for node in shown.nodes:
                    node_totals[node.status] = node_totals.get(node.status, 0) + 1
        self.metrics.observe_domains(totals, node_totals)
        self._bind({d.uid: d for d in live if not d.domain.deleting}, cliques, owners, pods_by_domain)
        self._forget_gone({d.uid for d in live})

    @property
    def _ns(self) -> str:
        return self.settings.daemon.namespace

    # -- one live domain ---------------------------------------------------------------------------------

    def _reconcile(self, view: status.Domain, obj: JsonObject, cliques: list[ComputeDomainClique],
                   owners: Mapping[str, status.Domain]) -> status.DomainStatus | None:
        domain = view.domain
        refusal = ""
        try:
            if names.DOMAIN_FINALIZER not in domain.finalizers:
                self._add_finalizer(domain)
            refusal = self._ensure_objects(domain)
        except ApiError as exc:
            self.metrics.compute_domain_errors.labels("objects").inc()
            log.warning("ComputeDomain %s/%s: objects not made yet: %s", domain.namespace, domain.name, exc)
        mine = status.cliques_of(domain.uid, cliques)
        conflict = status.conflict_of(view, owners, cliques)
        wanted = status.domain_status(domain, mine, conflict=conflict, refusal=refusal)
        self._report(domain, wanted)
        patch = status.status_patch(obj, wanted, now_rfc3339())
        if patch:
            try:
                self.rest.request(
                    "PATCH",
                    f"/apis/gpu.dra.dev/v1beta1/namespaces/{_q(domain.namespace)}/computedomains/{_q(domain.name)}"
                    "/status",
                    body={"status": patch}, content_type=MERGE,
                )
            except ApiError as exc:
                if not exc.not_found:
                    self.metrics.compute_domain_errors.labels("status").inc()
                    log.warning("ComputeDomain %s/%s: status not written: %s", domain.namespace, domain.name, exc)
        return wanted

    def _add_finalizer(self, domain: ComputeDomain) -> None:
        # The list is replaced whole by a merge patch: the resourceVersion precondition keeps others' finalizers.
        self.rest.request(
            "PATCH", f"/apis/gpu.dra.dev/v1beta1/namespaces/{_q(domain.namespace)}/computedomains/{_q(domain.name)}",
            body={"metadata": {"finalizers": [*domain.finalizers, names.DOMAIN_FINALIZER],
                               "resourceVersion": domain.resource_version}},
            content_type=MERGE,
        )

    def _ensure_objects(self, domain: ComputeDomain) -> str:
        """Create what is missing; "" or why the domain cannot have its workload template."""
        refusal = ""
        wanted = objects.workload_claim_template(domain)
        current = self.rest.get(f"/apis/resource.k8s.io/v1/namespaces/{_q(domain.namespace)}/resourceclaimtemplates/"
                                f"{_q(domain.claim_template_name)}")
        if current is None:
            self.rest.request(
                "POST", f"/apis/resource.k8s.io/v1/namespaces/{_q(domain.namespace)}/resourceclaimtemplates",
                body=wanted)
            self._event(domain, NORMAL, "ClaimTemplateCreated",
                        f"ResourceClaimTemplate {domain.namespace}/{domain.claim_template_name} created")
        elif not objects.labelled_for(current, domain.uid):
            refusal = (f"ResourceClaimTemplate {domain.namespace}/{domain.claim_template_name} exists and was not "
                       "made for this domain; delete it or name another in spec.channel.resourceClaimTemplate.name")
        daemon_rct = objects.daemon_claim_template(domain, self.settings.daemon)
        name = names.daemon_object_name(domain.uid)
        if self.rest.get(f"/apis/resource.k8s.io/v1/namespaces/{_q(self._ns)}/resourceclaimtemplates/"
                         f"{_q(name)}") is None:
            self.rest.request("POST", f"/apis/resource.k8s.io/v1/namespaces/{_q(self._ns)}/resourceclaimtemplates",
                              body=daemon_rct)
        ds = objects.daemon_set(domain, self.settings.daemon)
        current_ds = self.rest.get(f"/apis/apps/v1/namespaces/{_q(self._ns)}/daemonsets/{_q(name)}")
        if current_ds is None:
            self.rest.request("POST", f"/apis/apps/v1/namespaces/{_q(self._ns)}/daemonsets", body=ds)
            self._event(domain, NORMAL, "DaemonSetCreated", f"IMEX daemon DaemonSet {self._ns}/{name} created")
        else:
            hash_key = objects.TEMPLATE_HASH_ANNOTATION
            have = ((current_ds.get("metadata") or {}).get("annotations") or {}).get(hash_key)
            if have != ds["metadata"]["annotations"][hash_key]:
                ds["metadata"]["resourceVersion"] = (current_ds.get("metadata") or {}).get("resourceVersion")
                self.rest.request("PUT", f"/apis/apps/v1/namespaces/{_q(self._ns)}/daemonsets/{_q(name)}", body=ds)
                self._event(domain, NORMAL, "DaemonSetUpdated", f"IMEX daemon DaemonSet {self._ns}/{name} updated")
        return refusal

    def _prune(self, clique: ComputeDomainClique, pods: list[JsonObject]) -> ComputeDomainClique:
        # A terminating pod counts as gone: its daemon removes its own entry on SIGTERM, and on a dead node the pod
        # stays Terminating until the node is deleted, while its last entry may still say Ready.
        nodes = [str((p.get("spec") or {}).get("nodeName") or "") for p in pods
                 if not (p.get("metadata") or {}).get("deletionTimestamp")]
        kept = status.pruned(clique, [n for n in nodes if n])
        if kept is None:
            return clique
        try:
            current = self.rest.get(
                f"/apis/gpu.dra.dev/v1beta1/namespaces/{_q(self._ns)}/computedomaincliques/{_q(clique.name)}")
            if current is None or (current.get("metadata") or {}).get("resourceVersion") != clique.resource_version:
                return clique  # a daemon wrote it meanwhile: the next pass looks again
            body = {**current, "daemons": [d.to_json(key="nodeName") for d in kept]}
            self.rest.request(
                "PUT", f"/apis/gpu.dra.dev/v1beta1/namespaces/{_q(self._ns)}/computedomaincliques/{_q(clique.name)}",
                body=body)
        except ApiError as exc:
            if exc.status != 409:
                self.metrics.compute_domain_errors.labels("status").inc()
            log.info("clique %s not pruned yet: %s", clique.name, exc)
            return clique
        gone = sorted({d.name for d in clique.daemons} - {d.name for d in kept})
        log.info("clique %s: removed the entries of %s (no daemon pod)", clique.name, ", ".join(gone))
        return ComputeDomainClique(clique.namespace, clique.name, kept, "")

    def _report(self, domain: ComputeDomain, wanted: status.DomainStatus) -> None:
        """Events on transitions and new refusals (the recorder also folds repeats)."""
        memory = self._memory
        before = memory.shown.get(domain.uid, domain.status if domain.nodes else "")
        memory.shown[domain.uid] = wanted.status
        if wanted.reason in (reasons.CLIQUE_IN_USE, reasons.TEMPLATE_CONFLICT):
            if memory.refused.get(domain.uid) != wanted.message:
                memory.refused[domain.uid] = wanted.message
                self._event(domain, WARNING, wanted.reason, wanted.message)
            return
        memory.refused.pop(domain.uid, None)
        if before != wanted.status:
            if wanted.ready:
                self._event(domain, NORMAL, "Ready", wanted.message)
            elif before == names.STATUS_READY:
                self._event(domain, WARNING, "NotReady", wanted.message)

    def _event(self, domain: ComputeDomain, kind: str, reason: str, message: str) -> None:
        if self.events is None:
            return
        self.events.record(InvolvedObject(names.GROUP_VERSION, names.COMPUTE_DOMAIN_KIND, domain.name,
                                          domain.namespace, domain.uid), type=kind, reason=reason, message=message)

    # -- deletion ----------------------------------------------------------------------------------------

    def _cleanup(self, domain: ComputeDomain, obj: JsonObject, cliques: Iterable[ComputeDomainClique]) -> None:
        try:
            name = names.daemon_object_name(domain.uid)
            self._delete_template(domain.namespace, domain.claim_template_name, domain.uid)
            self._delete_template(self._ns, name, domain.uid)
            with contextlib.suppress(ApiError):
                self._gone(lambda: self.rest.request(
                    "DELETE", f"/apis/apps/v1/namespaces/{_q(self._ns)}/daemonsets/{_q(name)}",
                    body={"propagationPolicy": "Background"}))
            for clique in status.cliques_of(domain.uid, cliques):
                self._delete_clique(clique.name)
            self._unlabel_nodes(domain.uid)
            finalizers = [f for f in domain.finalizers if f != names.DOMAIN_FINALIZER]
            self.rest.request(
                "PATCH",
                f"/apis/gpu.dra.dev/v1beta1/namespaces/{_q(domain.namespace)}/computedomains/{_q(domain.name)}",
                body={"metadata": {"finalizers": finalizers or None, "resourceVersion": domain.resource_version}},
                content_type=MERGE,
            )
        except ApiError as exc:
            if not exc.not_found:
                self.metrics.compute_domain_errors.labels("cleanup").inc()
                log.warning("ComputeDomain %s/%s: cleanup not finished yet: %s", domain.namespace, domain.name, exc)
            return
        log.info("ComputeDomain %s/%s: deleted its templates, DaemonSet, cliques and node labels", domain.namespace,
                 domain.name)
        self._memory.shown.pop(domain.uid, None)
        self._memory.refused.pop(domain.uid, None)

    def _delete_clique(self, name: str) -> None:
        self._gone(lambda: self.rest.request(
            "DELETE", f"/apis/gpu.dra.dev/v1beta1/namespaces/{_q(self._ns)}/computedomaincliques/{_q(name)}"))

    def _gone(self, delete: Callable[[], JsonObject]) -> None:
        try:
            delete()
        except ApiError as exc:
            if not exc.not_found:
                raise

    def _delete_template(self, namespace: str, name: str, uid: str) -> None:
        current = self.rest.get(
            f"/apis/resource.k8s.io/v1/namespaces/{_q(namespace)}/resourceclaimtemplates/{_q(name)}")
        if current is None or not objects.labelled_for(current, uid):
            return  # not ours: never touched
        meta = current.get("metadata") or {}
        finalizers = [f for f in meta.get("finalizers") or [] if f != names.DOMAIN_FINALIZER]
        if len(finalizers) != len(meta.get("finalizers") or []):
            self.rest.request(
                "PATCH", f"/apis/resource.k8s.io/v1/namespaces/{_q(namespace)}/resourceclaimtemplates/{_q(name)}",
                body={"metadata": {"finalizers": finalizers or None, "resourceVersion": meta.get("resourceVersion")}},
                content_type=MERGE)
        self._gone(lambda: self.rest.request(
            "DELETE", f"/apis/resource.k8s.io/v1/namespaces/{_q(namespace)}/resourceclaimtemplates/{_q(name)}",
            body={"preconditions": {"uid": meta.get("uid")}}))

    def _unlabel_nodes(self, uid: str) -> None:
        nodes = list_all(self.rest, "/api/v1/nodes", {"labelSelector": f"{names.DOMAIN_LABEL}={uid}"})
        for node in nodes:
            self._set_label(str((node.get("metadata") or {}).get("name")), None)

    def _set_label(self, node: str, uid: str | None) -> None:
        self._gone(lambda: self.rest.request("PATCH", f"/api/v1/nodes/{_q(node)}",
                                             body={"metadata": {"labels": {names.DOMAIN_LABEL: uid}}},
                                             content_type=MERGE))

    # -- binding conditions ------------------------------------------------------------------------------

    def _bind(self, domains: Mapping[str, status.Domain], cliques: list[ComputeDomainClique],
              owners: Mapping[str, status.Domain], pods_by_domain: Mapping[str, list[JsonObject]]) -> None:
        with self._lock:
            waiting = list(self._claims.values())
            lost = [(uid, node, d) for uid, (node, d) in self._memory.labelled.items()
                    if uid not in self._allocated]
        for uid, node, domain_uid in lost:
            self._release_label(uid, node, domain_uid)
        now = self.clock()
        stamp = now.strftime("%Y-%m-%dT%H:%M:%SZ")
        for claim in waiting:
            for channel in binding.channel_claims(claim):
                if channel.settled:
                    continue
                try:
                    self._bind_one(claim, channel, domains, cliques, owners, pods_by_domain, now, stamp)
                except ApiError as exc:
                    if exc.status != 409:
                        self.metrics.compute_domain_errors.labels("binding").inc()
                    log.info("claim %s: binding condition not set yet: %s", channel.key, exc)

    def _bind_one(self, claim: JsonObject, channel: binding.ChannelClaim, domains: Mapping[str, status.Domain],
                  cliques: list[ComputeDomainClique], owners: Mapping[str, status.Domain],
                  pods_by_domain: Mapping[str, list[JsonObject]], now: dt.datetime, stamp: str) -> None:
        domain = domains.get(channel.domain_uid)
        node = self.rest.get(f"/api/v1/nodes/{_q(channel.node)}")
        label = ((node or {}).get("metadata") or {}).get("labels", {}).get(names.DOMAIN_LABEL)
        entry = None
        clique_id = ""
        for clique in status.cliques_of(channel.domain_uid, cliques):
            found = clique.daemon(channel.node)
            if found is not None:
                entry, clique_id = found, clique.clique_id
        # The node's clique before its daemon joined: the cliqueID attribute the compute-domain plugin publishes on
        # the allocated device.
        clique_id = clique_id or self._device_clique(channel)
        owner = owners.get(clique_id) if clique_id else None
        node_pods = [p for p in pods_by_domain.get(channel.domain_uid, [])
                     if (p.get("spec") or {}).get("nodeName") == channel.node]
        decision = binding.decide(
            channel, domain_known=domain is not None, node_label=label,
            clique_owner_uid=owner.uid if owner else None,
            clique_owner=f"{owner.domain.namespace}/{owner.domain.name}" if owner else "",
            entry=entry, pod_failure=binding.pod_failure(node_pods), now=now,
            timeout_s=self.settings.binding_timeout_seconds,
        )
        if decision.verdict is binding.Verdict.WAIT:
            if decision.label and node is not None:
                self._set_label(channel.node, channel.domain_uid)
                with self._lock:
                    self._memory.labelled[channel.uid] = (channel.node, channel.domain_uid)
                log.info("claim %s: labelled node %s for ComputeDomain %s", channel.key, channel.node,
                         channel.domain_uid)
            return
        devices = binding.devices_with(claim, channel, decision, stamp)
        self.rest.request(
            "PATCH",
            f"/apis/resource.k8s.io/v1/namespaces/{_q(channel.namespace)}/resourceclaims/{_q(channel.name)}/status",
            body={"metadata": {"resourceVersion": channel.resource_version}, "status": {"devices": devices}},
            content_type=MERGE,
        )
        verdict = "ready" if decision.verdict is binding.Verdict.READY else "failed"
        self.metrics.binding_conditions.labels(verdict).inc()
        log.info("claim %s: %s on %s/%s/%s: %s", channel.key,
                 names.READY_CONDITION if verdict == "ready" else names.FAILED_CONDITION, names.DRIVER_NAME,
                 channel.pool, channel.device, decision.message)
        if domain is not None and verdict == "failed":
            self._event(domain.domain, WARNING, decision.reason, f"claim {channel.key}: {decision.message}")
        with self._lock:
            self._claims.pop(channel.uid, None)

    def _device_clique(self, channel: binding.ChannelClaim) -> str:
        """The cliqueID attribute of the allocated device in its node's slice ("" : none, or not found)."""
        slices = list_all(self.rest, "/apis/resource.k8s.io/v1/resourceslices",
                          {"fieldSelector": f"spec.driver={names.DRIVER_NAME},spec.nodeName={channel.node}"})
        for item in slices:
            spec = item.get("spec") or {}
            if (spec.get("pool") or {}).get("name") != channel.pool:
                continue
            for device in spec.get("devices") or []:
                if isinstance(device, dict) and device.get("name") == channel.device:
                    value = ((device.get("attributes") or {}).get(names.CLIQUE_ATTRIBUTE) or {}).get("string")
                    return str(value or "")
        return ""

    def _release_label(self, claim_uid: str, node: str, domain_uid: str) -> None:
        """A claim this controller labelled a node for is gone or deallocated (failed binding, pod done): take the
        label back unless another waiting claim of the domain still wants that node."""
        with self._lock:
            still = any(n == node and d == domain_uid for u, (n, d) in self._memory.labelled.items()
                        if u != claim_uid and u in self._allocated)
        try:
            current = self.rest.get(f"/api/v1/nodes/{_q(node)}")
            label = ((current or {}).get("metadata") or {}).get("labels", {}).get(names.DOMAIN_LABEL)
            if current is not None and label == domain_uid and not still:
                self._set_label(node, None)
                log.info("node %s: label %s removed (its channel claim is gone)", node, names.DOMAIN_LABEL)
        except ApiError as exc:
            self.metrics.compute_domain_errors.labels("binding").inc()
            log.info("node %s: label not removed yet: %s", node, exc)
            return
        with self._lock:
            self._memory.labelled.pop(claim_uid, None)

    def _forget_gone(self, live: set[str]) -> None:
        for uid in [u for u in self._memory.shown if u not in live]:
            self._memory.shown.pop(uid, None)
            self._memory.refused.pop(uid, None)

