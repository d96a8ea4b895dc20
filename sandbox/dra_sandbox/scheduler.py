"""The sandbox's stand-in for kube-scheduler (DRA plugin) and the resource-claim controller.

For every pending pod (no `spec.nodeName`): create its claims from ResourceClaimTemplates, then find the
first node (by name) on which ALL its claims can be allocated (the pure allocator decides), write each
claim's `status.allocation` and `reservedFor`, and bind the pod. A pod that fits nowhere gets the
condition `PodScheduled=False/Unschedulable` and a `FailedScheduling` Event with kube-scheduler's FitError message
(`0/2 nodes are available: 1 cannot allocate all claims, 1 node(s) didn't match Pod's node affinity/selector. ...`);
`dra-driver explain <namespace>/<claim>` says why the devices do not fit.
When a pod is gone its reservation is dropped, and a claim whose last consumer went away is deallocated.

Extended resources backed by DRA (KEP-5004, gate DRAExtendedResource): a container asking for
`resources.limits: {nvidia.com/gpu: 1}` where a DeviceClass has `extendedResourceName: nvidia.com/gpu` (or for
`deviceclass.resource.kubernetes.io/<class>`) gets, on a node without device-plugin capacity for that name
(`status.allocatable`), one special ResourceClaim per pod: owned by the pod, annotated
`resource.kubernetes.io/extended-resource-claim: "true"`, one request `container-<i>-request-<j>` per
(container, extended resource) for exactly N devices of the class. It is allocated with the pod's other claims,
and `pod.status.extendedResourceClaimStatus.requestMappings` maps each request back to its container for the
kubelet.

Decisions are pure (`plan_pod`); this module's loop only reads and writes the API.
"""

from __future__ import annotations

import contextlib
import gc
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from functools import partial
from typing import Any

import structlog

from dra_driver.allocation import PodAllocationOutcome, SliceIndex, allocate_pod_claims
from dra_driver.allocation.model import parse_node
from dra_driver.allocation.nodes import node_selector_matches
from dra_driver.allocation.prune import ClaimReach, claim_reach
from dra_driver.allocation.taints import apply_taint_rules
from dra_driver.cel.environment import DraCelEnvironment
from dra_driver.commands.listing import list_all
from dra_driver.k8s.client import ApiError, JsonObject, KubeRest
from dra_driver.k8s.taintrules import taint_rule_version
from dra_sandbox import bindingconditions as bc
from dra_sandbox import podgroups
from dra_sandbox.nodefilters import (
    AFFINITY_TERMS_CONFLICT,
    OUTSIDE_PREFILTER_RESULT,
    node_affinity,
    node_affinity_prefilter,
    node_unschedulable,
    taint_toleration,
)
from dra_sandbox.noderesources import (
    NodeUsage,
    NodeVerdict,
    fits,
    histogram,
    is_active,
    pod_requests,
    preemption_message,
    usage_by_node,
)
from dra_sandbox.rest import merge_patch
from dra_sandbox.schedulerevents import FAILED_SCHEDULING, SCHEDULING_ACTION, EventRecorder
from dra_sandbox.watchloop import WatchLoop

log = structlog.get_logger(__name__)

POD_CLAIM_NAME_ANNOTATION = "resource.kubernetes.io/pod-claim-name"
# Set while a claim is allocated, as kube-scheduler does: deleting a claim in use waits until it is released.
DELETE_PROTECTION = "resource.kubernetes.io/delete-protection"
RESOURCE = "/apis/resource.k8s.io/v1"
EXTENDED_RESOURCE_CLAIM_ANNOTATION = "resource.kubernetes.io/extended-resource-claim"
IMPLICIT_EXTENDED_RESOURCE_PREFIX = "deviceclass.resource.kubernetes.io/"


@dataclass(frozen=True)
class ExtendedRequest:
    """One (container, extended resource) of a pod that a DeviceClass backs."""

    container: str
    resource: str
    request: str  # container-<i>-request-<j>
    class_name: str
    count: int


def extended_resource_classes(classes: Sequence[Mapping[str, Any]]) -> dict[str, str]:
    """extended resource name -> DeviceClass. Every class answers to `deviceclass.resource.kubernetes.io/<name>`;
    for an explicit `spec.extendedResourceName` claimed by several classes the most recently created wins, on a
    tie the lexicographically first name."""
    out = {f"{IMPLICIT_EXTENDED_RESOURCE_PREFIX}{c['metadata']['name']}": str(c["metadata"]["name"]) for c in classes}
    ranked = sorted(classes, key=lambda c: c["metadata"]["name"])
    ranked = sorted(ranked, key=lambda c: str(c["metadata"].get("creationTimestamp") or ""), reverse=True)
    for cls in ranked:
        name = (cls.get("spec") or {}).get("extendedResourceName")
        if isinstance(name, str) and name and name not in out:
            out[name] = str(cls["metadata"]["name"])
    return out


def _count(value: Any) -> int:
    try:
        return int(str(value))
    except ValueError:
        return 0


def extended_requests(pod: Mapping[str, Any], classes: Sequence[Mapping[str, Any]]) -> list[ExtendedRequest]:
    """The pod's extended-resource requests that DeviceClasses back (init containers, then containers; ephemeral
    containers cannot ask for them). Limits, else requests (they must be equal for extended resources)."""
    by_name = extended_resource_classes(classes)
    spec = pod.get("spec") or {}
    containers = [*(spec.get("initContainers") or []), *(spec.get("containers") or [])]
    out = []
    for i, container in enumerate(containers):
        resources = container.get("resources") or {}
        wanted = {**(resources.get("requests") or {}), **(resources.get("limits") or {})}
        backed = sorted(r for r in wanted if r in by_name and _count(wanted[r]) > 0)
        for j, resource in enumerate(backed):
            out.append(ExtendedRequest(str(container.get("name")), resource, f"container-{i}-request-{j}",
                                       by_name[resource], _count(wanted[resource])))
    return out


def extended_claim_name(pod: Mapping[str, Any]) -> str:
    """The placeholder name of the pod's special claim until the API server generates its name (ends in '-', so
    never the name of a real claim)."""
    return f"{pod['metadata']['name']}-extended-resources-"


