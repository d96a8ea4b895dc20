"""The DaemonSet controller's pure decisions (kube-controller-manager's, reduced): which nodes should run a
daemon pod, what that pod looks like, which pods to create and delete, and the status counters.

Upstream (kubernetes/kubernetes):
- `pkg/controller/daemon/daemon_controller.go`: `NodeShouldRunDaemonPod` + `predicates` (the node name, the
  pod's required node affinity and nodeSelector (`nodeaffinity.GetRequiredNodeAffinity(pod).Match(node)`), and
  the node's taints against the pod's tolerations: an untolerated NoSchedule or NoExecute taint means "should not
  run", only an untolerated NoExecute one means "should not continue running"), `podsShouldBeOnNode` (pods
  being deleted are skipped; failed and succeeded pods are deleted; no pod -> create one; several -> keep the
  oldest), `updateDaemonSetStatus` (desired/current/misscheduled/ready/available/updated counters,
  observedGeneration).
- `pkg/controller/daemon/util/daemonset_util.go`: `AddOrUpdateDaemonPodTolerations` (not-ready and unreachable
  NoExecute, disk/memory/pid-pressure and unschedulable NoSchedule, network-unavailable NoSchedule for host
  network pods), `CreatePodTemplate` (labels `controller-revision-hash` and `pod-template-generation`),
  `ReplaceDaemonSetPodNodeNameNodeAffinity` (the required terms become ONE term `matchFields metadata.name In
  [node]`, so the default scheduler binds the pod exactly there), `IsPodUpdated`.
- `pkg/controller/daemon/update.go`: RollingUpdate replaces old pods at most `maxUnavailable` unavailable nodes at
  a time (maxSurge is not modelled: the sandbox deletes first, then creates); OnDelete replaces none.

What differs (docs/sandbox.md "DaemonSet controller"): no ControllerRevision objects (the revision hash is the
sandbox's own hash of the template), no failed-pod backoff, no maxSurge.
"""

from __future__ import annotations

import copy
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Final

REVISION_HASH_LABEL: Final = "controller-revision-hash"
TEMPLATE_GENERATION_LABEL: Final = "pod-template-generation"

# AddOrUpdateDaemonPodTolerations (daemonset_util.go): key -> effect.
DAEMON_TOLERATIONS: Final = (
    ("node.kubernetes.io/not-ready", "NoExecute"),
    ("node.kubernetes.io/unreachable", "NoExecute"),
    ("node.kubernetes.io/disk-pressure", "NoSchedule"),
    ("node.kubernetes.io/memory-pressure", "NoSchedule"),
    ("node.kubernetes.io/pid-pressure", "NoSchedule"),
    ("node.kubernetes.io/unschedulable", "NoSchedule"),
)
HOST_NETWORK_TOLERATION: Final = ("node.kubernetes.io/network-unavailable", "NoSchedule")


def _meta(obj: Mapping[str, Any]) -> Mapping[str, Any]:
    value = obj.get("metadata")
    return value if isinstance(value, Mapping) else {}


def add_daemon_tolerations(spec: dict[str, Any]) -> None:
    """AddOrUpdateDaemonPodTolerations: every daemon pod tolerates the node-condition taints (operator Exists), so
    a cordoned or not-ready node keeps (and gets) its daemon; an existing toleration of the same key and effect is
    replaced, as upstream's AddOrUpdateTolerationInPodSpec does."""
    wanted = list(DAEMON_TOLERATIONS) + ([HOST_NETWORK_TOLERATION] if spec.get("hostNetwork") else [])
    tolerations = [t for t in spec.get("tolerations") or [] if isinstance(t, Mapping)]
    for key, effect in wanted:
        new = {"key": key, "operator": "Exists", "effect": effect}
        for i, t in enumerate(tolerations):
            if t.get("key") == key and t.get("effect") == effect:
                tolerations[i] = new
                break
        else:
            tolerations.append(new)
    spec["tolerations"] = tolerations


@dataclass(frozen=True)
class NodeVerdict:
    should_run: bool
    should_continue_running: bool


def node_verdict(pod_spec: Mapping[str, Any], node: Mapping[str, Any]) -> NodeVerdict:
    """NodeShouldRunDaemonPod's `predicates` for the pod the DaemonSet would make for `node`."""
    from dra_sandbox.nodefilters import node_affinity, untolerated_taint

    node_name = str(_meta(node).get("name") or "")
    fits_name = not pod_spec.get("nodeName") or pod_spec.get("nodeName") == node_name
    fits_affinity = node_affinity({"spec": pod_spec}, node) is None
    taints = list((node.get("spec") or {}).get("taints") or [])
    tolerations = list(pod_spec.get("tolerations") or [])
    schedulable = untolerated_taint(taints, tolerations, frozenset({"NoSchedule", "NoExecute"})) is None
    may_stay = untolerated_taint(taints, tolerations, frozenset({"NoExecute"})) is None
    return NodeVerdict(fits_name and fits_affinity and schedulable, fits_name and fits_affinity and may_stay)


