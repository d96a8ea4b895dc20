"""Pure pod-lifecycle decisions of the kubelet simulator: no API calls, no gRPC, no clock.

Given plain views of pods and ResourceClaims plus what is already prepared, these functions decide
which claims a pod needs, whether the pod can start, which drivers to call for which claims, which
CDI devices each container gets, which prepared claims no active pod uses any more, and what the
pod's status should say. The I/O side (podsync.py) only fetches views and carries the decisions out.
"""

from __future__ import annotations

import types
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from dra_sandbox.kubelet.draclient import ClaimRef, PreparedDevice

TERMINAL_PHASES = ("Succeeded", "Failed")
RESOURCE_GROUP = "resource.k8s.io"


@dataclass(frozen=True)
class PodClaimSource:
    """One entry of pod.spec.resourceClaims."""

    name: str
    resource_claim_name: str | None = None
    template_name: str | None = None


@dataclass(frozen=True)
class ClaimUse:
    """One entry of container.resources.claims: the pod-level claim name and optionally one request."""

    name: str
    request: str | None = None


@dataclass(frozen=True)
class ContainerView:
    name: str
    image: str = ""
    claims: tuple[ClaimUse, ...] = ()
    env: tuple[tuple[str, str], ...] = ()
    reads: tuple[str, ...] = ()  # absolute paths a `cat` container prints (the runtime reads them back)


@dataclass(frozen=True)
class PodView:
    namespace: str
    name: str
    uid: str
    node_name: str = ""
    phase: str = "Pending"
    deleting: bool = False
    restart_policy: str = "Always"
    resource_claims: tuple[PodClaimSource, ...] = ()
    # pod.status.resourceClaimStatuses: pod claim name -> generated ResourceClaim name (None: none needed)
    claim_statuses: Mapping[str, str | None] = field(default_factory=dict)
    containers: tuple[ContainerView, ...] = ()
    conditions: tuple[Mapping[str, Any], ...] = ()
    pod_group: str | None = None  # spec.schedulingGroup.podGroupName (KEP-5729)
    # spec.initContainers: run one after the other, each to completion, before `containers` start.
    init_containers: tuple[ContainerView, ...] = ()

    def __post_init__(self) -> None:
        object.__setattr__(self, "claim_statuses", types.MappingProxyType(dict(self.claim_statuses)))

    @property
    def key(self) -> str:
        return f"{self.namespace}/{self.name}"

    @property
    def active(self) -> bool:
        """Still (going to be) running: not terminal, not being deleted."""
        return not self.deleting and self.phase not in TERMINAL_PHASES


@dataclass(frozen=True)
class AllocatedDevice:
    request: str
    driver: str
    pool: str
    device: str


@dataclass(frozen=True)
class ClaimView:
    ref: ClaimRef
    allocated: bool = False
    devices: tuple[AllocatedDevice, ...] = ()
    reserved_for: frozenset[str] = frozenset()  # consumer UIDs
    # KEP-5729: the PodGroups it is reserved for, by name (a pod knows its group's name, not its UID)
    reserved_groups: frozenset[str] = frozenset()

    @property
    def drivers(self) -> tuple[str, ...]:
        return tuple(dict.fromkeys(d.driver for d in self.devices))


# ---- which claims a pod needs ---------------------------------------------------------------------------


@dataclass(frozen=True)
class ClaimNames:
    """pod claim name -> ResourceClaim name, or why that cannot be known yet."""

    names: Mapping[str, str]
    waiting: str | None = None


def claim_names_for_pod(pod: PodView) -> ClaimNames:
    names: dict[str, str] = {}
    for source in pod.resource_claims:
        if source.resource_claim_name:
            names[source.name] = source.resource_claim_name
            continue
        if not source.template_name:
            return ClaimNames(names, f"pod claim {source.name!r} names neither a ResourceClaim nor a template")
        if source.name not in pod.claim_statuses:
            return ClaimNames(names, f"waiting for the ResourceClaim of pod claim {source.name!r} (template "
                                     f"{source.template_name!r}) to be created")
        generated = pod.claim_statuses[source.name]
        if generated:  # None/empty: the controller decided no claim is needed
            names[source.name] = generated
    return ClaimNames(names)


# ---- can the pod start, and what to prepare --------------------------------------------------------------