def extended_claim(pod: Mapping[str, Any], requests: Sequence[ExtendedRequest]) -> JsonObject:
    """The special ResourceClaim for `requests` (without status), as kube-scheduler's PreBind creates it."""
    meta = pod["metadata"]
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {
            "name": extended_claim_name(pod),
            "generateName": extended_claim_name(pod),
            "namespace": meta.get("namespace", "default"),
            "annotations": {EXTENDED_RESOURCE_CLAIM_ANNOTATION: "true"},
            "ownerReferences": [{"apiVersion": "v1", "kind": "Pod", "name": meta["name"], "uid": meta["uid"],
                                 "controller": True, "blockOwnerDeletion": True}],
        },
        "spec": {"devices": {"requests": [
            {"name": r.request, "exactly": {"deviceClassName": r.class_name, "allocationMode": "ExactCount",
                                            "count": r.count}}
            for r in requests
        ]}},
    }


def device_plugin_serves(node: Mapping[str, Any], resource: str) -> bool:
    """Whether the node has device-plugin capacity for the name: then the normal resource path is used there."""
    allocatable = (node.get("status") or {}).get("allocatable") or {}
    return _count(allocatable.get(resource, 0)) > 0


def is_extended_claim_of(claim: Mapping[str, Any], pod: Mapping[str, Any]) -> bool:
    meta = claim.get("metadata") or {}
    return (meta.get("annotations") or {}).get(EXTENDED_RESOURCE_CLAIM_ANNOTATION) == "true" and any(
        ref.get("uid") == pod["metadata"]["uid"] for ref in meta.get("ownerReferences") or []
    )


@dataclass(frozen=True)
class PodPlan:
    node: str | None
    allocations: Mapping[str, JsonObject] = field(default_factory=dict)  # claim name -> new allocation
    explanation: str = ""  # kube-scheduler's FitError message (the PodScheduled condition and FailedScheduling)
    # Per node the DynamicResources plugin rejected: the failing claim (namespace/name) and the allocator's leading
    # reason, which kube-scheduler does not print ("cannot allocate all claims"); `dra-driver explain` does.
    device_reasons: Mapping[str, tuple[str, str]] = field(default_factory=dict)
    # The pod's extended-resource claim to create on that node (its allocation is under its placeholder name).
    extended: JsonObject | None = None
    extended_requests: tuple[ExtendedRequest, ...] = ()


# resource.k8s.io/v1 ResourceClaimReservedForMaxSize: resourceclaim.CanBeReserved.
RESERVED_FOR_MAX = 256
# pkg/controller/resourceclaim/controller.go: room for the hyphen and 5 random characters in 63.
CLAIM_GENERATE_NAME_MAX = 57


def claim_generate_name(pod_name: str, pod_claim: str) -> str:
    """`<pod>-<claim>-`, both parts cut in proportion to their length when it would pass 57 characters (so the pod
    claim's name is not lost, as it would be if the API server cut the end)."""
    base = f"{pod_name}-{pod_claim}-"
    if len(base) <= CLAIM_GENERATE_NAME_MAX:
        return base
    keep_pod = len(pod_name) * CLAIM_GENERATE_NAME_MAX // len(base)
    keep_claim = len(pod_claim) * CLAIM_GENERATE_NAME_MAX // len(base)
    return f"{pod_name[:keep_pod]}-{pod_claim[:keep_claim]}"


def _key(obj: Mapping[str, Any]) -> tuple[str, str]:
    meta = obj.get("metadata") or {}
    return str(meta.get("namespace", "")), str(meta.get("name", ""))


def pod_claim_names(pod: Mapping[str, Any]) -> tuple[list[str], list[str]]:
    """(resolved claim names, pod claim entries still waiting for their template-generated claim)."""
    statuses = {
        s.get("name"): s.get("resourceClaimName") for s in (pod.get("status") or {}).get("resourceClaimStatuses") or []
    }
    names, waiting = [], []
    for entry in (pod.get("spec") or {}).get("resourceClaims") or []:
        if entry.get("resourceClaimName"):
            names.append(entry["resourceClaimName"])
        elif statuses.get(entry.get("name")):
            names.append(str(statuses[entry["name"]]))
        else:
            waiting.append(str(entry.get("name")))
    return names, waiting


# pkg/scheduler/schedule_one.go: below 100 nodes every node is filtered; above, the scheduler stops once it has
# found max(100, N * (50 - N/125)%, at least 5%) feasible nodes (percentageOfNodesToScore unset).
MIN_FEASIBLE_NODES_TO_FIND = 100
MIN_FEASIBLE_NODES_PERCENTAGE = 5
# k8s.io/api resource/v1: FirstAvailableDeviceRequestMaxSize; the DRA Score adds (8 - rank) per prioritized list.
FIRST_AVAILABLE_MAX_SIZE = 8
MAX_NODE_SCORE = 100
NO_NODES_AVAILABLE = "no nodes available to schedule pods"


