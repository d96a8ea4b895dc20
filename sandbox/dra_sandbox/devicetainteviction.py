"""The device taint eviction controller of kube-controller-manager (KEP-5055), as far as pods and rules see it.

Upstream: kubernetes/kubernetes `pkg/controller/devicetainteviction/device_taint_eviction.go` (`claimEvictionTime`,
`allEvictingDeviceTaints`, `ruleMatchesDevice`, `podEvictionTime`, `addConditionAndDeletePod`,
`maybeUpdateRuleStatus`, `countPendingPods`, `countTaintedDevices`) and
staging/src/k8s.io/dynamic-resource-allocation `resourceclaim` (`ToleratesTaint`).

A pod is evicted when it is scheduled, not being deleted, and one of its claims (`spec.resourceClaims`, by name or
through `status.resourceClaimStatuses`) is allocated, reserved for it, and holds a device with a `NoExecute` taint
(in the device's ResourceSlice of its pool's newest generation, or from a DeviceTaintRule that selects it) that no
toleration of that allocation result tolerates. Only tolerations with effect `NoExecute` count; one without
`tolerationSeconds` tolerates forever, else the taint evicts at `timeAdded + min(tolerationSeconds)` (negative
seconds count as 0). The pod's eviction time is the earliest of its claims'. Eviction: a `Normal` Event
`DeviceTaintManagerEviction` "Marking for deletion" on the pod, the pod condition `DisruptionTarget=True` (reason
`DeletionByDeviceTaintManager`, message "Device Taint manager: deleting due to NoExecute taint"), then DELETE with a
UID precondition.

Each DeviceTaintRule gets the status condition `EvictionInProgress`: `True/PodsPendingEviction` ("N pod(s) need(s)
to be evicted in M namespace(s).") while pods wait, else `False` with reason `Completed` (some pod evicted),
`NotStarted`, `NoEffect` (effect None: a dry run of NoExecute, "N published devices selected. N allocated devices
selected. N pods would be evicted in N namespace(s) if the effect was NoExecute. This information will not be
updated again. Recreate the DeviceTaintRule to trigger an update.", computed once per generation) or
`EffectNoSchedule`/`OtherEffect`; with ", N pod(s) evicted since starting the controller." appended. While it
changes, a rule's status is written at most every `RULE_STATUS_PERIOD_S` (10 s upstream).

No polling: the loop sleeps until a watched object changes (pods, claims, slices, rules) or the next eviction or
status update is due, on the injected clock (`dra_sandbox.kubelet.clock`).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, Final

import structlog

from dra_driver.allocation.taints import rule_selects, rule_taint
from dra_driver.commands.listing import list_all
from dra_driver.k8s.client import ApiError, JsonObject, KubeRest
from dra_driver.k8s.taintrules import taint_rule_version
from dra_sandbox.conditions import status_condition
from dra_sandbox.kubelet.clock import Clock, RealClock
from dra_sandbox.rest import merge_patch
from dra_sandbox.watchloop import WatchLoop

log = structlog.get_logger(__name__)

RESOURCE: Final = "/apis/resource.k8s.io/v1"
RULE_STATUS_PERIOD_S: Final = 10.0
CONDITION_TYPE: Final = "EvictionInProgress"
DISRUPTION_TARGET: Final = "DisruptionTarget"
DISRUPTION_REASON: Final = "DeletionByDeviceTaintManager"
DISRUPTION_MESSAGE: Final = "Device Taint manager: deleting due to NoExecute taint"
EVENT_REASON: Final = "DeviceTaintManagerEviction"
EVENT_MESSAGE: Final = "Marking for deletion"
COMPONENT: Final = "device-taint-eviction-controller"
NO_EXECUTE: Final = "NoExecute"


def parse_time(text: object, default: float) -> float:
    if not isinstance(text, str) or not text:
        return default
    return datetime.strptime(text, "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=UTC).timestamp()


def format_time(seconds: float) -> str:
    return datetime.fromtimestamp(seconds, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def tolerates(toleration: Mapping[str, Any], taint: Mapping[str, Any]) -> bool:
    """resourceclaim.ToleratesTaint."""
    if toleration.get("effect") and toleration.get("effect") != taint.get("effect"):
        return False
    if toleration.get("key") and toleration.get("key") != taint.get("key"):
        return False
    operator = toleration.get("operator") or "Equal"
    if operator == "Exists":
        return True
    return operator == "Equal" and (toleration.get("value") or "") == (taint.get("value") or "")


@dataclass(frozen=True)
class TrackedTaint:
    """A NoExecute taint and where it comes from: a rule (by uid and name) or a slice's device."""

    taint: Mapping[str, Any] = field(compare=False, hash=False)
    rule_uid: str = ""
    rule_name: str = ""
    origin: str = ""  # "<driver>/<pool>/<device>" for a slice taint