@dataclass(frozen=True)
class PreparePlan:
    ready: bool
    waiting: str | None = None
    # pod claim name -> claim (all claims of the pod, once ready)
    claims: Mapping[str, ClaimView] = field(default_factory=dict)
    # driver -> claims to send in NodePrepareResources (already prepared pairs left out)
    calls: Mapping[str, tuple[ClaimRef, ...]] = field(default_factory=dict)


def plan_prepare(
    pod: PodView,
    claims: Mapping[tuple[str, str], ClaimView],
    registered_drivers: Iterable[str],
    prepared: Iterable[tuple[str, str]] = (),
) -> PreparePlan:
    """Decide whether `pod` can have its claims prepared now and which NodePrepareResources calls to make.

    `claims` is keyed by (namespace, name); `prepared` holds (claim uid, driver) pairs already done.
    Every claim must exist, be allocated and be reserved for the pod, and every driver in the claims'
    allocation results must be registered on this node.
    """
    resolved = claim_names_for_pod(pod)
    if resolved.waiting:
        return PreparePlan(False, resolved.waiting)
    drivers = set(registered_drivers)
    done = set(prepared)
    by_pod_name: dict[str, ClaimView] = {}
    calls: dict[str, list[ClaimRef]] = {}
    for pod_claim, claim_name in resolved.names.items():
        claim = claims.get((pod.namespace, claim_name))
        if claim is None:
            return PreparePlan(False, f"ResourceClaim {pod.namespace}/{claim_name} (pod claim {pod_claim!r}) "
                                      "does not exist yet")
        if not claim.allocated:
            return PreparePlan(False, f"ResourceClaim {pod.namespace}/{claim_name} is not allocated yet")
        if pod.uid not in claim.reserved_for and (pod.pod_group is None or pod.pod_group not in claim.reserved_groups):
            return PreparePlan(False, f"ResourceClaim {pod.namespace}/{claim_name} is not reserved for this pod")
        missing = [d for d in claim.drivers if d not in drivers]
        if missing:
            return PreparePlan(False, f"DRA driver {missing[0]} is not registered on this node (needed by "
                                      f"ResourceClaim {pod.namespace}/{claim_name})")
        by_pod_name[pod_claim] = claim
        for driver in claim.drivers:
            if (claim.ref.uid, driver) not in done:
                refs = calls.setdefault(driver, [])
                if claim.ref not in refs:  # two pod claims may name the same ResourceClaim
                    refs.append(claim.ref)
    return PreparePlan(
        True,
        claims=types.MappingProxyType(by_pod_name),
        calls=types.MappingProxyType({d: tuple(refs) for d, refs in calls.items()}),
    )


# ---- which CDI devices a container gets ------------------------------------------------------------------


def _serves(device: PreparedDevice, request: str | None) -> bool:
    if request is None or not device.request_names:
        return True
    return any(r == request or r.startswith(request + "/") for r in device.request_names)


def cdi_ids_for_container(
    container: ContainerView,
    claims: Mapping[str, ClaimView],
    prepared: Mapping[str, Mapping[str, tuple[PreparedDevice, ...]]],
) -> tuple[str, ...]:
    """CDI ids for the claims (and requests) `container` references, in reference order, de-duplicated.

    `claims`: pod claim name -> claim; `prepared`: claim uid -> driver -> devices NodePrepareResources returned.
    A device with no request_names serves every request of its claim; a "req/sub" name serves "req".
    """
    ids: dict[str, None] = {}
    for use in container.claims:
        claim = claims.get(use.name)
        if claim is None:
            continue
        for devices in prepared.get(claim.ref.uid, {}).values():
            for device in devices:
                if _serves(device, use.request):
                    ids.update(dict.fromkeys(device.cdi_device_ids))
    return tuple(ids)


# ---- what to unprepare, which pods may go ----------------------------------------------------------------


def claims_in_use(pod_claims: Mapping[str, Iterable[str]], active_pods: Iterable[str]) -> set[str]:
    """Claim UIDs used by at least one active pod (`pod_claims`: pod uid -> claim uids)."""
    in_use: set[str] = set()
    for pod_uid in active_pods:
        in_use.update(pod_claims.get(pod_uid, ()))
    return in_use


def claims_to_unprepare(
    prepared: Iterable[str], pod_claims: Mapping[str, Iterable[str]], active_pods: Iterable[str]
) -> list[str]:
    """Prepared claim UIDs that no active pod on the node uses any more (sorted for stable call order)."""
    in_use = claims_in_use(pod_claims, active_pods)
    return sorted(uid for uid in set(prepared) if uid not in in_use)


