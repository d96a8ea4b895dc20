"""The kubelet's pod admission (GeneralPredicates and the NoExecute taint check). Pure.

A pod reaches a kubelet once its `spec.nodeName` names the node, whether kube-scheduler bound it or someone set
the field by hand. Before running it the kubelet checks it against the node and the pods it already admitted,
with the scheduler's own filter code, and rejects a pod that does not fit: phase Failed, the reason and
`Pod was rejected: <message>`, and a Warning event. Facts from kubernetes/kubernetes (1.34-1.37):

- `pkg/kubelet/lifecycle/predicate.go` (`predicateAdmitHandler.Admit`, `generalFilter`,
  `removeMissingExtendedResources`, `InsufficientResourceError`, `PredicateFailureError`): the order of the checks,
  the reasons (`OutOfcpu`, `OutOfmemory`, `OutOfephemeral-storage`, `OutOfpods`, `OutOf<name>`, the plugin name
  for a predicate) and messages; extended resources the node does not list in `allocatable` (cluster-level or
  DRA-backed ones) are not checked; only the first failure is reported.
- `pkg/scheduler/schedule_one.go` `AdmissionCheck`: NodeResourcesFit (`noderesources.Fits`), NodeAffinity
  (`GetRequiredNodeAffinity(pod).Match`), NodeName, NodePorts, in that order, every failure collected.
- `pkg/kubelet/kubelet.go` `rejectPod`: the status and event written.

The resource and affinity checks are the scheduler stand-in's (`dra_sandbox.noderesources`, `.nodefilters`), so
the two cannot disagree.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from dra_sandbox.nodefilters import NODE_AFFINITY_MISMATCH, node_affinity, untolerated_taint
from dra_sandbox.noderesources import CPU, EPHEMERAL_STORAGE, MEMORY, PODS, NodeUsage, fits, pod_requests

REJECTED_PREFIX = "Pod was rejected: "
LABEL_OS = "kubernetes.io/os"
NODE_OS = "linux"  # runtime.GOOS of every sandbox kubelet
# pkg/scheduler/framework/plugins/tainttoleration: the constant the kubelet reports (the scheduler's Filter
# words its own reason differently).
TAINT_NOT_TOLERATED = "node(s) had taints that the pod didn't tolerate"
NODE_NAME_MISMATCH = "node(s) didn't match the requested node name"
PORTS_TAKEN = "node(s) didn't have free ports for the requested pod ports"
ANY_IP = "0.0.0.0"  # noqa: S104  # a pod port's default hostIP, compared, never bound
_OUT_OF = {CPU: "OutOfcpu", MEMORY: "OutOfmemory", EPHEMERAL_STORAGE: "OutOfephemeral-storage", PODS: "OutOfpods"}


@dataclass(frozen=True)
class Admission:
    """PodAdmitResult: admitted, or the reason and message of the first failure."""

    admit: bool
    reason: str = ""
    message: str = ""


ADMITTED = Admission(True)


def _predicate(name: str, description: str) -> Admission:
    return Admission(False, name, f"Predicate {name} failed: {description}")


def is_extended_resource(name: str) -> bool:
    """core/v1 helper IsExtendedResourceName: a domain-prefixed name outside `kubernetes.io/`, not `requests.*`."""
    return "/" in name and "kubernetes.io/" not in name and not name.startswith("requests.")


def _dra_backed(pod: Mapping[str, Any]) -> set[tuple[str, str]]:
    """(resource name, container name) pairs the pod's extended-resource claim serves (KEP-5004)."""
    status = ((pod.get("status") or {}).get("extendedResourceClaimStatus") or {})
    return {(str(m.get("resourceName")), str(m.get("containerName"))) for m in status.get("requestMappings") or []}


def without_missing_extended_resources(pod: Mapping[str, Any], node: Mapping[str, Any]) -> dict[str, Any]:
    """removeMissingExtendedResources: a copy of the pod whose containers no longer ask for extended resources the
    node does not list in `allocatable` or that the pod's DRA claim serves."""
    allocatable = (node.get("status") or {}).get("allocatable") or {}
    backed = _dra_backed(pod)

    def keep(name: str, container: str) -> bool:
        if not is_extended_resource(name):
            return True
        return name in allocatable and (name, container) not in backed

    def filtered(container: Mapping[str, Any]) -> dict[str, Any]:
        resources = dict(container.get("resources") or {})
        for part in ("requests", "limits"):  # limits stand for requests where none are given (API defaulting)
            if part in resources:
                values = resources[part] or {}
                resources[part] = {k: v for k, v in values.items() if keep(str(k), str(container.get("name")))}
        return {**container, "resources": resources}

    spec = dict(pod.get("spec") or {})
    for key in ("containers", "initContainers"):
        if key in spec:
            spec[key] = [filtered(c) for c in spec[key] or []]
    return {**pod, "spec": spec}