@dataclass(frozen=True)
class Eviction:
    at: float  # wall-clock seconds
    causes: frozenset[TrackedTaint]


def newest_devices(slices: Iterable[Mapping[str, Any]]) -> dict[tuple[str, str, str], Mapping[str, Any]]:
    """(driver, pool, device) -> the device, from the slices of each pool's newest generation only."""
    newest: dict[tuple[str, str], int] = {}
    spec_of: list[tuple[tuple[str, str], int, Mapping[str, Any]]] = []
    for raw in slices:
        spec = raw.get("spec") or {}
        pool = spec.get("pool") or {}
        key = (str(spec.get("driver") or ""), str(pool.get("name") or ""))
        generation = int(pool.get("generation") or 0)
        newest[key] = max(newest.get(key, generation), generation)
        spec_of.append((key, generation, spec))
    out: dict[tuple[str, str, str], Mapping[str, Any]] = {}
    for key, generation, spec in spec_of:
        if generation != newest[key]:
            continue
        for device in spec.get("devices") or []:
            if isinstance(device, Mapping) and device.get("name"):
                out[(*key, str(device["name"]))] = device
    return out


def claim_eviction(claim: Mapping[str, Any], devices: Mapping[tuple[str, str, str], Mapping[str, Any]],
                   rules: Sequence[Mapping[str, Any]], now: float) -> Eviction | None:
    """When the pods of an allocated claim must go, and why (claimEvictionTime); None: never."""
    allocation = (claim.get("status") or {}).get("allocation")
    if not isinstance(allocation, Mapping):
        return None
    when: float | None = None
    causes: set[TrackedTaint] = set()
    for result in (allocation.get("devices") or {}).get("results") or []:
        ident = (str(result.get("driver")), str(result.get("pool")), str(result.get("device")))
        tracked = [TrackedTaint(t, origin="/".join(ident))
                   for t in (devices.get(ident) or {}).get("taints") or [] if t.get("effect") == NO_EXECUTE]
        for rule in rules:
            taint = rule_taint(rule)
            if taint is not None and taint.get("effect") == NO_EXECUTE and rule_selects(rule, *ident):
                meta = rule.get("metadata") or {}
                tracked.append(TrackedTaint(taint, rule_uid=str(meta.get("uid")), rule_name=str(meta.get("name"))))
        for item in tracked:
            at = parse_time(item.taint.get("timeAdded"), now)
            seconds: int | None = None
            forever = False
            for toleration in result.get("tolerations") or []:
                if toleration.get("effect") != NO_EXECUTE or not tolerates(toleration, item.taint):
                    continue
                if toleration.get("tolerationSeconds") is None:
                    forever = True
                    break
                value = max(int(toleration["tolerationSeconds"]), 0)
                seconds = value if seconds is None else min(seconds, value)
            if forever:
                continue
            at += seconds or 0
            causes.add(item)
            when = at if when is None else min(when, at)
    return None if when is None else Eviction(when, frozenset(causes))


def pod_claim_names(pod: Mapping[str, Any]) -> list[str]:
    statuses = {s.get("name"): s.get("resourceClaimName")
                for s in (pod.get("status") or {}).get("resourceClaimStatuses") or []}
    out: list[str] = []
    for entry in (pod.get("spec") or {}).get("resourceClaims") or []:
        name = entry.get("resourceClaimName") or statuses.get(entry.get("name"))
        if name:
            out.append(str(name))
    return out


