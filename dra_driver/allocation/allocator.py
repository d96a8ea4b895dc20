"""allocate(): what the kube-scheduler's DRA plugin does for one claim on one candidate node;
allocate_pod_claims(): for all claims of a pod together, backtracking across them as upstream's allocator does.

Pure: it takes API objects (JSON dicts as the API server returns them) and returns an
AllocationOutcome; the caller reads objects from the API server and writes the result back.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Required, TypedDict, Unpack

from dra_driver.allocation.context import AllocationContext, FeatureGates, SelectorFailure
from dra_driver.allocation.diagnose import explain_request, unsatisfiable_constraints
from dra_driver.allocation.inuse import InUse, gather_in_use
from dra_driver.allocation.model import ADMIN_ACCESS_LABEL, DeviceClass, Node, parse_class, parse_node
from dra_driver.allocation.outcome import AllocationOutcome, Explanation, PodAllocationOutcome, RequestExplanation
from dra_driver.allocation.pools import NodePools, SliceIndex, gather_pools
from dra_driver.allocation.result import build_allocation
from dra_driver.allocation.search import MAX_RESULTS, ClaimPart, Search, SearchLimitExceeded
from dra_driver.cel import DraCelEnvironment
from dra_driver.resourceapi import MODE_ALL, InvalidObjectError, ResourceClaim, parse_resource_claim

# Placements tried before giving up (devices the selectors reject are never tried); the scheduler's analogue is its
# 10 s filter timeout.
DEFAULT_MAX_STEPS = 200_000

JSON = Mapping[str, Any]


def _random_share_id() -> str:
    return str(uuid.uuid4())


def _claim_errors(
    claim: ResourceClaim,
    gates: FeatureGates,
    classes: Mapping[str, DeviceClass],
    class_errors: Mapping[str, str],
    namespace_labels: Mapping[str, str],
) -> list[str]:
    """Problems that make the claim unallocatable on any node, found before any device is tried."""
    errors: list[str] = []
    admin_allowed = namespace_labels.get(ADMIN_ACCESS_LABEL) == "true"
    for request in claim.requests:
        if request.first_available and not gates.prioritized_list:
            errors.append(
                f"request {request.name!r} uses firstAvailable, but the DRAPrioritizedList feature is disabled"
            )
        for alt in request.alternatives:
            label = f"request {request.name}/{alt.name}" if request.first_available else f"request {request.name}"
            if alt.derived_attributes and not gates.derived_attributes:
                # kube-scheduler's allocators refuse the request rather than ignore the constraint (1.37).
                errors.append(f"{label} has derived attributes, but the DRADerivedAttributes feature is disabled")
            if alt.capacity and not gates.consumable_capacity:
                errors.append(f"{label} has capacity requests, but the DRAConsumableCapacity feature is disabled")
            if alt.admin_access:
                if not gates.admin_access:
                    errors.append(f"{label} asks for admin access, but the DRAAdminAccess feature is disabled")
                elif not admin_allowed:
                    errors.append(
                        f"{label}: admin access is not allowed in namespace {claim.namespace!r}; "
                        f"label the namespace {ADMIN_ACCESS_LABEL}=true to allow it"
                    )
            if alt.class_name in class_errors:
                errors.append(f"{label}: device class {alt.class_name!r} is invalid: {class_errors[alt.class_name]}")
            elif alt.class_name not in classes:
                errors.append(f"{label}: device class {alt.class_name!r} not found")
    minimum = sum(min(a.count if a.mode != MODE_ALL else 1 for a in r.alternatives) for r in claim.requests)
    if minimum > MAX_RESULTS:
        errors.append(f"the claim asks for at least {minimum} devices; an allocation holds at most {MAX_RESULTS}")
    return errors


@dataclass(frozen=True)
class _Inputs:
    """What every claim allocated on one node shares: the node, gates, CEL environment, classes and pools."""

    node: Node
    gates: FeatureGates
    cel: DraCelEnvironment
    classes: Mapping[str, DeviceClass]
    class_errors: Mapping[str, str]
    pools: NodePools


def _inputs(
    node: JSON,
    classes: Iterable[JSON],
    slices: Iterable[JSON] | SliceIndex,
    feature_gates: Mapping[str, bool] | None,
    cel: DraCelEnvironment | None,
) -> _Inputs:
    node_obj = parse_node(node)
    gates = FeatureGates.from_mapping(feature_gates)
    cel_env = cel if cel is not None else DraCelEnvironment(consumable_capacity=gates.consumable_capacity)
    class_map: dict[str, DeviceClass] = {}
    class_errors: dict[str, str] = {}
    parse = slices.device_class if isinstance(slices, SliceIndex) else parse_class
    for raw in classes:
        try:
            parsed_class = parse(raw)
        except InvalidObjectError as err:
            meta = raw.get("metadata")
            name = meta.get("name") if isinstance(meta, Mapping) else None
            if isinstance(name, str):
                class_errors[name] = str(err)
            continue
        class_map[parsed_class.name] = parsed_class
    pools = gather_pools(slices, node_obj, partitionable=gates.partitionable_devices,
                         compatibility_groups=gates.compatibility_groups)
    return _Inputs(node_obj, gates, cel_env, class_map, class_errors, pools)


def _fail(
    ctx: AllocationContext,
    summary: str,
    errors: list[str],
    *,
    diagnose: bool,
    constraints: list[str] | None = None,
    reason: str = "",
    requests: list[RequestExplanation] | None = None,
) -> AllocationOutcome:
    claim = ctx.claim
    if requests is None:
        requests = []
        if diagnose:
            requests = [explain_request(ctx, r, alt) for r in claim.requests for alt in r.alternatives]
    explanation = Explanation(
        claim=claim.key,
        node=ctx.node.name,
        summary=summary,
        requests=tuple(requests),
        pool_problems=tuple(str(p) for p in ctx.pools.problems),
        unsatisfiable_constraints=tuple(constraints or ()),
        errors=tuple(errors),
        reason=reason,
    )
    return AllocationOutcome(claim.key, ctx.node.name, None, explanation)


def _prepare(
    claim: ResourceClaim, inputs: _Inputs, in_use: InUse, namespace_labels: Mapping[str, str]
) -> AllocationContext | AllocationOutcome:
    """The claim's context, or why no node can take it (problems found before any device is tried)."""
    ctx = AllocationContext(
        claim=claim, node=inputs.node, gates=inputs.gates, pools=inputs.pools, in_use=in_use, classes=inputs.classes,
        cel=inputs.cel,
    )
    if not claim.requests:
        return _fail(ctx, "the claim has no device requests", ["spec.devices.requests is empty"], diagnose=False)
    errors = _claim_errors(claim, inputs.gates, inputs.classes, inputs.class_errors, namespace_labels)
    compile_problems: list[str] = []
    for request in claim.requests:
        for alt in request.alternatives:
            if alt.class_name in inputs.classes:
                compile_problems.extend(ctx.compile_errors(alt))
            if inputs.gates.derived_attributes:
                compile_problems.extend(ctx.derived_compile_errors(request.name, alt))
            if alt.mode == MODE_ALL and inputs.pools.problems:
                errors.append(f"request {request.name!r} asks for all devices, but {inputs.pools.problems[0]}")
    errors.extend(compile_problems)
    if errors:
        # Per-device accounting evaluates selectors, so skip it when a selector does not even compile.
        return _fail(ctx, errors[0], errors, diagnose=not compile_problems)
    return ctx


