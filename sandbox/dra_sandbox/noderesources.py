"""kube-scheduler's NodeResourcesFit filter and DefaultPreemption's verdict, for the scheduler stand-in. Pure.

Facts from kubernetes/kubernetes (1.34-1.37):
- `pkg/scheduler/framework/plugins/noderesources/fit.go` (`fitsRequest`): a node fails with "Too many pods" when
  its pods plus this one exceed `allocatable.pods`, "Insufficient cpu|memory|ephemeral-storage" and
  "Insufficient <name>" for every scalar resource (extended resources, hugepages) whose request exceeds
  `allocatable - requested`. A request above the node's whole allocatable makes the node
  UnschedulableAndUnresolvable (PR 131345, 1.34): preemption cannot help there. An extended resource that a
  DeviceClass backs (KEP-5004) and that the node does not offer (`allocatable` 0) is left to the DRA plugin
  (`shouldDelegateResourceToDRA`).
- `k8s.io/component-helpers/resource` `PodRequests`: containers are summed; init containers run one after the
  other, so the pod needs the larger of that sum and each init container (plus the restartable init containers,
  sidecars, started before it); sidecars also add to the sum; `spec.overhead` is added. A container's request
  defaults to its limit (API defaulting), so limits count where requests are absent.
- `pkg/scheduler/framework/preemption/preemption.go` and `plugins/defaultpreemption`: only nodes that failed
  with a resolvable status are candidates; a candidate without lower-priority pods says "No preemption victims
  found for incoming pod", every other node "Preemption is not helpful for scheduling"; a pod with
  `preemptionPolicy: Never` is "not eligible due to preemptionPolicy=Never.".
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from dra_driver.k8s.quantity import QuantityError, parse_quantity

CPU, MEMORY, EPHEMERAL_STORAGE, PODS = "cpu", "memory", "ephemeral-storage", "pods"
PREEMPTION_NOT_HELPFUL = "Preemption is not helpful for scheduling"
NO_VICTIMS = "No preemption victims found for incoming pod"
PREEMPT_NEVER = "not eligible due to preemptionPolicy=Never."
# Not kube-scheduler's words: the sandbox never evicts pods, so it says so where kube-scheduler would preempt.
PREEMPTION_NOT_SIMULATED = "the sandbox does not preempt lower-priority pods"

Resources = dict[str, int]  # cpu in millicores, everything else in units (bytes, devices)


def _amount(name: str, value: Any) -> int:
    """The scheduler's int64 view of a quantity: millicores for cpu, else the value rounded up."""
    try:
        quantity = parse_quantity(str(value))
    except QuantityError:
        return 0
    fraction = quantity.as_fraction()
    return math.ceil(fraction * 1000) if name == CPU else math.ceil(fraction)


def is_scalar(name: str) -> bool:
    """Resources the scheduler tracks besides cpu, memory and ephemeral storage: extended resources (a name with
    a domain), hugepages and `kubernetes.io/`-prefixed native resources."""
    return name.startswith("hugepages-") or "/" in name


def _tracked(name: str) -> bool:
    return name in (CPU, MEMORY, EPHEMERAL_STORAGE) or is_scalar(name)


def container_requests(container: Mapping[str, Any]) -> Resources:
    resources = container.get("resources") or {}
    wanted = {**(resources.get("limits") or {}), **(resources.get("requests") or {})}
    return {name: _amount(name, value) for name, value in wanted.items() if _tracked(str(name))}


def _add(into: Resources, other: Mapping[str, int]) -> None:
    for name, value in other.items():
        into[name] = into.get(name, 0) + value


def _max(into: Resources, other: Mapping[str, int]) -> None:
    for name, value in other.items():
        into[name] = max(into.get(name, 0), value)


def pod_requests(pod: Mapping[str, Any]) -> Resources:
    spec = pod.get("spec") or {}
    total: Resources = {}
    for container in spec.get("containers") or []:
        _add(total, container_requests(container))
    sidecars: Resources = {}
    init_peak: Resources = {}
    for container in spec.get("initContainers") or []:
        requests = container_requests(container)
        if container.get("restartPolicy") == "Always":
            _add(total, requests)
            _add(sidecars, requests)
            _max(init_peak, sidecars)
        else:
            during = dict(sidecars)
            _add(during, requests)
            _max(init_peak, during)
    _max(total, init_peak)
    overhead = spec.get("overhead") or {}
    _add(total, {n: _amount(n, v) for n, v in overhead.items() if _tracked(str(n))})
    return {name: value for name, value in total.items() if value > 0}


def node_allocatable(node: Mapping[str, Any]) -> Resources:
    allocatable = (node.get("status") or {}).get("allocatable") or {}
    return {str(name): _amount(str(name), value) for name, value in allocatable.items()}


def is_active(pod: Mapping[str, Any]) -> bool:
    """A pod bound to a node that still holds its resources (not Succeeded or Failed)."""
    return bool((pod.get("spec") or {}).get("nodeName")) and (pod.get("status") or {}).get("phase") not in (
        "Succeeded",
        "Failed",
    )


@dataclass(frozen=True)
class NodeUsage:
    """What the pods already bound to a node request (the scheduler's NodeInfo)."""

    pods: int = 0
    requested: Mapping[str, int] = field(default_factory=dict)

    @staticmethod
    def of(pods: Iterable[Mapping[str, Any]]) -> NodeUsage:
        requested: Resources = {}
        count = 0
        for pod in pods:
            count += 1
            _add(requested, pod_requests(pod))
        return NodeUsage(count, requested)