def pod_eviction(pod: Mapping[str, Any], claims: Mapping[tuple[str, str], tuple[Mapping[str, Any], Eviction | None]]
                 ) -> Eviction | None:
    """podEvictionTime: the earliest eviction of the pod's allocated claims reserved for it."""
    meta = pod.get("metadata") or {}
    if not (pod.get("spec") or {}).get("nodeName") or meta.get("deletionTimestamp"):
        return None
    if (pod.get("status") or {}).get("phase") in ("Succeeded", "Failed"):
        return None
    found: Eviction | None = None
    for name in pod_claim_names(pod):
        claim, eviction = claims.get((str(meta.get("namespace")), name), ({}, None))
        if eviction is None:
            continue
        reserved = (claim.get("status") or {}).get("reservedFor") or []
        if not any(r.get("resource") == "pods" and r.get("uid") == meta.get("uid") for r in reserved):
            continue
        found = eviction if found is None else Eviction(min(found.at, eviction.at), found.causes | eviction.causes)
    return found


def _plural(n: int, one: str, many: str) -> str:
    return one if n == 1 else many.format(n=n)


def rule_condition(rule: Mapping[str, Any], *, pending_pods: int, pending_namespaces: int, evicted: int,
                   published_devices: int = 0, allocated_devices: int = 0) -> dict[str, Any]:
    """The EvictionInProgress condition (maybeUpdateRuleStatus), without lastTransitionTime."""
    effect = str(((rule.get("spec") or {}).get("taint") or {}).get("effect") or "")
    status, reason, message = "False", f"Effect{effect}", ""
    if effect == NO_EXECUTE:
        if pending_pods > 0:
            status, reason = "True", "PodsPendingEviction"
            message = (_plural(pending_pods, "1 pod needs", "{n} pods need") + " to be evicted in "
                       + _plural(pending_namespaces, "1 namespace.", "{n} different namespaces."))
        else:
            reason = "Completed" if evicted > 0 else "NotStarted"
    elif effect == "None":
        reason = "NoEffect"
        message = (_plural(published_devices, "1 published device selected. ", "{n} published devices selected. ")
                   + _plural(allocated_devices, "1 allocated device selected. ", "{n} allocated devices selected. ")
                   + _plural(pending_pods, "1 pod would be evicted in ", "{n} pods would be evicted in ")
                   + _plural(pending_namespaces, "1 namespace ", "{n} different namespaces ")
                   + "if the effect was NoExecute. This information will not be updated again. Recreate the "
                   "DeviceTaintRule to trigger an update.")
    else:
        reason, message = "OtherEffect", "Eviction only happens for the NoExecute effect."
    if evicted > 0:
        message += (" " if message else "") + _plural(evicted, "1 pod ", "{n} pods ") + \
            "evicted since starting the controller."
    generation = int((rule.get("metadata") or {}).get("generation") or 0)
    return {"type": CONDITION_TYPE, "status": status, "reason": reason, "message": message,
            "observedGeneration": generation}


@dataclass(frozen=True)
class Plan:
    """One pass: pods to evict now, the conditions rules should have, and when to look again."""

    evict: tuple[tuple[Mapping[str, Any], Eviction], ...]
    pending: Mapping[str, tuple[int, int]]  # rule uid -> (pods pending eviction, their namespaces)
    next_at: float | None


def plan(pods: Sequence[Mapping[str, Any]], claims: Sequence[Mapping[str, Any]], slices: Sequence[Mapping[str, Any]],
         rules: Sequence[Mapping[str, Any]], now: float) -> Plan:
    """Pure: which pods go now, which wait (and until when), per rule how many are pending."""
    devices = newest_devices(slices)
    by_key = {(str(c["metadata"].get("namespace")), str(c["metadata"].get("name"))): (c, claim_eviction(
        c, devices, rules, now)) for c in claims}
    evict: list[tuple[Mapping[str, Any], Eviction]] = []
    pending: dict[str, set[tuple[str, str]]] = {}
    next_at: float | None = None
    for pod in pods:
        eviction = pod_eviction(pod, by_key)
        if eviction is None:
            continue
        meta = pod.get("metadata") or {}
        for cause in eviction.causes:
            if cause.rule_uid:
                pending.setdefault(cause.rule_uid, set()).add((str(meta.get("namespace")), str(meta.get("name"))))
        if eviction.at <= now:
            evict.append((pod, eviction))
        else:
            next_at = eviction.at if next_at is None else min(next_at, eviction.at)
    counts = {uid: (len(keys), len({ns for ns, _ in keys})) for uid, keys in pending.items()}
    return Plan(tuple(evict), counts, next_at)