def _selector_failure(ctx: AllocationContext, failure: SelectorFailure) -> AllocationOutcome:
    message = f"CEL runtime error in {failure.source} on device {failure.device}: {failure.error.reason}"
    reason = f"CEL runtime error: {failure.error.reason} (in {failure.source})"
    return _fail(ctx, f"allocation aborted: {message}", [message], diagnose=True, reason=reason)


class AllocateOptions(TypedDict, total=False):
    """The keywords of `allocate_pod_claims`, which `allocate` passes on (their defaults are its)."""

    node: Required[JSON]
    classes: Required[Iterable[JSON]]
    slices: Required[Iterable[JSON] | SliceIndex]
    allocated_claims: Iterable[JSON]
    namespace_labels: Mapping[str, str] | None
    feature_gates: Mapping[str, bool] | None
    cel: DraCelEnvironment | None
    new_share_id: Callable[[], str]
    max_steps: int


def allocate(claim: JSON, **options: Unpack[AllocateOptions]) -> AllocationOutcome:
    """Allocate `claim` on `node`, or explain why it cannot be: `allocate_pod_claims` for a pod of one claim."""
    pod = allocate_pod_claims([claim], **options)
    return pod.outcomes[0] if pod.failure is None else pod.failure


@dataclass(frozen=True)
class _PodPass:
    """What each claim of a pod is allocated with on one node (`allocate_pod_claims`' keywords)."""

    node: JSON
    classes: Sequence[JSON]
    slices: SliceIndex
    namespace_labels: Mapping[str, str]
    feature_gates: Mapping[str, bool] | None
    cel: DraCelEnvironment | None
    new_share_id: Callable[[], str]
    max_steps: int

    def inputs(self) -> _Inputs:
        return _inputs(self.node, self.classes, self.slices, self.feature_gates, self.cel)