def usage_by_node(pods: Iterable[Mapping[str, Any]], skip_uid: str | None = None) -> dict[str, NodeUsage]:
    bound: dict[str, list[Mapping[str, Any]]] = {}
    for pod in pods:
        if is_active(pod) and (pod.get("metadata") or {}).get("uid") != skip_uid:
            bound.setdefault(str(pod["spec"]["nodeName"]), []).append(pod)
    return {node: NodeUsage.of(node_pods) for node, node_pods in bound.items()}


@dataclass(frozen=True)
class InsufficientResource:
    """fit.go's InsufficientResource: what the pod asks of one resource and what the node has and has given out
    (cpu in millicores). The kubelet's admission reports the first one (`pkg/kubelet/lifecycle/predicate.go`)."""

    name: str
    reason: str
    requested: int
    used: int
    capacity: int

    @property
    def unresolvable(self) -> bool:
        """More than the node's whole allocatable: no eviction can make room."""
        return self.requested > self.capacity


@dataclass(frozen=True)
class FitResult:
    insufficient: tuple[InsufficientResource, ...]

    @property
    def reasons(self) -> tuple[str, ...]:
        return tuple(i.reason for i in self.insufficient)

    @property
    def unresolvable(self) -> bool:
        """Some request exceeds the node's whole allocatable: preemption cannot help (PR 131345)."""
        return any(i.unresolvable and i.name != PODS for i in self.insufficient)

    @property
    def fits(self) -> bool:
        return not self.insufficient


def fits(
    requests: Mapping[str, int],
    node: Mapping[str, Any],
    usage: NodeUsage,
    dra_backed: Iterable[str] = (),
) -> FitResult:
    """NodeResourcesFit's Filter (`fitsRequest`) for a pod's `requests` on `node` with `usage` already there, in
    upstream's order: pods, cpu, memory, ephemeral storage, then the scalar resources. `dra_backed`: the extended
    resource names a DeviceClass maps (DRAExtendedResource, treated as enabled)."""
    allocatable = node_allocatable(node)
    backed = set(dra_backed)
    found: list[InsufficientResource] = []
    allowed_pods = allocatable.get(PODS, 0)
    if usage.pods + 1 > allowed_pods:
        found.append(InsufficientResource(PODS, "Too many pods", 1, usage.pods, allowed_pods))
    names = [n for n in (CPU, MEMORY, EPHEMERAL_STORAGE) if n in requests]
    names += sorted(n for n in requests if is_scalar(n))  # upstream walks a map; sorted keeps messages stable
    for name in names:
        wanted = requests[name]
        if wanted <= 0:
            continue
        have = allocatable.get(name, 0)
        if is_scalar(name) and name in backed and have <= 0:
            continue  # KEP-5004: the DRA plugin allocates it on this node
        used = usage.requested.get(name, 0)
        if wanted > have - used:
            found.append(InsufficientResource(name, f"Insufficient {name}", wanted, used, have))
    return FitResult(tuple(found))


@dataclass(frozen=True)
class NodeVerdict:
    """One node's filter outcome as FitError counts it: its reasons and whether preemption could help."""

    node: str
    reasons: tuple[str, ...]
    resolvable: bool = False  # status Unschedulable (not UnschedulableAndUnresolvable)


def _priority(pod: Mapping[str, Any]) -> int:
    value = (pod.get("spec") or {}).get("priority")
    return value if isinstance(value, int) else 0


def histogram(total_nodes: int, reasons: Iterable[str]) -> str:
    """`0/N nodes are available: <count> <reason>, ...` with the counts sorted as strings (FitError)."""
    counts: dict[str, int] = {}
    for reason in reasons:
        counts[reason] = counts.get(reason, 0) + 1
    parts = sorted(f"{count} {reason}" for reason, count in counts.items())
    message = f"0/{total_nodes} nodes are available:"
    return message + (f" {', '.join(parts)}." if parts else "")


def preemption_message(
    pod: Mapping[str, Any],
    verdicts: Sequence[NodeVerdict],
    total_nodes: int,
    pods_by_node: Mapping[str, Sequence[Mapping[str, Any]]],
    refit: Callable[[str, Sequence[Mapping[str, Any]]], Sequence[str]] | None = None,
) -> str:
    """DefaultPreemption's PostFilter message when no node fits. `refit(node_name, remaining_pods)` returns the
    node's reasons with only `remaining_pods` on it (empty: the pod would fit once lower-priority pods go)."""
    if (pod.get("spec") or {}).get("preemptionPolicy") == "Never":
        return f"preemption: {PREEMPT_NEVER}"  # DefaultPreemption's PostFilter prefixes every message
    priority = _priority(pod)
    reasons: list[str] = []
    for verdict in verdicts:
        if not verdict.resolvable:
            reasons.append(PREEMPTION_NOT_HELPFUL)
            continue
        on_node = list(pods_by_node.get(verdict.node, ()))
        remaining = [p for p in on_node if _priority(p) >= priority]
        if len(remaining) == len(on_node):
            reasons.append(NO_VICTIMS)
            continue
        still = tuple(refit(verdict.node, remaining)) if refit is not None else verdict.reasons
        reasons.extend(still or (PREEMPTION_NOT_SIMULATED,))
    reasons.extend(PREEMPTION_NOT_HELPFUL for _ in range(total_nodes - len(verdicts)))
    return f"preemption: {histogram(total_nodes, reasons)}"