def pod_may_go(pod_uid: str, pod_claims: Mapping[str, Iterable[str]], prepared: Iterable[str],
               active_pods: Iterable[str]) -> bool:
    """A finished/deleted pod may be released once none of its claims is still prepared only for it."""
    in_use = claims_in_use(pod_claims, [p for p in active_pods if p != pod_uid])
    still = set(pod_claims.get(pod_uid, ())) & set(prepared)
    return still <= in_use


# ---- pod status ---------------------------------------------------------------------------------------


@dataclass(frozen=True)
class ContainerOutcome:
    """What happened to one container, reduced to what the pod status needs."""

    name: str
    ok: bool
    exit_code: int
    error: str | None = None


@dataclass(frozen=True)
class ResourceHealth:
    """One entry for containerStatuses[].allocatedResourcesStatus: claim:<name>[/<request>] -> resources."""

    name: str
    resources: tuple[DeviceHealthEntry, ...]


@dataclass(frozen=True)
class DeviceHealthEntry:
    """One `resources[]` item: resourceID, Healthy|Unhealthy|Unknown, and the plugin's message (1.36+ gate)."""

    resource_id: str
    health: str
    message: str = ""

    def to_json(self) -> dict[str, str]:
        out = {"resourceID": self.resource_id, "health": self.health}
        if self.message:
            out["message"] = self.message
        return out