def _allocate_claim(claim: JSON, allocated_claims: Iterable[JSON], pod: _PodPass) -> AllocationOutcome:
    """One claim, given the allocations of `allocated_claims` (this claim itself is ignored among them)."""
    parse = pod.slices.allocated_claim  # one parse of the claim for every node of a pass
    parsed = parse(claim)
    inputs = pod.inputs()
    in_use = gather_in_use(allocated_claims, skip_claims={parsed.key}, parse=parse)
    prepared = _prepare(parsed, inputs, in_use, pod.namespace_labels)
    if isinstance(prepared, AllocationOutcome):
        return prepared
    ctx = prepared
    try:
        picks = Search(ctx, constraints=parsed.constraints, max_steps=pod.max_steps).run()
    except SelectorFailure as failure:
        return _selector_failure(ctx, failure)
    except SearchLimitExceeded as exceeded:
        return _fail(ctx, f"allocation aborted: {exceeded}", [str(exceeded)], diagnose=True)
    if picks is not None:
        return AllocationOutcome(parsed.key, inputs.node.name, build_allocation(ctx, picks, pod.new_share_id), None)
    return _explain_failure(ctx, pod.max_steps)


def _explain_failure(ctx: AllocationContext, max_steps: int) -> AllocationOutcome:
    """Why a claim whose every check passed has no allocation on the node: the request that cannot be served,
    the constraint that cannot be met, or requests that compete for the same devices."""
    parsed = ctx.claim
    explained = [explain_request(ctx, r, alt) for r in parsed.requests for alt in r.alternatives]
    for request in parsed.requests:
        names = {f"{request.name}/{a.name}" if request.first_available else request.name for a in request.alternatives}
        blocked = [e for e in explained if e.request in names and e.problem is not None]
        if len(blocked) == len(request.alternatives):
            summary = f"request {blocked[0].request!r} cannot be satisfied: {blocked[0].problem}"
            if request.first_available:
                summary = f"no subrequest of {request.name!r} can be satisfied; first: {blocked[0].problem}"
            return _fail(ctx, summary, [], diagnose=True, reason=_blocked_reason(blocked[0]), requests=explained)
    failing, solvable_without = unsatisfiable_constraints(ctx, max_steps)
    # An All-mode request has no choice of devices: kube-scheduler's allocator reports a constraint its devices
    # break as an error ("cannot add device ... because a claim constraint would not be satisfied"), not as a
    # node that does not fit.
    all_mode = {r.name for r in parsed.requests if any(a.mode == MODE_ALL for a in r.alternatives)}
    fatal = [str(c) for c in parsed.constraints if all_mode and str(c) in failing
             and (not c.requests or {name.split("/")[0] for name in c.requests} & all_mode)]
    if fatal:
        message = f"a request asks for all devices, but they cannot satisfy constraint {fatal[0]}"
        return _fail(ctx, message, [message], diagnose=True, constraints=failing, requests=explained)
    if failing:
        summary = f"constraint {failing[0]} cannot be satisfied by the available devices"
    elif solvable_without:
        summary = "the constraints cannot all be satisfied together by the available devices"
    else:
        summary = (
            "each request can be satisfied on its own, but not all together: "
            "they compete for the same devices, shared counters or capacity"
        )
    return _fail(ctx, summary, [], diagnose=True, constraints=failing, requests=explained)