def num_feasible_nodes_to_find(total: int) -> int:
    if total < MIN_FEASIBLE_NODES_TO_FIND:
        return total
    percentage = max(50 - total // 125, MIN_FEASIBLE_NODES_PERCENTAGE)
    return max(total * percentage // 100, MIN_FEASIBLE_NODES_TO_FIND)


def prioritized_list_score(claims: Sequence[Mapping[str, Any]], allocations: Mapping[str, Mapping[str, Any]]) -> int:
    """The DynamicResources plugin's Score for one node (1.35+, kubernetes/kubernetes PR 134711): per claim and
    firstAvailable request, FirstAvailableDeviceRequestMaxSize minus the rank of the subrequest allocated there.
    `allocations`: claim name -> allocation on this node (planned, or the claim's own when already allocated)."""
    score = 0
    for claim in claims:
        allocation = allocations.get(claim["metadata"]["name"]) or (claim.get("status") or {}).get("allocation") or {}
        chosen = {str(r.get("request")) for r in (allocation.get("devices") or {}).get("results") or []}
        for request in ((claim.get("spec") or {}).get("devices") or {}).get("requests") or []:
            for rank, sub in enumerate(request.get("firstAvailable") or []):
                if f"{request.get('name')}/{sub.get('name')}" in chosen:
                    score += FIRST_AVAILABLE_MAX_SIZE - rank
    return score


def normalize_scores(scores: Sequence[int]) -> list[int]:
    """framework helper DefaultNormalizeScore(MaxNodeScore, reverse=false): the best node gets 100."""
    top = max(scores, default=0)
    if top == 0:
        return [0 for _ in scores]
    return [MAX_NODE_SCORE * s // top for s in scores]


def _uses_prioritized_list(claims: Sequence[Mapping[str, Any]]) -> bool:
    return any(
        request.get("firstAvailable")
        for claim in claims
        if not (claim.get("status") or {}).get("allocation")
        for request in ((claim.get("spec") or {}).get("devices") or {}).get("requests") or []
    )


@dataclass(frozen=True)
class _Feasible:
    node: str
    planned: dict[str, JsonObject]
    special: JsonObject | None
    needed: tuple[ExtendedRequest, ...]
    score: int


@contextlib.contextmanager
def _collector_paused() -> Iterator[None]:
    """The cyclic garbage collector off for one pass. A pass parses every device of the fleet into small objects
    that live as long as the index (no reference cycles among them): with the collector on, each allocation burst
    triggers full collections that rescan the whole heap (the raw LIST included), about 40 % of a cold pass at
    1000 nodes. Reference counting still frees everything; the collector's state is restored afterwards (left off
    if a caller had turned it off)."""
    collecting = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if collecting:
            gc.enable()


@_collector_paused()
def plan_pod(
    pod: Mapping[str, Any],
    claims: Sequence[JsonObject],
    *,
    nodes: Sequence[JsonObject],
    classes: Sequence[JsonObject],
    slices: Sequence[JsonObject] | SliceIndex,
    allocated_claims: Sequence[JsonObject],
    namespace_labels: Mapping[str, str],
    cel: DraCelEnvironment,
    extended: Sequence[ExtendedRequest] = (),
    pods: Sequence[Mapping[str, Any]] = (),
    kube_version: tuple[int, int] = (1, 35),
    sieve: bool = True,
    feature_gates: Mapping[str, bool] | None = None,
) -> PodPlan:
    """Where the pod can run and which claims that needs allocated. Pure.

    NodeAffinity's PreFilter first (required terms pinning `metadata.name`), then per node, in name order, the
    filters of kube-scheduler's default profile that apply here, in its order, each node stopping at its first
    failure: NodeUnschedulable, TaintToleration, NodeAffinity (`spec.nodeSelector` and required node affinity),
    NodeResourcesFit (against `pods` already bound there), DynamicResources (all claims in one search).
    `extended`: the pod's extended-resource requests backed by classes; on each node
    those without device-plugin capacity there become one claim. Feasible nodes are scored by the rank of the
    firstAvailable subrequests they satisfy (1.35+); the best wins, ties go to the first by name.

    `sieve`: the nodes are tried against a view of the slices without the pools no request of the pod's claims can
    select (allocation/prune.py; judged on the raw slices, so their devices are never parsed). That changes no
    node's verdict and no allocation, only how a failing node's explanation counts rejected devices, so when no
    node fits and the sieve left something out the pass is made again without it, and the pod's message is the one
    the full pass gives."""
    if not nodes:
        return PodPlan(None, explanation=NO_NODES_AVAILABLE)
    by_name = sorted(nodes, key=lambda n: n["metadata"]["name"])
    has_claims = bool(claims) or bool(extended)
    prefilter = node_affinity_prefilter(pod)
    if prefilter.conflict:
        # A PreFilter rejection: its message instead of the per-node counts; every node unresolvable.
        failed = [NodeFailure(n["metadata"]["name"], (AFFINITY_TERMS_CONFLICT,)) for n in by_name]
        post = _post_filter(pod, has_claims, failed, by_name, pods, {}, {}, kube_version)
        return PodPlan(None, explanation=f"0/{len(nodes)} nodes are available: {AFFINITY_TERMS_CONFLICT}. {post}")
    missing_class = _missing_device_class(claims, classes)
    if missing_class is not None:
        # DynamicResources' PreFilter: it fails before it records the pod's claims, so its PostFilter has none to
        # deallocate; every node counts as unresolvable for preemption.
        failed = [NodeFailure(n["metadata"]["name"], (missing_class,)) for n in by_name]
        post = _post_filter(pod, False, failed, by_name, pods, {}, {}, kube_version)
        return PodPlan(None, explanation=f"0/{len(nodes)} nodes are available: {missing_class}. {post}")
    several = len(claims) + (1 if extended else 0) > 1
    full = slices if isinstance(slices, SliceIndex) else SliceIndex(slices)
    reach = _pod_reach(claims, extended, classes, cel, kube_version) if sieve else None
    index = full.sieved(reach) if reach is not None else full
    requests = pod_requests(pod)
    backed = extended_resource_classes(classes) if requests else {}
    usage = usage_by_node(pods, skip_uid=(pod.get("metadata") or {}).get("uid"))
    # Without a prioritized list to rank every feasible node scores the same: the first one found wins.
    scoring = kube_version >= (1, 35) and _uses_prioritized_list(claims)
    failures: list[NodeFailure] = []
    if prefilter.names is not None:
        # Nodes the PreFilter result leaves out are never filtered (schedule_one.go findNodesThatFitPod).
        failures = [NodeFailure(n["metadata"]["name"], (OUTSIDE_PREFILTER_RESULT,)) for n in by_name
                    if n["metadata"]["name"] not in prefilter.names]
        by_name = [n for n in by_name if n["metadata"]["name"] in prefilter.names]
    wanted = num_feasible_nodes_to_find(len(by_name)) if scoring else 1
    # Every node is tried against the same cluster: only the node and the claims it still has to allocate change.
    allocate = partial(allocate_pod_claims, classes=classes, slices=index, allocated_claims=allocated_claims,
                       namespace_labels=namespace_labels, cel=cel,
                       feature_gates={**bc.scheduler_feature_gates(kube_version[1]), **(feature_gates or {})})
    feasible: list[_Feasible] = []
    for node in by_name:
        if len(feasible) >= wanted:
            break
        node_name = node["metadata"]["name"]
        rejected = node_unschedulable(pod, node) or taint_toleration(pod, node) or node_affinity(pod, node)
        if rejected is not None:
            failures.append(NodeFailure(node_name, (rejected,)))
            continue
        fit = fits(requests, node, usage.get(node_name, NodeUsage()), backed)
        if not fit.fits:
            failures.append(NodeFailure(node_name, fit.reasons, resolvable=not fit.unresolvable))
            continue
        planned: dict[str, JsonObject] = {}
        failure: NodeFailure | None = None
        needed = tuple(r for r in extended if not device_plugin_serves(node, r.resource))
        special = extended_claim(pod, needed) if needed else None
        to_allocate: list[JsonObject] = []
        for claim in [*claims, *([special] if special else [])]:
            allocation = (claim.get("status") or {}).get("allocation")
            if not allocation:
                to_allocate.append(claim)
                continue
            selector = allocation.get("nodeSelector")
            if selector and not node_selector_matches(selector, parse_node(node)):
                failure = NodeFailure(node_name, (CLAIM_NOT_AVAILABLE_ON_NODE,))
                break
        if failure is None and to_allocate:
            # All of the pod's claims in one search, backtracking across them, as upstream's allocator.
            outcome: PodAllocationOutcome = allocate(to_allocate, node=node)
            if outcome.failure is not None:
                assert outcome.failure.explanation is not None
                leading = outcome.failure.explanation.leading_reason
                if several:
                    leading = f"claim {outcome.failure.claim.split('/', 1)[-1]}: {leading}"
                failure = NodeFailure(node_name, (CANNOT_ALLOCATE_ALL_CLAIMS,), claim=outcome.failure.claim,
                                      device_reason=leading)
            else:
                for claim, claim_outcome in zip(to_allocate, outcome.outcomes, strict=True):
                    assert claim_outcome.allocation is not None
                    planned[claim["metadata"]["name"]] = dict(claim_outcome.allocation)
        if failure is not None:
            failures.append(failure)
            continue
        scored = [*claims, *([special] if special else [])]
        feasible.append(_Feasible(node_name, planned, special, needed,
                                  prioritized_list_score(scored, planned) if scoring else 0))
    if feasible:
        normalized = normalize_scores([f.score for f in feasible])
        best = feasible[normalized.index(max(normalized))]  # the first by name among the best
        return PodPlan(best.node, best.planned, extended=best.special, extended_requests=best.needed)
    if index.left_out and any(f.claim for f in failures):
        # The message is the same either way; the allocator's reasons (device_reasons) count devices the sieve
        # left out, so they come from the full pass.
        return plan_pod(pod, claims, nodes=nodes, classes=classes, slices=full, allocated_claims=allocated_claims,
                        namespace_labels=namespace_labels, cel=cel, extended=extended, pods=pods,
                        kube_version=kube_version, sieve=False, feature_gates=feature_gates)
    post_filter = _post_filter(pod, has_claims, failures, sorted(nodes, key=lambda n: n["metadata"]["name"]), pods,
                               requests, backed, kube_version)
    reasons = {f.node: (f.claim, f.device_reason) for f in failures if f.claim and f.device_reason}
    return PodPlan(None, explanation=fit_error(len(nodes), failures, post_filter), device_reasons=reasons)


def _missing_device_class(claims: Sequence[Mapping[str, Any]], classes: Sequence[Mapping[str, Any]]) -> str | None:
    """DynamicResources' PreFilter check of the classes of claims still to allocate (validateDeviceClass):
    `request <name>: device class <class> does not exist`, a subrequest named `<request>/<subrequest>`."""
    known = {(c.get("metadata") or {}).get("name") for c in classes}
    for claim in claims:
        if (claim.get("status") or {}).get("allocation"):
            continue
        for request in ((claim.get("spec") or {}).get("devices") or {}).get("requests") or []:
            name = str(request.get("name", ""))
            if request.get("exactly") is not None:
                named = [(name, request["exactly"].get("deviceClassName"))]
            else:
                named = [(f"{name}/{sub.get('name', '')}", sub.get("deviceClassName"))
                         for sub in request.get("firstAvailable") or []]
            for label, class_name in named:
                if class_name and class_name not in known:
                    return f"request {label}: device class {class_name} does not exist"
    return None


def _pod_reach(
    claims: Sequence[JsonObject],
    extended: Sequence[ExtendedRequest],
    classes: Sequence[JsonObject],
    cel: DraCelEnvironment,
    kube_version: tuple[int, int],
) -> Callable[[Mapping[str, Any]], bool] | None:
    """Whether a raw slice may serve any claim the pod still needs allocated; None when that cannot be judged
    exactly for one of them (allocation/prune.py `claim_reach`) or a claim is made per node (extended resources)."""
    if extended:
        return None
    gates = bc.scheduler_feature_gates(kube_version[1])
    reaches: list[ClaimReach] = []
    for claim in claims:
        if (claim.get("status") or {}).get("allocation"):
            continue
        reach = claim_reach(claim, classes, cel=cel, feature_gates=gates)
        if reach is None:
            return None
        reaches.append(reach)
    if not reaches:
        return None
    return lambda raw: any(reach.may_serve(raw) for reach in reaches)


def _post_filter(
    pod: Mapping[str, Any],
    has_claims: bool,
    failures: Sequence[NodeFailure],
    nodes: Sequence[JsonObject],
    pods: Sequence[Mapping[str, Any]],
    requests: Mapping[str, int],
    backed: Mapping[str, str],
    kube_version: tuple[int, int],
) -> str:
    """The PostFilter plugins' messages: DynamicResources', then DefaultPreemption's. From 1.37 the DynamicResources
    PostFilter gives no reason when it deallocates nothing (`fwk.NewStatus(fwk.Unschedulable)`), so only
    preemption's words follow the counts (found by the differential suite, docs/differential.md)."""
    dra = [] if kube_version >= (1, 37) else [STILL_NOT_SCHEDULABLE if has_claims else NO_CLAIMS_TO_DEALLOCATE]
    return ", ".join([*dra, _preemption(pod, failures, nodes, pods, requests, backed)])


def _preemption(
    pod: Mapping[str, Any],
    failures: Sequence[NodeFailure],
    nodes: Sequence[JsonObject],
    pods: Sequence[Mapping[str, Any]],
    requests: Mapping[str, int],
    backed: Mapping[str, str],
) -> str:
    node_objects = {n["metadata"]["name"]: n for n in nodes}
    bound: dict[str, list[Mapping[str, Any]]] = {}
    for other in pods:
        if is_active(other):
            bound.setdefault(str(other["spec"]["nodeName"]), []).append(other)

    def refit(node: str, remaining: Sequence[Mapping[str, Any]]) -> Sequence[str]:
        return fits(requests, node_objects[node], NodeUsage.of(remaining), backed).reasons

    verdicts = [NodeVerdict(f.node, f.reasons, f.resolvable) for f in failures]
    return preemption_message(pod, verdicts, len(nodes), bound, refit)


# The reasons kube-scheduler's plugins give, as FitError counts them ("<count> <reason>"); the node filters' are in
# nodefilters.py. DynamicResources' Filter (plugins/dynamicresources/dynamicresources.go, both
# UnschedulableAndUnresolvable): the allocator found no devices for the pod's claims on the node; an allocated
# claim's node selector does not match the node.
CANNOT_ALLOCATE_ALL_CLAIMS = "cannot allocate all claims"
CLAIM_NOT_AVAILABLE_ON_NODE = "resourceclaim not available on the node"
# The DynamicResources plugin's PostFilter (it runs before DefaultPreemption's), 1.34-1.36; 1.37 gives no reason.
NO_CLAIMS_TO_DEALLOCATE = "no new claims to deallocate"
STILL_NOT_SCHEDULABLE = "still not schedulable"


@dataclass(frozen=True)
class NodeFailure:
    """Why one node cannot take the pod: the reasons of the first filter that failed there (no node names, so
    nodes group by them), whether preemption could help (an Unschedulable, not UnschedulableAndUnresolvable,
    status) and the claim that failed there, if one did."""

    node: str
    reasons: tuple[str, ...]
    resolvable: bool = False
    claim: str | None = None  # namespace/name of the claim the allocator could not serve there
    device_reason: str = ""  # the allocator's leading reason for it (not part of kube-scheduler's message)


def fit_error(total_nodes: int, failures: Sequence[NodeFailure], post_filter: str = "") -> str:
    """kube-scheduler's FitError message (pkg/scheduler/framework/types.go): `0/N nodes are available: <count>
    <reason>, ...` (every reason of every node counted, the parts sorted as strings), then the PostFilter
    plugins' message as they wrote it (DefaultPreemption's ends in its own FitError's '.'; releases before the
    PostFilter separator became " %v" printed a second one). Pure."""
    message = histogram(total_nodes, (r for f in failures for r in f.reasons))
    if post_filter:
        message += f" {post_filter}"
    return message


def parse_version_info(info: Mapping[str, Any]) -> tuple[int, int]:
    """(major, minor) of a `/version` answer (`minor` may carry a '+' as on managed clusters)."""
    digits = "".join(ch for ch in str(info.get("minor", "")) if ch.isdigit())
    return int(str(info.get("major", "1")) or 1), int(digits or 0)


def release_plan(claims: Iterable[JsonObject], live_pods: set[str]) -> list[tuple[JsonObject, JsonObject]]:
    """(claim, new status) for every claim reserved for a pod (or a KEP-5729 PodGroup) that no longer exists, by
    UID (`live_pods` holds both); a claim whose LAST consumer went away is deallocated. (A claim allocated but never
    reserved is left alone.) Pure."""
    changes = []
    for claim in claims:
        status = claim.get("status") or {}
        reserved = status.get("reservedFor") or []
        keep = [r for r in reserved
                if r.get("resource") not in ("pods", podgroups.RESOURCE) or r.get("uid") in live_pods]
        if len(keep) == len(reserved):
            continue
        new_status = {k: v for k, v in status.items() if k not in ("reservedFor", "allocation")}
        if keep:
            new_status["reservedFor"] = keep
            new_status["allocation"] = status.get("allocation")
        changes.append((claim, new_status))
    return changes


class SandboxScheduler:
    def __init__(
        self,
        rest: KubeRest,
        resync_seconds: float = 2.0,
        kubernetes_minor: int = 34,
        *,
        binding_timeout_s: float = bc.BINDING_TIMEOUT_DEFAULT_S,
        clock: Callable[[], datetime] = lambda: datetime.now(UTC),
        feature_gates: Mapping[str, bool] | None = None,
    ) -> None:
        if binding_timeout_s < 1:
            raise ValueError("binding_timeout_s: DynamicResourcesArgs.bindingTimeout must be at least 1 s")
        self._rest = rest
        self._binding_timeout_s = binding_timeout_s
        self._clock = clock  # the sandbox's clock: binding timeouts (tests move it instead of sleeping)
        # --feature-gates beyond the release's defaults, e.g. DRADerivedAttributes (KEP-6080, alpha in 1.37).
        self._feature_gates = dict(feature_gates or {})
        self._binding_waits: set[str] = set()  # uids of pods held in PreBind (the event is recorded once)
        self._resync = resync_seconds
        # kube-scheduler's DRA CEL environment of the release the sandbox reports (StoredExpressions).
        self._cel = DraCelEnvironment(kubernetes_minor=kubernetes_minor)
        self._slices: SliceIndex | None = None  # the last pass's, so unchanged slices are not parsed again
        self._loop = WatchLoop(rest, "sandbox-scheduler", self._pass)
        self._version: tuple[int, int] | None = None
        self._reported_failures: dict[str, str] = {}  # pod uid -> the claim-creation failure last reported
        self._rules_path: str | None = None  # "" once discovery found no DeviceTaintRule API
        self._groups_served: bool | None = None  # whether the API server serves PodGroups (found once)
        self._events = EventRecorder(rest, clock=clock)  # kube-scheduler's events.k8s.io recorder

    def _taint_rules_path(self) -> str | None:
        """Where the API server serves DeviceTaintRules (found once), or None when its release serves none."""
        if self._rules_path is None:
            version = taint_rule_version(self._rest)
            self._rules_path = f"/apis/resource.k8s.io/{version}/devicetaintrules" if version else ""
        return self._rules_path or None

    def _pod_groups_served(self) -> bool:
        """Whether the API server serves KEP-5729 PodGroups (GenericWorkload on; looked up once)."""
        if self._groups_served is None:
            try:
                self._rest.request("GET", podgroups.API)
                self._groups_served = True
            except ApiError as exc:
                if not exc.not_found:
                    raise
                self._groups_served = False
        return self._groups_served

    def _pod_group(self, pod: Mapping[str, Any]) -> JsonObject | None:
        """The pod's PodGroup, where it names one that exists (None also where the kind is not served)."""
        name = podgroups.pod_group_name(pod)
        if name is None or not self._pod_groups_served():
            return None
        return self._rest.get(podgroups.pod_group_path(_key(pod)[0], name))

    def _taint_rules(self) -> list[JsonObject]:
        path = self._taint_rules_path()
        return self._items(path) if path else []

    def start(self) -> None:
        rules = self._taint_rules_path()
        paths = ["/api/v1/pods", f"{RESOURCE}/resourceclaims", f"{RESOURCE}/resourceslices"]
        self._loop.start(paths + ([rules] if rules else []))

    def stop(self) -> None:
        self._loop.stop()

    def trigger(self) -> None:
        self._loop.trigger()

    def _pass(self) -> float:
        """One reconcile, its errors logged; the seconds until the next pass is due (the resync period)."""
        try:
            self.reconcile()
        except ApiError as exc:
            if exc.status == 409:  # an object changed under this pass (a kubelet, the controller): the next pass
                log.debug("sandbox scheduler: conflict, retried on the next pass", error=str(exc))
            else:
                log.warning("sandbox scheduler: API error", error=str(exc))
        except Exception:
            log.exception("sandbox scheduler failed")
        return self._resync

    # --- one pass ------------------------------------------------------------------------------------

    def _items(self, path: str) -> list[JsonObject]:
        return list_all(self._rest, path)  # in pages: a large fleet's slices in one response outlast the timeout

    def reconcile(self) -> None:
        pods = self._items("/api/v1/pods")
        claims = self._items(f"{RESOURCE}/resourceclaims")
        groups = self._items(f"{podgroups.API}/{podgroups.RESOURCE}") if self._pod_groups_served() else []
        live = {p["metadata"]["uid"] for p in pods} | {g["metadata"]["uid"] for g in groups}
        for claim, status in release_plan(claims, live):
            self._write_claim_status(claim, status)
            if "allocation" not in status:
                self._set_protection(claim, protect=False)
            log.info("claim released", claim=f"{claim['metadata']['namespace']}/{claim['metadata']['name']}")
        for pod in pods:
            if (pod.get("spec") or {}).get("nodeName") and not pod["metadata"].get("deletionTimestamp"):
                self._sync_bound_pod(pod, claims)
        pending = [
            p for p in pods if not (p.get("spec") or {}).get("nodeName") and not p["metadata"].get("deletionTimestamp")
        ]
        self._events.retain({p["metadata"]["uid"] for p in pending})
        if not pending:
            return
        nodes = self._items("/api/v1/nodes")
        classes = self._items(f"{RESOURCE}/deviceclasses")
        # Parsed lazily, and only what changed since the last pass (slices are matched by uid and resourceVersion).
        # DeviceTaintRules add their taints to the devices they select, as kube-scheduler's resourceslice tracker does.
        raw_slices = apply_taint_rules(self._items(f"{RESOURCE}/resourceslices"), self._taint_rules())
        slices = self._slices = SliceIndex(raw_slices, previous=self._slices)
        namespaces = {
            n["metadata"]["name"]: n["metadata"].get("labels") or {} for n in self._items("/api/v1/namespaces")
        }
        for pod in sorted(pending, key=lambda p: p["metadata"].get("creationTimestamp", "")):
            claims = self._items(f"{RESOURCE}/resourceclaims")
            try:
                bound = self._schedule(pod, claims, nodes, classes, slices, namespaces, pods)
                if bound is not None:  # later pods of this pass see what it requests on that node
                    pods.append({**pod, "spec": {**(pod.get("spec") or {}), "nodeName": bound}})
            except ApiError as exc:
                if not exc.not_found:
                    raise
                # The pod (or a claim) was deleted while we looked at it: nothing to schedule any more.
                log.debug("object vanished while scheduling", pod=pod["metadata"]["name"], error=str(exc))

    def _schedule(
        self,
        pod: JsonObject,
        all_claims: list[JsonObject],
        nodes: list[JsonObject],
        classes: list[JsonObject],
        slices: SliceIndex,
        namespaces: Mapping[str, Mapping[str, str]],
        pods: Sequence[JsonObject],
    ) -> str | None:
        """Schedule one pod; the node it was bound to, if it was."""
        namespace, name = _key(pod)
        names, waiting = pod_claim_names(pod)
        if waiting:
            self._create_template_claims(pod, waiting)
            return None  # the next pass sees the generated claims
        by_key = {_key(c): c for c in all_claims}
        missing = [n for n in names if (namespace, n) not in by_key]
        if missing:
            # kube-scheduler's DynamicResources PreEnqueue holds such a pod back: no attempt, so no PodScheduled
            # condition and no FailedScheduling Event (kube-scheduler 1.37.2 in docs/differential.md).
            log.debug("waiting for ResourceClaim(s)", pod=f"{namespace}/{name}", claims=missing)
            return None
        claims = [by_key[(namespace, n)] for n in names]
        # KEP-5004: reuse the pod's special claim when an earlier pass created it; else plan one per node.
        existing = [c for c in all_claims if _key(c)[0] == namespace and is_extended_claim_of(c, pod)]
        extended = extended_requests(pod, classes) if not existing else []
        claims += existing
        allocated = [c for c in all_claims if (c.get("status") or {}).get("allocation")]
        plan = plan_pod(
            pod,
            claims,
            nodes=nodes,
            classes=classes,
            slices=slices,
            allocated_claims=allocated,
            namespace_labels=namespaces.get(namespace, {}),
            cel=self._cel,
            extended=extended,
            pods=pods,
            kube_version=self._kube_version(),
            feature_gates=self._feature_gates,
        )
        if plan.node is None:
            self._unschedulable(pod, plan.explanation)
            self._events.eventf(pod, "Warning", FAILED_SCHEDULING, SCHEDULING_ACTION, plan.explanation)
            return None
        if plan.extended is not None:
            claims.append(self._create_extended_claim(pod, plan))
            names.append(claims[-1]["metadata"]["name"])
        binding = bc.binding_conditions_enabled(self._kube_version()[1])
        reserved_claims: list[JsonObject] = []
        group = self._pod_group(pod)
        for claim in claims:
            status = dict(claim.get("status") or {})
            planned = plan.allocations.get(claim["metadata"]["name"])
            if planned is None and plan.extended is not None and is_extended_claim_of(claim, pod):
                planned = plan.allocations.get(extended_claim_name(pod))
            if planned is not None:
                status["allocation"] = planned
                claim = self._set_protection(claim, protect=True)
            reserved = list(status.get("reservedFor") or [])
            consumer = podgroups.consumer_for(pod, group, podgroups.pod_claim_entry(pod, claim["metadata"]["name"]))
            if not any(r.get("uid") == consumer["uid"] for r in reserved):
                reserved.append(consumer)  # the pod, or its PodGroup for a claim the group lists (KEP-5729)
            status["reservedFor"] = reserved
            if binding:
                status = bc.with_allocation_timestamp(status, self._clock())
            self._write_claim_status(claim, status)
            reserved_claims.append({**claim, "status": status})
        if binding and not self._binding_conditions_met(pod, reserved_claims, plan.node):
            return None
        self._bind(pod, plan.node)
        log.info("pod scheduled", pod=f"{namespace}/{name}", node=plan.node, claims=names)
        return plan.node

    def _binding_conditions_met(self, pod: JsonObject, claims: Sequence[JsonObject], node: str) -> bool:
        """PreBind's wait for KEP-5007 binding conditions (bindingconditions.py), one check per pass instead of
        upstream's 5 s poll: True to bind now. On a failure condition or the timeout the attempt fails: the pod is
        unreserved and the claims no other pod holds are deallocated (the next attempt's Filter + PostFilter),
        so the next pass allocates afresh."""
        uid = pod["metadata"]["uid"]
        if not any(bc.has_binding_conditions(c) for c in claims):
            self._binding_waits.discard(uid)
            return True
        check = bc.pod_readiness(claims, self._clock(), self._binding_timeout_s)
        if check.readiness is bc.Readiness.READY:
            self._binding_waits.discard(uid)
            return True
        if check.readiness is bc.Readiness.WAITING:
            if uid not in self._binding_waits:
                self._binding_waits.add(uid)
                self._pod_event(pod, "Normal", bc.BINDING_CONDITIONS_PENDING,
                                f"waiting for binding conditions for device on node {node}")
            return False
        self._binding_waits.discard(uid)
        log.info("binding conditions failed", pod="/".join(_key(pod)), error=check.message)
        self._pod_event(pod, "Warning", "FailedScheduling", f"running PreBind plugin \"DynamicResources\": "
                                                            f"{check.message}")
        for claim in claims:
            status = bc.deallocated_status(claim.get("status") or {}, uid)
            if status is None:
                continue
            self._write_claim_status(claim, status)
            if "allocation" not in status:
                self._set_protection(claim, protect=False)
        self._unschedulable(pod, f"{check.message}; {bc.DEALLOCATED}")
        return False

    def _pod_event(self, pod: JsonObject, kind: str, reason: str, message: str) -> None:
        self._events.eventf(pod, kind, reason, SCHEDULING_ACTION, message)

    def _kube_version(self) -> tuple[int, int]:
        """The (major, minor) the API server reports (`/version`): kube-scheduler's behaviour of that release."""
        if self._version is None:
            info = self._rest.request("GET", "/version")
            self._version = parse_version_info(info)
        return self._version

    def _create_extended_claim(self, pod: JsonObject, plan: PodPlan) -> JsonObject:
        """Create the special claim and point `pod.status.extendedResourceClaimStatus` at it (PreBind)."""
        assert plan.extended is not None
        namespace, pod_name = _key(pod)
        body = {**plan.extended, "metadata": {k: v for k, v in plan.extended["metadata"].items() if k != "name"}}
        created = self._rest.request("POST", f"{RESOURCE}/namespaces/{namespace}/resourceclaims", body=body)
        # The field names of k8s.io/api core/v1 (PodExtendedResourceClaimStatus, ContainerExtendedResourceRequest):
        # requestMappings[].{containerName, resourceName, requestName}.
        mapping = [{"containerName": r.container, "resourceName": r.resource, "requestName": r.request}
                   for r in plan.extended_requests]
        merge_patch(self._rest, f"/api/v1/namespaces/{namespace}/pods/{pod_name}/status",
                    {"status": {"extendedResourceClaimStatus": {"resourceClaimName": created["metadata"]["name"],
                                                                "requestMappings": mapping}}})
        log.info("extended-resource claim created", pod=f"{namespace}/{pod_name}", claim=created["metadata"]["name"])
        return created

    def _set_protection(self, claim: JsonObject, *, protect: bool) -> JsonObject:
        namespace, name = _key(claim)
        current = list(claim["metadata"].get("finalizers") or [])
        wanted = [*current, DELETE_PROTECTION] if protect else [f for f in current if f != DELETE_PROTECTION]
        if (DELETE_PROTECTION in current) == protect:
            return claim
        return merge_patch(self._rest, f"{RESOURCE}/namespaces/{namespace}/resourceclaims/{name}",
                           {"metadata": {"finalizers": wanted}})

    def _write_claim_status(self, claim: JsonObject, status: JsonObject) -> None:
        namespace, name = _key(claim)
        body = {**claim, "status": status}
        self._rest.request("PUT", f"{RESOURCE}/namespaces/{namespace}/resourceclaims/{name}/status", body=body)

    def _sync_bound_pod(self, pod: JsonObject, claims: Sequence[JsonObject]) -> None:
        """The resource-claim controller's syncPod for a pod that already has a node (set by hand: the scheduler
        never sees it): claims from its templates are created all the same, and an allocated claim it uses is
        reserved for it. Nothing allocates the new claims, so the kubelet keeps the pod waiting for them, as on a
        cluster. Upstream: `pkg/controller/resourceclaim/controller.go` (syncPod, handleClaim, reserveForPod)."""
        if (pod.get("status") or {}).get("phase") in ("Succeeded", "Failed"):
            return
        names, waiting = pod_claim_names(pod)
        if waiting:
            self._create_template_claims(pod, waiting)
            return  # the next pass sees the generated claims
        namespace, _ = _key(pod)
        by_key = {_key(c): c for c in claims}
        group = self._pod_group(pod)
        for claim_name in names:
            claim = by_key.get((namespace, claim_name))
            if claim is None:
                continue
            status = dict(claim.get("status") or {})
            reserved = list(status.get("reservedFor") or [])
            if not status.get("allocation") or podgroups.reserved_for_pod(pod, reserved):
                continue
            if len(reserved) >= RESERVED_FOR_MAX:  # CanBeReserved
                continue
            consumer = podgroups.consumer_for(pod, group, podgroups.pod_claim_entry(pod, claim_name))
            status["reservedFor"] = [*reserved, consumer]
            self._write_claim_status(claim, status)

    def _claim_creation_failed(self, pod: JsonObject, entry: str, error: str, *, waiting: bool = False) -> None:
        """The controller's Warning event on the pod (and for a pod still pending, the scheduler's condition).
        `waiting`: an expected wait (the template is not there yet: a controller creates it, or the pod was applied
        before it), so only a debug line; the Event says it to whoever looks at the pod."""
        namespace, pod_name = _key(pod)
        message = f"PodResourceClaim {entry}: {error}"
        (log.debug if waiting else log.warning)("cannot create the pod's claim", pod=f"{namespace}/{pod_name}",
                                                 error=message)
        now = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
        event = {
            "apiVersion": "v1", "kind": "Event",
            "metadata": {"generateName": f"{pod_name}.", "namespace": namespace},
            "involvedObject": {"apiVersion": "v1", "kind": "Pod", "namespace": namespace, "name": pod_name,
                               "uid": pod["metadata"]["uid"]},
            "reason": "FailedResourceClaimCreation", "message": message, "type": "Warning",
            "source": {"component": "resource_claim"}, "reportingComponent": "resource_claim",
            "firstTimestamp": now, "lastTimestamp": now, "count": 1,
        }
        if self._reported_failures.get(pod["metadata"]["uid"]) != message:
            self._reported_failures[pod["metadata"]["uid"]] = message
            self._rest.request("POST", f"/api/v1/namespaces/{namespace}/events", body=event)

    def _create_template_claims(self, pod: JsonObject, entries: list[str]) -> None:
        namespace, pod_name = _key(pod)
        bound = bool((pod.get("spec") or {}).get("nodeName"))
        statuses = list((pod.get("status") or {}).get("resourceClaimStatuses") or [])
        # findPodResourceClaim: a claim created on an earlier pass whose pod status update did not happen.
        owned = {
            (c["metadata"].get("annotations") or {}).get(POD_CLAIM_NAME_ANNOTATION): c["metadata"]["name"]
            for c in self._items(f"{RESOURCE}/namespaces/{namespace}/resourceclaims")
            if any(o.get("uid") == pod["metadata"]["uid"] for o in c["metadata"].get("ownerReferences") or [])
        }
        for entry in (pod.get("spec") or {}).get("resourceClaims") or []:
            if entry.get("name") not in entries:
                continue
            if owned.get(entry.get("name")):
                statuses.append({"name": entry["name"], "resourceClaimName": owned[entry.get("name")]})
                continue
            template_name = entry.get("resourceClaimTemplateName")
            template = self._rest.get(f"{RESOURCE}/namespaces/{namespace}/resourceclaimtemplates/{template_name}")
            if template is None:
                self._claim_creation_failed(
                    pod, str(entry.get("name")),
                    f'resource claim template "{template_name}": resourceclaimtemplate.resource.k8s.io '
                    f'"{template_name}" not found', waiting=True)
                if not bound:
                    self._unschedulable(pod, f"ResourceClaimTemplate {template_name} not found")
                return
            template_meta = template["spec"].get("metadata") or {}
            claim = {
                "apiVersion": "resource.k8s.io/v1",
                "kind": "ResourceClaim",
                "metadata": {
                    "generateName": claim_generate_name(pod_name, str(entry["name"])),
                    "namespace": namespace,
                    "annotations": {
                        **(template_meta.get("annotations") or {}),
                        POD_CLAIM_NAME_ANNOTATION: entry["name"],
                    },
                    "ownerReferences": [
                        {
                            "apiVersion": "v1",
                            "kind": "Pod",
                            "name": pod_name,
                            "uid": pod["metadata"]["uid"],
                            "controller": True,
                            "blockOwnerDeletion": True,
                        }
                    ],
                    **(
                        {"labels": template["spec"]["metadata"]["labels"]}
                        if (template["spec"].get("metadata") or {}).get("labels")
                        else {}
                    ),
                },
                "spec": template["spec"]["spec"],
            }
            created = self._rest.request("POST", f"{RESOURCE}/namespaces/{namespace}/resourceclaims", body=claim)
            statuses.append({"name": entry["name"], "resourceClaimName": created["metadata"]["name"]})
        merge_patch(self._rest, f"/api/v1/namespaces/{namespace}/pods/{pod_name}/status",
                    {"status": {"resourceClaimStatuses": statuses}})

    def _unschedulable(self, pod: JsonObject, message: str) -> None:
        namespace, name = _key(pod)
        conditions = [c for c in (pod.get("status") or {}).get("conditions") or [] if c.get("type") != "PodScheduled"]
        current = next(
            (c for c in (pod.get("status") or {}).get("conditions") or [] if c.get("type") == "PodScheduled"), None
        )
        if current and current.get("message") == message:
            return  # no write when nothing changed
        conditions.append({"type": "PodScheduled", "status": "False", "reason": "Unschedulable", "message": message})
        merge_patch(self._rest, f"/api/v1/namespaces/{namespace}/pods/{name}/status",
                    {"status": {"phase": "Pending", "conditions": conditions}})

    def _bind(self, pod: JsonObject, node: str) -> None:
        namespace, name = _key(pod)
        binding = {
            "apiVersion": "v1",
            "kind": "Binding",
            "metadata": {"name": name, "namespace": namespace},
            "target": {"apiVersion": "v1", "kind": "Node", "name": node},
        }
        try:
            self._rest.request("POST", f"/api/v1/namespaces/{namespace}/pods/{name}/binding", body=binding)
        except ApiError as exc:
            if exc.status not in (404, 405):
                raise
            merge_patch(self._rest, f"/api/v1/namespaces/{namespace}/pods/{name}", {"spec": {"nodeName": node}})