def merge_conditions(existing: Iterable[Mapping[str, Any]], ours: Iterable[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Replace conditions by type, keeping lastTransitionTime when a condition's status did not change."""
    out = [dict(c) for c in existing]
    for cond in ours:
        new = dict(cond)
        for i, old in enumerate(out):
            if old.get("type") == new["type"]:
                if old.get("status") == new.get("status") and old.get("lastTransitionTime"):
                    new["lastTransitionTime"] = old["lastTransitionTime"]
                out[i] = new
                break
        else:
            out.append(new)
    return out


def _condition(kind: str, status: bool, now: str, reason: str | None = None,
               message: str | None = None) -> dict[str, Any]:
    cond: dict[str, Any] = {"type": kind, "status": "True" if status else "False", "lastTransitionTime": now}
    if reason:
        cond["reason"] = reason
    if message:
        cond["message"] = message
    return cond


def pending_status(pod: PodView, reason: str, message: str, now: str) -> dict[str, Any]:
    """Status while the pod cannot start yet (claims not ready, or NodePrepareResources failed)."""
    return {
        "phase": "Pending",
        "conditions": merge_conditions(
            pod.conditions,
            [
                _condition("PodReadyToStartContainers", False, now, reason, message),
                _condition("Initialized", True, now),
                _condition("ContainersReady", False, now, "ContainersNotReady"),
                _condition("Ready", False, now, "ContainersNotReady"),
            ],
        ),
        "containerStatuses": [
            {"name": c.name, "image": c.image, "imageID": "", "ready": False, "restartCount": 0, "started": False,
             "state": {"waiting": {"reason": "ContainerCreating", "message": message}}}
            for c in pod.containers
        ],
    }


def started_phase(pod: PodView, outcomes: Iterable[ContainerOutcome]) -> str:
    """Running for restartPolicy Always (the containers stand for long-running ones); otherwise the outcome."""
    results = list(outcomes)
    if any(not o.ok for o in results):
        return "Failed"
    return "Running" if pod.restart_policy == "Always" else "Succeeded"


def init_failure(pod: PodView, outcomes: Iterable[ContainerOutcome]) -> ContainerOutcome | None:
    """The first init container that failed (the main containers then never start), or None."""
    results = {o.name: o for o in outcomes}
    for container in pod.init_containers:
        outcome = results.get(container.name)
        if outcome is not None and not outcome.ok:
            return outcome
    return None


def _init_statuses(pod: PodView, results: Mapping[str, ContainerOutcome], started_at: str,
                   now: str) -> list[dict[str, Any]]:
    out = []
    for container in pod.init_containers:
        outcome = results.get(container.name)
        status: dict[str, Any] = {"name": container.name, "image": container.image, "imageID": "",
                                  "restartCount": 0, "ready": False, "started": False}
        if outcome is None:  # never ran: an earlier init container failed
            status["state"] = {"waiting": {"reason": "PodInitializing"}}
        else:
            status["containerID"] = f"sandbox://{pod.uid}/{container.name}"
            terminated: dict[str, Any] = {"exitCode": outcome.exit_code,
                                          "reason": "Completed" if outcome.ok else "Error",
                                          "startedAt": started_at, "finishedAt": now}
            if outcome.error:
                terminated["message"] = outcome.error[:1024]
            status["ready"] = outcome.ok
            status["state"] = {"terminated": terminated}
        out.append(status)
    return out


def started_status(
    pod: PodView,
    outcomes: Iterable[ContainerOutcome],
    started_at: str,
    now: str,
    health: Mapping[str, tuple[ResourceHealth, ...]] | None = None,
) -> dict[str, Any]:
    """Status once the containers were started (init containers first, in order; the main ones only if all of
    them succeeded). `health`: container name -> allocatedResourcesStatus."""
    results = {o.name: o for o in outcomes}
    failed_init = init_failure(pod, results.values())
    phase = "Failed" if failed_init else started_phase(
        pod, [o for n, o in results.items() if n not in {c.name for c in pod.init_containers}])
    running = phase == "Running"
    statuses: list[dict[str, Any]] = []
    for container in pod.containers:
        outcome = results.get(container.name)
        status: dict[str, Any] = {
            "name": container.name,
            "image": container.image,
            "imageID": "",
            "containerID": f"sandbox://{pod.uid}/{container.name}",
            "restartCount": 0,
        }
        if running:
            status.update(ready=True, started=True, state={"running": {"startedAt": started_at}})
        elif failed_init is not None:
            status.update(ready=False, started=False, state={"waiting": {"reason": "PodInitializing"}})
        else:
            code = outcome.exit_code if outcome else 128
            reason = "Completed" if outcome and outcome.ok else ("StartError" if code == 128 else "Error")
            terminated: dict[str, Any] = {"exitCode": code, "reason": reason, "startedAt": started_at,
                                          "finishedAt": now}
            if outcome and outcome.error:
                terminated["message"] = outcome.error[:1024]
            status.update(ready=False, started=False, state={"terminated": terminated})
        entries = (health or {}).get(container.name, ())
        if entries:
            status["allocatedResourcesStatus"] = [
                {"name": e.name, "resources": [r.to_json() for r in e.resources]}
                for e in entries
            ]
        statuses.append(status)
    ready_reason = None if running else "PodCompleted"
    return {
        "phase": phase,
        "startTime": started_at,
        "conditions": merge_conditions(
            pod.conditions,
            [
                _condition("PodReadyToStartContainers", True, now),
                _condition("Initialized", failed_init is None, now, ready_reason),
                _condition("ContainersReady", running, now, ready_reason),
                _condition("Ready", running, now, ready_reason),
            ],
        ),
        "containerStatuses": statuses,
        **({"initContainerStatuses": _init_statuses(pod, results, started_at, now)} if pod.init_containers else {}),
    }


def health_entries(
    container: ContainerView,
    claims: Mapping[str, ClaimView],
    prepared: Mapping[str, Mapping[str, tuple[PreparedDevice, ...]]],
    health_of: Callable[[str, str, str], tuple[str, str]],
    with_message: bool = True,
) -> tuple[ResourceHealth, ...]:
    """allocatedResourcesStatus for one container, as UpdateAllocatedResourcesStatus (pkg/kubelet/cm/dra/manager.go)
    builds it: one entry per claim reference, named claim:<name>[/<request>], with the devices of that request;
    resourceID is the device's first CDI id, else <driver>/<pool>/<device> (buildResourceHealth); repeated
    resourceIDs are listed once; entries without devices are left out. `health_of(driver, pool, device)` ->
    (health, message); the message only with the ResourceHealthStatusMessage gate (`with_message`)."""
    out: list[ResourceHealth] = []
    for use in container.claims:
        claim = claims.get(use.name)
        if claim is None:
            continue
        resources: list[DeviceHealthEntry] = []
        seen: set[str] = set()
        for driver, devices in prepared.get(claim.ref.uid, {}).items():
            for device in devices:
                if not _serves(device, use.request):
                    continue
                fallback = f"{driver}/{device.pool}/{device.device}"
                rid = device.cdi_device_ids[0] if device.cdi_device_ids else fallback
                if rid in seen:
                    continue
                seen.add(rid)
                health, message = health_of(driver, device.pool, device.device)
                resources.append(DeviceHealthEntry(rid, health, message if with_message else ""))
        # The name uses the container's claim reference (the pod-level claim name), as the API requires.
        name = f"claim:{use.name}" + (f"/{use.request}" if use.request else "")
        if resources:
            out.append(ResourceHealth(name, tuple(resources)))
    return tuple(out)