def allocate_pod_claims(
    claims: Sequence[JSON],
    *,
    node: JSON,
    classes: Iterable[JSON],
    slices: Iterable[JSON] | SliceIndex,
    allocated_claims: Iterable[JSON] = (),
    namespace_labels: Mapping[str, str] | None = None,
    feature_gates: Mapping[str, bool] | None = None,
    cel: DraCelEnvironment | None = None,
    new_share_id: Callable[[], str] = _random_share_id,
    max_steps: int = DEFAULT_MAX_STEPS,
) -> PodAllocationOutcome:
    """Allocate all of a pod's claims on `node` together, or explain why not (the explanation of the first claim
    that fails when the earlier ones hold their first allocations).

    Upstream's allocator takes all claims of a pod in one search and backtracks across them
    (staging/src/k8s.io/dynamic-resource-allocation/structured, `Allocator.Allocate(ctx, node, claims)`). The
    first solution of that search is, when it exists, the one found claim after claim (each claim's first
    allocation given the earlier ones'), so claims are tried one after the other first, and the joint search
    runs only where that fails past the first claim: the common case costs no more than before.

    `allocated_claims` are the cluster's claims that already hold an allocation (a claim being allocated is ignored
    among them). `cel` should be a long-lived environment so compiled selectors are reused, and `slices` a SliceIndex
    shared by every call of a pass over many nodes, so each slice is parsed once. Raises InvalidObjectError for a
    malformed claim, node or allocated claim; a malformed slice only invalidates its pool and a malformed class only
    fails the requests that use it."""
    pod = _PodPass(node, list(classes), slices if isinstance(slices, SliceIndex) else SliceIndex(slices),
                   namespace_labels or {}, feature_gates, cel, new_share_id, max_steps)
    cluster = list(allocated_claims)
    allocated = list(cluster)
    done: list[AllocationOutcome] = []
    for position, claim in enumerate(claims):
        outcome = _allocate_claim(claim, allocated, pod)
        if outcome.ok:
            done.append(outcome)
            allocated.append({**claim, "status": {"allocation": outcome.allocation}})
            continue
        assert outcome.explanation is not None
        # The first claim fails on the cluster's allocations alone, and an error fails every search: no other
        # choice for the earlier claims can help.
        if position == 0 or outcome.explanation.errors:
            return PodAllocationOutcome((), outcome)
        together = _allocate_together(claims, cluster, pod)
        return together if together is not None else PodAllocationOutcome((), outcome)
    return PodAllocationOutcome(tuple(done), None)


def _allocate_together(
    claims: Sequence[JSON], allocated_claims: Sequence[JSON], pod: _PodPass
) -> PodAllocationOutcome | None:
    """One search over all claims' requests; None when it finds nothing (the claim-by-claim explanation
    stands)."""
    parsed = [parse_resource_claim(c) for c in claims]
    inputs = pod.inputs()
    in_use = gather_in_use(allocated_claims, skip_claims={c.key for c in parsed}, parse=pod.slices.allocated_claim)
    parts: list[ClaimPart] = []
    for claim in parsed:
        prepared = _prepare(claim, inputs, in_use, pod.namespace_labels)
        if isinstance(prepared, AllocationOutcome):
            return PodAllocationOutcome((), prepared)
        parts.append(ClaimPart(prepared, claim.constraints))
    # The budget of the claims one after the other: never fewer placements than that path needed.
    search = Search.of_claims(parts, max_steps=pod.max_steps * len(parts))
    try:
        picks = search.run()
    except SelectorFailure as failure:
        return PodAllocationOutcome((), _selector_failure(parts[search.claim].ctx, failure))
    except SearchLimitExceeded:
        return None
    if picks is None:
        return None
    return PodAllocationOutcome(tuple(
        AllocationOutcome(part.ctx.claim.key, inputs.node.name,
                          build_allocation(part.ctx, [p for p in picks if p.claim == i], pod.new_share_id), None)
        for i, part in enumerate(parts)
    ), None)


def _blocked_reason(blocked: RequestExplanation) -> str:
    """`request 'r': needs 1 device, 0 available (<the leading device reason>)`, without device names, so that
    nodes of the same kind give the same text."""
    reason = f"request {blocked.request!r}: {blocked.problem}"
    if blocked.leading:
        reason += f" ({blocked.leading})"
    return reason