def _host_ports(pod: Mapping[str, Any]) -> list[tuple[str, str, int]]:
    """(hostIP, protocol, hostPort) of the pod's containers' ports with a hostPort (NodePorts' getContainerPorts)."""
    out: list[tuple[str, str, int]] = []
    for container in (pod.get("spec") or {}).get("containers") or []:
        for port in container.get("ports") or []:
            number = port.get("hostPort") or 0
            if isinstance(number, int) and number > 0:
                out.append((port.get("hostIP") or ANY_IP, port.get("protocol") or "TCP", number))
    return out


def _ports_conflict(wanted: Sequence[tuple[str, str, int]], used: Sequence[tuple[str, str, int]]) -> bool:
    """HostPortInfo.CheckConflict: the same protocol and port on the same IP, or with 0.0.0.0 on either side."""
    for ip, protocol, port in wanted:
        for used_ip, used_protocol, used_port in used:
            same_socket = protocol == used_protocol and port == used_port
            if same_socket and (ip == used_ip or ANY_IP in (ip, used_ip)):
                return True
    return False


def _resource_failure(name: str, requested: int, used: int, capacity: int) -> Admission:
    reason = _OUT_OF.get(name, f"OutOf{name}")
    message = f"Node didn't have enough resource: {name}, requested: {requested}, used: {used}, capacity: {capacity}"
    return Admission(False, reason, message)


def admit(pod: Mapping[str, Any], node: Mapping[str, Any], admitted: Sequence[Mapping[str, Any]]) -> Admission:
    """Whether a kubelet on `node` that already admitted the active pods `admitted` admits `pod`."""
    labels = (pod.get("metadata") or {}).get("labels") or {}
    if LABEL_OS in labels and labels[LABEL_OS] != NODE_OS:
        return Admission(False, "PodOSSelectorNodeLabelDoesNotMatch",
                         "Failed to admit pod as the `kubernetes.io/os` label doesn't match node label")
    spec = pod.get("spec") or {}
    os_name = (spec.get("os") or {}).get("name")
    if os_name and os_name != NODE_OS:
        return Admission(False, "PodOSNotSupported", "Failed to admit pod as the OS field doesn't match node OS")
    policy = ((spec.get("securityContext") or {}).get("supplementalGroupsPolicy"))
    features = (node.get("status") or {}).get("features") or {}
    if policy == "Strict" and not features.get("supplementalGroupsPolicy"):
        return Admission(False, "SupplementalGroupsPolicyNotSupported",
                         "SupplementalGroupsPolicy=Strict is not supported in this node")

    checked = without_missing_extended_resources(pod, node)
    failures: list[Admission] = []
    fit = fits(pod_requests(checked), node, NodeUsage.of(admitted))
    failures += [_resource_failure(i.name, i.requested, i.used, i.capacity) for i in fit.insufficient]
    if node_affinity(checked, node) == NODE_AFFINITY_MISMATCH:
        failures.append(_predicate("NodeAffinity", NODE_AFFINITY_MISMATCH))
    node_name = (node.get("metadata") or {}).get("name")
    if spec.get("nodeName") and spec.get("nodeName") != node_name:
        failures.append(_predicate("NodeName", NODE_NAME_MISMATCH))
    if _ports_conflict(_host_ports(pod), [p for other in admitted for p in _host_ports(other)]):
        failures.append(_predicate("NodePorts", PORTS_TAKEN))
    taints = list((node.get("spec") or {}).get("taints") or [])
    # Static pods skip this check; every sandbox pod comes from the API server.
    if untolerated_taint(taints, list(spec.get("tolerations") or []), frozenset({"NoExecute"})) is not None:
        failures.append(_predicate("TaintToleration", TAINT_NOT_TOLERATED))
    return failures[0] if failures else ADMITTED


def rejected_status(admission: Admission) -> dict[str, Any]:
    """rejectPod's status: phase Failed with the reason and `Pod was rejected: <message>`."""
    return {"phase": "Failed", "reason": admission.reason, "message": REJECTED_PREFIX + admission.message}
