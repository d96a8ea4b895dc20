"""The node lifecycle controller of kube-controller-manager, as far as scheduling sees it.

Upstream: kubernetes/kubernetes `pkg/controller/nodelifecycle/node_lifecycle_controller.go` (`monitorNodeHealth`,
`tryUpdateNodeHealth`, `doNoScheduleTaintingPass`, `processTaintBaseEviction`), defaults in
`pkg/controller/nodelifecycle/config/v1alpha1/defaults.go` (`--node-monitor-period` 5 s,
`--node-monitor-grace-period` 50 s since 1.32, kubernetes/kubernetes PR 126287; 40 s before).

Every monitor period the controller reads each Node and its Lease in `kube-node-lease`. The last time it SAW the
Ready condition's `lastHeartbeatTime` or the Lease's `renewTime` change is the node's probe time (its own clock,
not the timestamps' values). A node whose probe time is older than the grace period has its Ready, MemoryPressure,
DiskPressure and PIDPressure conditions set to Unknown (reason `NodeStatusUnknown`, message `Kubelet stopped posting
node status.`, `lastTransitionTime` now, `lastHeartbeatTime` kept). Taints follow the conditions (TaintNodesByCondition
and taint-based eviction): Ready Unknown -> `node.kubernetes.io/unreachable` NoSchedule and NoExecute (the latter with
`timeAdded`), Ready False -> `node.kubernetes.io/not-ready` likewise, pressure conditions True -> their NoSchedule
taints, `spec.unschedulable` -> `node.kubernetes.io/unschedulable:NoSchedule`; taints no longer called for are removed
(a kubelet that posts Ready again gets its node back).

Not simulated: evicting pods from tainted nodes (the taint-eviction controller), marking their pods NotReady, zone
disruption rate limits, the 60 s startup grace period of a node that never posted Ready.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import structlog

from dra_driver.commands.listing import list_all
from dra_driver.k8s.client import ApiError, JsonObject, KubeRest
from dra_sandbox.loopthread import LoopThread
from dra_sandbox.rest import merge_patch

log = structlog.get_logger(__name__)

NODE_MONITOR_GRACE_PERIOD_S = 50.0
NODE_MONITOR_PERIOD_S = 5.0
LEASE_NAMESPACE = "kube-node-lease"
UNKNOWN_REASON = "NodeStatusUnknown"
UNKNOWN_MESSAGE = "Kubelet stopped posting node status."
NEVER_UPDATED_REASON = "NodeStatusNeverUpdated"
NEVER_UPDATED_MESSAGE = "Kubelet never posted node status."
MONITORED_CONDITIONS = ("Ready", "MemoryPressure", "DiskPressure", "PIDPressure")

TAINT_UNREACHABLE = "node.kubernetes.io/unreachable"
TAINT_NOT_READY = "node.kubernetes.io/not-ready"
TAINT_UNSCHEDULABLE = "node.kubernetes.io/unschedulable"
# nodeConditionToTaintKeyStatusMap: condition -> status -> NoSchedule taint key.
CONDITION_TAINTS: Mapping[str, Mapping[str, str]] = {
    "Ready": {"False": TAINT_NOT_READY, "Unknown": TAINT_UNREACHABLE},
    "MemoryPressure": {"True": "node.kubernetes.io/memory-pressure"},
    "DiskPressure": {"True": "node.kubernetes.io/disk-pressure"},
    "NetworkUnavailable": {"True": "node.kubernetes.io/network-unavailable"},
    "PIDPressure": {"True": "node.kubernetes.io/pid-pressure"},
}
NO_SCHEDULE_KEYS = frozenset({*(k for m in CONDITION_TAINTS.values() for k in m.values()), TAINT_UNSCHEDULABLE})
NO_EXECUTE_KEYS = frozenset({TAINT_UNREACHABLE, TAINT_NOT_READY})


def timestamp(seconds: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(seconds))


@dataclass
class NodeHealth:
    """What the controller remembers of one node (nodeHealthData)."""

    probe: float  # controller clock when a heartbeat or lease renewal was last seen
    heartbeat: str | None = None  # the Ready condition's lastHeartbeatTime then
    renew: str | None = None  # the Lease's renewTime then


@dataclass(frozen=True)
class NodeUpdate:
    """What to write for one node: the new status conditions and/or spec taints (None: leave as is)."""

    conditions: list[dict[str, Any]] | None = None
    taints: list[dict[str, Any]] | None = None


def _conditions(node: Mapping[str, Any]) -> list[dict[str, Any]]:
    return [dict(c) for c in (node.get("status") or {}).get("conditions") or []]


def _ready(node: Mapping[str, Any]) -> Mapping[str, Any] | None:
    return next((c for c in _conditions(node) if c.get("type") == "Ready"), None)


def observe(health: NodeHealth | None, node: Mapping[str, Any], lease: Mapping[str, Any] | None,
            now: float) -> NodeHealth:
    """The node's health record after seeing `node` and its `lease` at `now` (controller clock). Pure."""
    ready = _ready(node)
    heartbeat = str(ready.get("lastHeartbeatTime")) if ready else None
    renew = str((lease or {}).get("spec", {}).get("renewTime") or "") or None
    if health is None:
        return NodeHealth(now, heartbeat, renew)
    if heartbeat != health.heartbeat or (renew is not None and renew != health.renew):
        return NodeHealth(now, heartbeat, renew)
    return health


