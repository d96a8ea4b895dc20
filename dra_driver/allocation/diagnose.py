"""Why a claim cannot be allocated: per-request device accounting and the claim-level verdict.

Each device on the node is judged against each request on its own (against the cluster's existing
allocations, not against the other requests of this claim) and counted under the first check it
fails, in the allocator's order. When every request could be served alone, the constraints are
tested one by one with the real search to name the ones that cannot be met.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from dra_driver.allocation import compatibility
from dra_driver.allocation.context import AllocationContext, Reject, SelectorFailure, alt_key
from dra_driver.allocation.outcome import ReasonCount, RequestExplanation
from dra_driver.allocation.pools import Candidate
from dra_driver.allocation.search import Search, SearchLimitExceeded
from dra_driver.resourceapi import MODE_ALL, Constraint, ExactRequest, Request

MAX_EXAMPLES = 3


@dataclass
class _Tally:
    counts: dict[str, int] = field(default_factory=dict)
    examples: dict[str, list[str]] = field(default_factory=dict)
    details: dict[str, str] = field(default_factory=dict)  # the first detail per reason

    def add(self, reject: Reject, device: str) -> None:
        self.counts[reject.key] = self.counts.get(reject.key, 0) + 1
        if reject.detail:
            self.details.setdefault(reject.key, reject.detail)
        examples = self.examples.setdefault(reject.key, [])
        if len(examples) < MAX_EXAMPLES:
            examples.append(f"{device} ({reject.detail})" if reject.detail else device)

    def add_group(self, reject: Reject, devices: list[Candidate]) -> None:
        """`add` for each of `devices`, in order, without naming those past the examples."""
        for cand in devices[:MAX_EXAMPLES]:
            self.add(reject, str(cand.id))
        if len(devices) > MAX_EXAMPLES:
            self.counts[reject.key] += len(devices) - MAX_EXAMPLES

    def leading(self) -> str:
        """The most frequent reason with its first detail, no device names ("" when nothing was rejected)."""
        if not self.counts:
            return ""
        key = min(self.counts.items(), key=lambda kv: (-kv[1], kv[0]))[0]
        detail = self.details.get(key)
        return f"{key}: {detail}" if detail else key

    def reasons(self) -> tuple[ReasonCount, ...]:
        ordered = sorted(self.counts.items(), key=lambda kv: (-kv[1], kv[0]))
        return tuple(ReasonCount(key, count, tuple(self.examples[key])) for key, count in ordered)


def _wanted(alt: ExactRequest) -> str:
    if alt.mode == MODE_ALL:
        return "all matching devices"
    return f"{alt.count} device" + ("s" if alt.count != 1 else "")


def device_verdict(ctx: AllocationContext, request: Request, alt: ExactRequest, cand: Candidate) -> Reject | None:
    """The first check `cand` fails for this (sub)request, or None when it could be allocated."""
    if not alt.admin_access and cand.id in ctx.in_use.exclusive:
        return Reject(f"allocated to claim {ctx.in_use.exclusive[cand.id]}")
    key = alt_key(request.name, alt, request.first_available)
    try:
        selected = ctx.selectable(key, alt, cand)
    except SelectorFailure as failure:
        return Reject(f"CEL runtime error in {failure.source}: {failure.error.reason}")
    if selected is not None:
        return selected
    capacity = ctx.capacity(alt, cand, {})
    if isinstance(capacity, Reject):
        return capacity
    device = cand.device
    if device.consumes_counters and not ctx.gates.partitionable_devices:
        return Reject("consumes shared counters but DRAPartitionableDevices is disabled")
    multi = device.allow_multiple_allocations and ctx.gates.consumable_capacity
    shared_in_use = multi and cand.id in ctx.in_use.shared
    if ctx.gates.compatibility_groups and device.consumes_counters and not shared_in_use:
        baseline = ctx.group_baseline((cand.id.driver, cand.id.pool))
        for consumption in device.consumes_counters:
            state = baseline.get(consumption.counter_set)
            if not compatibility.admits(state, consumption.groups):
                theirs = ", ".join(sorted(state.groups)) if state is not None and state.groups else "none"
                return Reject(
                    f"its compatibility groups do not intersect those allocated on counter set "
                    f"{consumption.counter_set!r} (KEP-5963)",
                    f"device: {', '.join(sorted(consumption.groups)) or 'none'}; allocated: {theirs}",
                )
    if device.consumes_counters and not alt.admin_access and not shared_in_use:
        counters = ctx.counters(cand, {})
        if counters is not None:
            return _passthrough_reason(ctx, cand, counters)
    return ctx.taint(alt, cand)


PASSTHROUGH_TYPE = "vfio"  # the `type` attribute of this driver's passthrough devices (docs/passthrough.md)
VGPU_TYPE = "vgpu"  # the `type` attribute of this driver's vGPU slots (docs/vgpu.md)
# The `type` attribute of this driver's Fabric Manager partitions (docs/passthrough.md "Fabric Manager partitions").
FM_PARTITION_TYPE = "fm-partition"
IOMMU_GROUP_SET_PREFIX = "iommu-group-"  # the counter sets of shared IOMMU groups (slices/iommu.py)


def _passthrough_reason(ctx: AllocationContext, cand: Candidate, counters: Reject) -> Reject:
    """A passthrough device (type `vfio`) needs its GPU's whole counter set: say that the GPU is in use for containers
    and by what, rather than which counter ran out (every counter of the set is a part of the same one GPU). A vGPU
    slot (type `vgpu`) needs its type's share of the GPU's memory: likewise, by what it is held. A Fabric Manager
    partition (type `fm-partition`) needs every use of each of its GPUs (the node's fabric counter set): which of its
    GPUs are in use does not matter to the reader as much as by what."""
    attributes = cand.device.attributes
    kind = attributes.get("type", attributes.get(f"{cand.id.driver}/type"))
    if kind not in (PASSTHROUGH_TYPE, VGPU_TYPE, FM_PARTITION_TYPE):
        return counters
    sets = [c.counter_set for c in cand.device.consumes_counters]
    holders = {s: ctx.counter_holders((cand.id.driver, cand.id.pool), s, cand.id.device) for s in sets}
    held = ", ".join(h for h in holders.values() if h)
    if kind == VGPU_TYPE:
        return Reject(
            "the GPU has no room for this vGPU: its share of the GPU's memory is held by the whole GPU, its "
            "partitions, its passthrough or other vGPUs",
            f"held by {held}" if held else "its counter set is held by other allocations",
        )
    if kind == FM_PARTITION_TYPE:
        return Reject(
            "a GPU of this Fabric Manager partition is in use: a partition needs every use of each of its GPUs "
            "(whole, MIG, shares, passthrough, vGPUs, other partitions over them)",
            f"held by {held}" if held else "its counter set is held by other allocations",
        )
    # slices/iommu.py: GPUs that share an IOMMU group with a passthrough GPU draw from the group's set too.
    own = any(h for s, h in holders.items() if not s.startswith(IOMMU_GROUP_SET_PREFIX))
    if not own and held:
        return Reject(
            "the GPU shares its IOMMU group with a GPU in use: a passthrough device takes the whole group",
            f"held by {held}",
        )
    return Reject(
        "the GPU is in use for containers: a passthrough device needs the GPU's whole counter set",
        f"held by {held}" if held else "its counter set is held by other allocations",
    )


def explain_request(ctx: AllocationContext, request: Request, alt: ExactRequest) -> RequestExplanation:
    name = f"{request.name}/{alt.name}" if request.first_available else request.name
    considered = len(ctx.pools.candidates) + len(ctx.pools.unusable_devices)
    if alt.class_name not in ctx.classes:
        return RequestExplanation(
            name, alt.class_name, _wanted(alt), considered, 0, (), f"device class {alt.class_name!r} not found"
        )
    tally = _Tally()
    matching_tally = _Tally()  # verdicts of the devices the selectors match
    for device_id, pool_problem in ctx.pools.unusable_devices:
        tally.add(Reject(str(pool_problem)), str(device_id))
    available = 0
    matching = 0
    unavailable_matching = 0
    key = alt_key(request.name, alt, request.first_available)
    selected = ctx.verdicts(key, alt)
    # Devices the selectors reject (free ones: an allocated device is rejected for that first) are counted per
    # reason in one go; only the others are judged one by one.
    rejected: dict[Reject, list[Candidate]] = {}
    in_use = ctx.in_use.exclusive if not alt.admin_access else {}
    for cand in ctx.pools.candidates:
        selector = selected[cand.order]
        if isinstance(selector, Reject) and (not in_use or cand.id not in in_use):
            rejected.setdefault(selector, []).append(cand)
            continue
        verdict = device_verdict(ctx, request, alt, cand)
        is_match = selector is None
        if is_match:
            matching += 1
        if verdict is None:
            available += 1
        else:
            tally.add(verdict, str(cand.id))
            if is_match:
                unavailable_matching += 1
                matching_tally.add(verdict, "")
    for reject, devices in rejected.items():
        tally.add_group(reject, devices)
    problem: str | None = None
    if alt.mode == MODE_ALL:
        if ctx.pools.problems:
            problem = f"asks for all devices, but {ctx.pools.problems[0]}"
        elif matching == 0:
            problem = "allocationMode All needs at least one matching device; none matches"
        elif unavailable_matching:
            problem = (
                f"allocationMode All needs every matching device, but {unavailable_matching} of {matching} "
                "cannot be allocated"
            )
    elif available < alt.count:
        problem = f"needs {_wanted(alt)}, {available} available"
    leading = matching_tally.leading() or tally.leading()
    return RequestExplanation(
        name, alt.class_name, _wanted(alt), considered, available, tally.reasons(), problem, leading
    )


def unsatisfiable_constraints(ctx: AllocationContext, max_steps: int) -> tuple[list[str], bool]:
    """(constraints that fail even alone, whether the claim is satisfiable without any constraint)."""

    def solvable(constraints: tuple[Constraint, ...]) -> bool | None:
        try:
            return Search(ctx, constraints=constraints, max_steps=max_steps).run() is not None
        except (SelectorFailure, SearchLimitExceeded):
            return None

    if not ctx.claim.constraints or not solvable(()):
        return [], False
    failing = [str(c) for c in ctx.claim.constraints if solvable((c,)) is False]
    return failing, True
