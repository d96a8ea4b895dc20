"""kube-scheduler's node filters before NodeResourcesFit: NodeUnschedulable, TaintToleration, NodeAffinity. Pure.

Each returns the reason kube-scheduler's plugin gives for a node it rejects (all three reject as
UnschedulableAndUnresolvable: preemption cannot help), or None. Upstream (kubernetes/kubernetes):
`pkg/scheduler/framework/plugins/nodeunschedulable/node_unschedulable.go`,
`pkg/scheduler/framework/plugins/tainttoleration/taint_toleration.go`,
`pkg/scheduler/framework/plugins/nodeaffinity/node_affinity.go` (PreFilter and Filter),
`k8s.io/component-helpers/scheduling/corev1` (`FindMatchingUntoleratedTaint`, `GetRequiredNodeAffinity`) and
`k8s.io/api/core/v1/toleration.go` (`ToleratesTaint`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from dra_driver.allocation.model import parse_node
from dra_driver.allocation.nodes import node_selector_matches

TAINT_NODE_UNSCHEDULABLE = "node.kubernetes.io/unschedulable"
UNSCHEDULABLE = "node(s) were unschedulable"
# Since kubernetes/kubernetes PR 134740 (1.35, cherry-picked to 1.34 as PR 135023) the reason no longer names the
# taint's key and value (`node(s) had untolerated taint {key: value}` before).
UNTOLERATED_TAINT = "node(s) had untolerated taint(s)"
NODE_AFFINITY_MISMATCH = "node(s) didn't match Pod's node affinity/selector"
# NodeAffinity's PreFilter: every term pins `metadata.name` to names that no term can satisfy.
AFFINITY_TERMS_CONFLICT = "pod affinity terms conflict"
# schedule_one.go findNodesThatFitPod: the status of nodes a PreFilter result leaves out.
OUTSIDE_PREFILTER_RESULT = "node(s) didn't satisfy plugin(s) [NodeAffinity]"
DO_NOT_SCHEDULE_EFFECTS = frozenset({"NoSchedule", "NoExecute"})


def tolerates(toleration: Mapping[str, Any], taint: Mapping[str, Any]) -> bool:
    """core/v1 Toleration.ToleratesTaint: an empty effect matches every effect, an empty key every key; operator
    Exists ignores the value, Equal (or empty) compares it; any other operator tolerates nothing (the alpha Gt/Lt
    operators of TaintTolerationComparisonOperators are off by default)."""
    effect = toleration.get("effect") or ""
    if effect and effect != taint.get("effect"):
        return False
    key = toleration.get("key") or ""
    if key and key != taint.get("key"):
        return False
    operator = toleration.get("operator") or "Equal"
    if operator == "Exists":
        return True
    if operator == "Equal":
        return (toleration.get("value") or "") == (taint.get("value") or "")
    return False


def _tolerations(pod: Mapping[str, Any]) -> Sequence[Mapping[str, Any]]:
    return list((pod.get("spec") or {}).get("tolerations") or [])


def untolerated_taint(
    taints: Sequence[Mapping[str, Any]], tolerations: Sequence[Mapping[str, Any]], effects: frozenset[str]
) -> Mapping[str, Any] | None:
    """FindMatchingUntoleratedTaint: the first taint with one of `effects` that no toleration tolerates."""
    for taint in taints:
        if taint.get("effect") in effects and not any(tolerates(t, taint) for t in tolerations):
            return taint
    return None


def node_unschedulable(pod: Mapping[str, Any], node: Mapping[str, Any]) -> str | None:
    """`spec.unschedulable` (kubectl cordon) rejects the pod unless it tolerates node.kubernetes.io/unschedulable
    with effect NoSchedule."""
    if not (node.get("spec") or {}).get("unschedulable"):
        return None
    taint = {"key": TAINT_NODE_UNSCHEDULABLE, "effect": "NoSchedule"}
    return None if any(tolerates(t, taint) for t in _tolerations(pod)) else UNSCHEDULABLE


def taint_toleration(pod: Mapping[str, Any], node: Mapping[str, Any]) -> str | None:
    taints = list((node.get("spec") or {}).get("taints") or [])
    found = untolerated_taint(taints, _tolerations(pod), DO_NOT_SCHEDULE_EFFECTS)
    return None if found is None else UNTOLERATED_TAINT


def _required_terms(pod: Mapping[str, Any]) -> list[Mapping[str, Any]] | None:
    """requiredDuringSchedulingIgnoredDuringExecution.nodeSelectorTerms, None when the pod sets no required
    node affinity."""
    affinity = (((pod.get("spec") or {}).get("affinity") or {}).get("nodeAffinity") or {})
    required = affinity.get("requiredDuringSchedulingIgnoredDuringExecution")
    if required is None:
        return None
    return list(required.get("nodeSelectorTerms") or [])


def node_affinity(pod: Mapping[str, Any], node: Mapping[str, Any]) -> str | None:
    """GetRequiredNodeAffinity(pod).Match(node): every `spec.nodeSelector` label, and (when set) one of the
    required terms (ORed; inside a term everything must hold; an empty or unparsable term matches nothing)."""
    wanted = (pod.get("spec") or {}).get("nodeSelector") or {}
    labels = (node.get("metadata") or {}).get("labels") or {}
    if not all(labels.get(k) == v for k, v in wanted.items()):
        return NODE_AFFINITY_MISMATCH
    terms = _required_terms(pod)
    if terms is not None and not node_selector_matches({"nodeSelectorTerms": terms}, parse_node(node)):
        return NODE_AFFINITY_MISMATCH
    return None


@dataclass(frozen=True)
class AffinityPreFilter:
    """NodeAffinity's PreFilter: the node names the required terms pin (None: every node), or the conflict."""

    names: frozenset[str] | None = None
    conflict: bool = False


def node_affinity_prefilter(pod: Mapping[str, Any]) -> AffinityPreFilter:
    """When every required term has `matchFields` `metadata.name In [...]` requirements, only the union over the
    terms of each term's intersection can match; an empty union is a conflict."""
    terms = _required_terms(pod)
    if not terms:
        return AffinityPreFilter()
    union: set[str] = set()
    for term in terms:
        names: set[str] | None = None
        for req in term.get("matchFields") or []:
            if req.get("key") == "metadata.name" and req.get("operator") == "In":
                values = {str(v) for v in req.get("values") or []}
                names = values if names is None else names & values
        if names is None:
            return AffinityPreFilter()  # a term without a name requirement lets every node through
        union |= names
    return AffinityPreFilter(conflict=True) if not union else AffinityPreFilter(frozenset(union))