def pod_template_for(ds: Mapping[str, Any], revision_hash: str) -> dict[str, Any]:
    """CreatePodTemplate: the template with the daemon tolerations and the revision labels."""
    template = copy.deepcopy((ds.get("spec") or {}).get("template") or {})
    tmeta = template.setdefault("metadata", {})
    labels = dict(tmeta.get("labels") or {})
    labels[TEMPLATE_GENERATION_LABEL] = str(_meta(ds).get("generation") or 1)
    labels[REVISION_HASH_LABEL] = revision_hash
    tmeta["labels"] = labels
    spec = template.setdefault("spec", {})
    add_daemon_tolerations(spec)
    return template


def pin_to_node(spec: dict[str, Any], node_name: str) -> None:
    """ReplaceDaemonSetPodNodeNameNodeAffinity: required node affinity = one term `metadata.name In [node]`
    (the template's required terms were checked by the controller already); preferred terms stay."""
    affinity = spec.setdefault("affinity", {})
    node_affinity = affinity.setdefault("nodeAffinity", {})
    node_affinity["requiredDuringSchedulingIgnoredDuringExecution"] = {"nodeSelectorTerms": [{
        "matchFields": [{"key": "metadata.name", "operator": "In", "values": [node_name]}]}]}


def _phase(pod: Mapping[str, Any]) -> str:
    return str((pod.get("status") or {}).get("phase") or "Pending")


def parse_time(text: str) -> datetime:
    """An RFC 3339 metav1.Time (`...Z`) as an aware datetime; ValueError when it is none."""
    return datetime.fromisoformat(text.replace("Z", "+00:00"))


def pod_ready_since(pod: Mapping[str, Any]) -> str | None:
    """The Ready condition's lastTransitionTime when the pod is Ready, else None."""
    for cond in (pod.get("status") or {}).get("conditions") or []:
        if isinstance(cond, Mapping) and cond.get("type") == "Ready":
            return str(cond.get("lastTransitionTime") or "") if cond.get("status") == "True" else None
    return None


@dataclass(frozen=True)
class NodePlan:
    """What podsShouldBeOnNode decides for one node."""

    create: bool = False
    delete: tuple[Mapping[str, Any], ...] = ()
    # The pod counted for the node (the oldest running one), for the status.
    pod: Mapping[str, Any] | None = None


def plan_node(verdict: NodeVerdict, pods: Sequence[Mapping[str, Any]]) -> NodePlan:
    live = [p for p in pods if not _meta(p).get("deletionTimestamp")]
    if verdict.should_run:
        finished = [p for p in live if _phase(p) in ("Failed", "Succeeded")]
        running = sorted((p for p in live if _phase(p) not in ("Failed", "Succeeded")),
                         key=lambda p: (str(_meta(p).get("creationTimestamp") or ""), str(_meta(p).get("name"))))
        if not running:
            return NodePlan(create=True, delete=tuple(finished))
        return NodePlan(delete=tuple(finished + running[1:]), pod=running[0])
    if not verdict.should_continue_running:
        return NodePlan(delete=tuple(live))
    # Should not get a new pod, but the one it has may stay (an untolerated NoSchedule taint only).
    running = [p for p in live if _phase(p) not in ("Failed", "Succeeded")]
    return NodePlan(pod=running[0] if running else None)


def max_unavailable(ds: Mapping[str, Any], desired: int) -> int:
    """RollingUpdate's maxUnavailable as a count (a percentage rounds up, as intstr.GetScaledValueFromIntOrPercent
    does with roundUp=true in update.go); at least 1 where there is something to update."""
    strategy = (ds.get("spec") or {}).get("updateStrategy") or {}
    value = (strategy.get("rollingUpdate") or {}).get("maxUnavailable", 1)
    if isinstance(value, str) and value.endswith("%"):
        try:
            return max(1, math.ceil(int(value[:-1]) * desired / 100))
        except ValueError:
            return 1
    return max(1, value) if isinstance(value, int) else 1


@dataclass(frozen=True)
class DaemonStatus:
    desired: int = 0
    current: int = 0
    misscheduled: int = 0
    ready: int = 0
    available: int = 0
    updated: int = 0
    unavailable_nodes: tuple[str, ...] = field(default_factory=tuple)

    def to_json(self, generation: Any) -> dict[str, Any]:
        """DaemonSetStatus; the four required counters always, the optional ones only when non-zero (omitempty)."""
        out: dict[str, Any] = {
            "currentNumberScheduled": self.current,
            "numberMisscheduled": self.misscheduled,
            "desiredNumberScheduled": self.desired,
            "numberReady": self.ready,
            "observedGeneration": generation,
        }
        if self.updated:
            out["updatedNumberScheduled"] = self.updated
        if self.available:
            out["numberAvailable"] = self.available
        if self.desired - self.available > 0:
            out["numberUnavailable"] = self.desired - self.available
        return out