def dry_run_counts(rule: Mapping[str, Any], pods: Sequence[Mapping[str, Any]], claims: Sequence[Mapping[str, Any]],
                   slices: Sequence[Mapping[str, Any]], now: float) -> tuple[int, int, int, int]:
    """For a rule with effect None: (published devices, allocated devices, pods, namespaces) it would touch as
    NoExecute (the upstream simulation)."""
    spec = rule.get("spec") or {}
    simulated = {**rule, "spec": {**spec, "taint": {**(spec.get("taint") or {}), "effect": NO_EXECUTE}}}
    uid = str((rule.get("metadata") or {}).get("uid"))
    published = sum(1 for ident in newest_devices(slices) if rule_selects(rule, *ident))
    allocated = sum(1 for c in claims for r in (((c.get("status") or {}).get("allocation") or {}).get("devices")
                                                  or {}).get("results") or []
                    if rule_selects(rule, str(r.get("driver")), str(r.get("pool")), str(r.get("device"))))
    pods_n, namespaces = plan(pods, claims, slices, [simulated], float("inf")).pending.get(uid, (0, 0))
    return published, allocated, pods_n, namespaces


class DeviceTaintEvictionController:
    """The loop around `plan`: watches, evicts, writes rule status; sleeps until something changes or is due."""

    def __init__(self, rest: KubeRest, clock: Clock | None = None,
                 status_period_s: float = RULE_STATUS_PERIOD_S) -> None:
        self.rest = rest
        self._clock = clock or RealClock()
        self._status_period = status_period_s
        self._loop = WatchLoop(rest, COMPONENT, self._pass, self._clock)
        self._rules_path: str | None = None
        self._evicted: dict[str, int] = {}  # rule uid -> pods evicted because of it
        self._status_written: dict[str, float] = {}  # rule uid -> when its status was last written (wall)

    def start(self) -> None:
        version = taint_rule_version(self.rest)
        self._rules_path = f"/apis/resource.k8s.io/{version}/devicetaintrules" if version else ""
        paths = ["/api/v1/pods", f"{RESOURCE}/resourceclaims", f"{RESOURCE}/resourceslices"]
        if self._rules_path:
            paths.append(self._rules_path)
        self._loop.start(paths)

    def stop(self) -> None:
        self._loop.stop()

    def trigger(self) -> None:
        self._loop.trigger()

    def _pass(self) -> float:
        """One reconcile, its errors logged; the seconds until the next eviction or status update is due (an hour
        when only a change calls for one: a watch event wakes the loop sooner)."""
        try:
            delay = self.reconcile()
        except ApiError as exc:
            log.warning("device taint eviction: API error", error=str(exc))
            return 1.0
        except Exception:
            log.exception("device taint eviction failed")
            return 1.0
        return delay if delay is not None else 3600.0

    def _rules(self) -> list[JsonObject]:
        return list_all(self.rest, self._rules_path) if self._rules_path else []

    def reconcile(self) -> float | None:
        """One pass; the seconds until the next one is due by time alone (None: only a change calls for one)."""
        now = self._clock.wall()
        pods = list_all(self.rest, "/api/v1/pods")
        claims = list_all(self.rest, f"{RESOURCE}/resourceclaims")
        slices = list_all(self.rest, f"{RESOURCE}/resourceslices")
        rules = self._rules()
        result = plan(pods, claims, slices, rules, now)
        gone: set[str] = set()
        for pod, eviction in result.evict:
            if self._evict(pod):
                gone.add(str(pod["metadata"]["uid"]))
                for uid in {c.rule_uid for c in eviction.causes if c.rule_uid}:
                    self._evicted[uid] = self._evicted.get(uid, 0) + 1
        if gone:  # the rules' pending counts no longer include the pods just deleted (countPendingPods skips them)
            pods = [p for p in pods if str(p["metadata"]["uid"]) not in gone]
            result = plan(pods, claims, slices, rules, now)
        due = [result.next_at - now] if result.next_at is not None else []
        for rule in rules:
            wait = self._update_rule_status(rule, result, pods, claims, slices, now)
            if wait is not None:
                due.append(wait)
        return max(min(due), 0.0) if due else None

    def _evict(self, pod: Mapping[str, Any]) -> bool:
        meta = pod["metadata"]
        namespace, name, uid = str(meta["namespace"]), str(meta["name"]), str(meta["uid"])
        path = f"/api/v1/namespaces/{namespace}/pods/{name}"
        try:
            self.rest.request("POST", f"/api/v1/namespaces/{namespace}/events", body=self._event(pod))
            conditions = [c for c in (pod.get("status") or {}).get("conditions") or []
                          if c.get("type") != DISRUPTION_TARGET]
            conditions.append({"type": DISRUPTION_TARGET, "status": "True", "reason": DISRUPTION_REASON,
                               "message": DISRUPTION_MESSAGE, "lastTransitionTime": format_time(self._clock.wall())})
            merge_patch(self.rest, f"{path}/status", {"status": {"conditions": conditions}})
            self.rest.request("DELETE", path, body={"apiVersion": "v1", "kind": "DeleteOptions",
                                                    "preconditions": {"uid": uid}})
        except ApiError as exc:
            if exc.not_found or exc.status == 409:
                return False  # gone, or replaced by a pod of the same name
            raise
        log.info("pod evicted for a NoExecute device taint", pod=f"{namespace}/{name}")
        return True

    def _event(self, pod: Mapping[str, Any]) -> JsonObject:
        meta = pod["metadata"]
        stamp = format_time(self._clock.wall())
        return {
            "apiVersion": "v1", "kind": "Event",
            "metadata": {"generateName": f"{meta['name']}.", "namespace": meta["namespace"]},
            "involvedObject": {"apiVersion": "v1", "kind": "Pod", "name": meta["name"],
                               "namespace": meta["namespace"], "uid": meta["uid"]},
            "type": "Normal", "reason": EVENT_REASON, "message": EVENT_MESSAGE,
            "source": {"component": COMPONENT}, "firstTimestamp": stamp, "lastTimestamp": stamp, "count": 1,
        }

    def _update_rule_status(self, rule: JsonObject, result: Plan, pods: Sequence[JsonObject],
                            claims: Sequence[JsonObject], slices: Sequence[JsonObject], now: float) -> float | None:
        """Write the rule's EvictionInProgress condition when it changed; the seconds until it may be written
        again when a change has to wait for the status period."""
        meta = rule.get("metadata") or {}
        uid, generation = str(meta.get("uid")), int(meta.get("generation") or 0)
        existing = status_condition(rule, CONDITION_TYPE)
        effect = ((rule.get("spec") or {}).get("taint") or {}).get("effect")
        same_generation = existing is not None and existing.get("observedGeneration") == generation
        if effect == "None" and same_generation:
            return None  # a dry run is reported once per generation
        pending, namespaces = result.pending.get(uid, (0, 0))
        published = allocated = 0
        if effect == "None":
            published, allocated, pending, namespaces = dry_run_counts(rule, pods, claims, slices, now)
        wanted = rule_condition(rule, pending_pods=pending, pending_namespaces=namespaces,
                                evicted=self._evicted.get(uid, 0), published_devices=published,
                                allocated_devices=allocated)
        if existing is not None and {k: existing.get(k) for k in wanted} == wanted:
            return None
        if same_generation:
            since = now - self._status_written.get(uid, parse_time(existing.get("lastTransitionTime") if existing
                                                                   else None, 0.0))
            if since < self._status_period:
                return self._status_period - since
        others = [c for c in (rule.get("status") or {}).get("conditions") or [] if c.get("type") != CONDITION_TYPE]
        body = {**rule, "status": {"conditions": [*others, {**wanted, "lastTransitionTime": format_time(now)}]}}
        try:
            self.rest.request("PUT", f"{self._rules_path}/{meta.get('name')}/status", body=body)
        except ApiError as exc:
            if exc.not_found or exc.status == 409:
                return 0.5  # gone, or changed meanwhile: look again soon
            raise
        self._status_written[uid] = now
        return None