def unknown_conditions(node: Mapping[str, Any], wall: float) -> list[dict[str, Any]] | None:
    """The conditions with every monitored one Unknown, or None when they already are (tryUpdateNodeHealth)."""
    conditions = _conditions(node)
    by_type = {c.get("type"): c for c in conditions}
    changed = False
    for kind in MONITORED_CONDITIONS:
        current = by_type.get(kind)
        if current is None:
            conditions.append({"type": kind, "status": "Unknown", "reason": NEVER_UPDATED_REASON,
                               "message": NEVER_UPDATED_MESSAGE, "lastHeartbeatTime": timestamp(wall),
                               "lastTransitionTime": timestamp(wall)})
            changed = True
        elif current.get("status") != "Unknown":
            current.update({"status": "Unknown", "reason": UNKNOWN_REASON, "message": UNKNOWN_MESSAGE,
                            "lastTransitionTime": timestamp(wall)})
            changed = True
    return conditions if changed else None


def wanted_taints(node: Mapping[str, Any], wall: float) -> list[dict[str, Any]] | None:
    """The node's taints with the controller's own set as its conditions call for (others kept in place), or None
    when nothing changes (doNoScheduleTaintingPass, processTaintBaseEviction)."""
    current = [dict(t) for t in (node.get("spec") or {}).get("taints") or []]
    statuses = {str(c.get("type")): str(c.get("status")) for c in _conditions(node)}
    no_schedule = {key for kind, keys in CONDITION_TAINTS.items() if (key := keys.get(statuses.get(kind, ""), ""))}
    if (node.get("spec") or {}).get("unschedulable"):
        no_schedule.add(TAINT_UNSCHEDULABLE)
    ready = statuses.get("Ready")
    no_execute = {TAINT_UNREACHABLE} if ready == "Unknown" else {TAINT_NOT_READY} if ready == "False" else set()

    def managed(taint: Mapping[str, Any]) -> bool:
        return (taint.get("effect") == "NoSchedule" and taint.get("key") in NO_SCHEDULE_KEYS) or (
            taint.get("effect") == "NoExecute" and taint.get("key") in NO_EXECUTE_KEYS)

    def wanted(taint: Mapping[str, Any]) -> bool:
        keys = no_schedule if taint.get("effect") == "NoSchedule" else no_execute
        return taint.get("key") in keys

    kept = [t for t in current if not managed(t) or wanted(t)]
    have = {(t.get("key"), t.get("effect")) for t in kept}
    added = [{"key": key, "effect": "NoSchedule"} for key in sorted(no_schedule) if (key, "NoSchedule") not in have]
    added += [{"key": key, "effect": "NoExecute", "timeAdded": timestamp(wall)} for key in sorted(no_execute)
              if (key, "NoExecute") not in have]
    result = kept + added
    return result if result != current else None


def plan_node(node: Mapping[str, Any], health: NodeHealth, now: float, wall: float, grace_s: float) -> NodeUpdate:
    """What the controller writes for one node this period. Pure."""
    conditions = unknown_conditions(node, wall) if now - health.probe > grace_s else None
    seen = {**node, "status": {**(node.get("status") or {}), "conditions": conditions}} if conditions else node
    return NodeUpdate(conditions, wanted_taints(seen, wall))


@dataclass
class NodeLifecycleController:
    """Runs `plan_node` for every Node each `monitor_period_s` and writes what it returns."""

    rest: KubeRest
    grace_period_s: float = NODE_MONITOR_GRACE_PERIOD_S
    monitor_period_s: float = NODE_MONITOR_PERIOD_S
    clock: Callable[[], float] = time.monotonic
    wall: Callable[[], float] = time.time
    _health: dict[str, NodeHealth] = field(default_factory=dict)
    _worker: LoopThread = field(init=False)

    def __post_init__(self) -> None:
        self._worker = LoopThread(self._run, "node-lifecycle-controller")

    def start(self) -> None:
        self._worker.start()

    def stop(self) -> None:
        self._worker.stop()

    def _run(self) -> None:
        while not self._worker.stopping.is_set():
            try:
                self.monitor()
            except ApiError as exc:
                log.warning("node lifecycle controller: API error", error=str(exc))
            except Exception:
                log.exception("node lifecycle controller failed")
            self._worker.stopping.wait(self.monitor_period_s)

    def monitor(self) -> None:
        """One pass (monitorNodeHealth)."""
        nodes = list_all(self.rest, "/api/v1/nodes")
        leases = {str(lease["metadata"]["name"]): lease
                  for lease in list_all(self.rest, f"/apis/coordination.k8s.io/v1/namespaces/{LEASE_NAMESPACE}/leases")}
        now, wall = self.clock(), self.wall()
        names = {str(n["metadata"]["name"]) for n in nodes}
        for gone in set(self._health) - names:
            del self._health[gone]
        for node in nodes:
            name = str(node["metadata"]["name"])
            health = self._health[name] = observe(self._health.get(name), node, leases.get(name), now)
            self._write(node, plan_node(node, health, now, wall, self.grace_period_s))

    def _write(self, node: JsonObject, update: NodeUpdate) -> None:
        name = node["metadata"]["name"]
        try:
            if update.conditions is not None:
                merge_patch(self.rest, f"/api/v1/nodes/{name}/status", {"status": {"conditions": update.conditions}})
                log.info("node status unknown", node=name, reason=UNKNOWN_REASON)
            if update.taints is not None:
                merge_patch(self.rest, f"/api/v1/nodes/{name}", {"spec": {"taints": update.taints}})
                log.info("node taints updated", node=name, taints=[f"{t['key']}:{t['effect']}" for t in update.taints])
        except ApiError as exc:
            if not exc.not_found:
                raise


def controller_taints(node: Mapping[str, Any]) -> Sequence[Mapping[str, Any]]:
    """The node's taints that this controller manages (for tests and `dra-sandbox` output)."""
    return [t for t in (node.get("spec") or {}).get("taints") or []
            if (t.get("effect") == "NoSchedule" and t.get("key") in NO_SCHEDULE_KEYS)
            or (t.get("effect") == "NoExecute" and t.get("key") in NO_EXECUTE_KEYS)]
