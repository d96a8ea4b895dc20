"""Backtracking search over the requests of one claim, or of all claims of a pod together, in the order the
kube-scheduler's allocator uses (staging/src/k8s.io/dynamic-resource-allocation/structured: the claims of a pod are
one search, claim after claim, and a claim that cannot be served makes the search revisit the earlier claims'
devices, as upstream's test case `small-and-large-backtrack-claims` requires).

Requests are served in claim order; a firstAvailable request tries its subrequests in order; an
ExactCount request picks devices as combinations in slice/device order (never permutations); an All
request must take every matching device. When a later request cannot be satisfied the search undoes
the latest pick and tries the next device, so a satisfiable claim is always found (within max_steps).
Per device the checks run in the scheduler's order: in use, selectors, capacity, counters, taints,
constraints.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from dra_driver.allocation import compatibility
from dra_driver.allocation.compatibility import GroupState
from dra_driver.allocation.context import AllocationContext, AltKey, Reject, alt_key
from dra_driver.allocation.inuse import CounterKey, capacity_key
from dra_driver.allocation.pools import Candidate, PoolKey
from dra_driver.cel import DerivedValue
from dra_driver.k8s.quantity import Quantity
from dra_driver.resourceapi import MODE_ALL, Constraint, DeviceId, ExactRequest, Request

# resource.k8s.io/v1 AllocationResultsMaxSize.
MAX_RESULTS = 32


class SearchLimitExceeded(Exception):
    """The search tried more device placements than allowed (the scheduler's filter timeout analogue)."""


@dataclass(frozen=True)
class ClaimPart:
    """One claim of the search: its context (selector verdicts, devices in use, pools) and its constraints."""

    ctx: AllocationContext
    constraints: tuple[Constraint, ...]


@dataclass(frozen=True)
class _Slot:
    """One request of the flattened search, with what the MAX_RESULTS check needs."""

    claim: int
    request: Request
    remaining_minimum: int  # the fewest devices the claim's later requests need


@dataclass(frozen=True)
class Pick:
    request: Request
    alt: ExactRequest
    cand: Candidate
    consumed: dict[str, Quantity]  # consumed capacity for a share ({} for an exclusive device)
    share: bool  # a share of a multi-allocatable device (gets a shareID)
    claim: int = 0  # index of the claim among the search's parts

    @property
    def request_name(self) -> str:
        return f"{self.request.name}/{self.alt.name}" if self.request.first_available else self.request.name


Comparable = frozenset[tuple[str, str]]
GroupChange = tuple[tuple[PoolKey, str], GroupState | None]  # a counter set's group state before a pick


def _comparable(value: DerivedValue | list[Any]) -> Comparable:
    """An attribute as a set of values (KEP-5491): a list-type attribute is the set of its items, a scalar a set
    of one. Types stay apart (True must not equal 1); versions compare by their exact string, as Kubernetes does."""
    items = value if isinstance(value, list) else [value]
    return frozenset((type(v).__name__, str(v)) for v in items)


def constraint_admits(kind: str, seen: list[Comparable], value: Comparable) -> bool:
    """matchAttribute: every device's values share at least one (a non-empty intersection; for scalars: equal).
    distinctAttribute: no two devices share a value (pairwise disjoint; for scalars: all different)."""
    if kind == "matchAttribute":
        common = value
        for other in seen:
            common = common & other
        return bool(common)
    return all(value.isdisjoint(other) for other in seen)


def constraint_applies(constraint: Constraint, request: str, sub: str | None) -> bool:
    if not constraint.requests:
        return True
    return request in constraint.requests or (sub is not None and f"{request}/{sub}" in constraint.requests)


class Search:
    """`Search(ctx, constraints=..., max_steps=...)` searches one claim; `Search.of_claims(parts, max_steps)` all
    claims of a pod together (devices, shares and counters taken by one claim are unavailable to the next; each
    claim keeps its own constraints and its own MAX_RESULTS)."""

    def __init__(
        self,
        ctx: AllocationContext,
        *,
        constraints: Sequence[Constraint],
        max_steps: int,
        more: Sequence[ClaimPart] = (),
    ) -> None:
        self.parts = (ClaimPart(ctx, tuple(constraints)), *more)
        slots: list[_Slot] = []
        for claim, part in enumerate(self.parts):
            requests = part.ctx.claim.requests
            for i, request in enumerate(requests):
                later = sum(min(a.count if a.mode != MODE_ALL else 1 for a in r.alternatives) for r in requests[i + 1:])
                slots.append(_Slot(claim, request, later))
        self.slots = tuple(slots)
        self.max_steps = max_steps
        self.steps = 0
        self.claim = 0  # the claim whose request is being tried (names the claim of a SelectorFailure)
        # Devices held exclusively -> the claim holding them; admin-access picks (claim, device): an admin-access
        # request ignores what other claims hold, and other claims ignore its picks (as for allocated claims).
        self.exclusive: dict[DeviceId, int] = {}
        self.admin: set[tuple[int, DeviceId]] = set()
        self.shares: dict[DeviceId, dict[str, int]] = {}
        self.share_counts: dict[DeviceId, int] = {}
        self.counters: dict[tuple[PoolKey, CounterKey], int] = {}
        self.constraint_values: list[list[list[Comparable]]] = [
            [[] for _ in part.constraints] for part in self.parts
        ]
        self.picks: list[Pick] = []
        self.claim_picks = [0 for _ in self.parts]
        # KEP-5963: per (pool, counter set), the compatibility groups of what this search put there (over the
        # allocated devices' baseline).
        self.group_states: dict[tuple[PoolKey, str], GroupState] = {}
        # One entry per pick: (constraint values added, counters drawn, share, group states it replaced) so _undo is
        # exact.
        self._undo_log: list[tuple[list[tuple[int, Comparable]], bool, bool, list[GroupChange]]] = []
        self._all_devices: dict[tuple[int, AltKey], list[Candidate]] = {}
        self._eligible: dict[tuple[int, AltKey], list[Candidate]] = {}

    @classmethod
    def of_claims(cls, parts: Sequence[ClaimPart], *, max_steps: int) -> Search:
        first, *rest = parts
        return cls(first.ctx, constraints=first.constraints, max_steps=max_steps, more=rest)

    # -- public -------------------------------------------------------------------------------
    def run(self) -> list[Pick] | None:
        """The first solution in search order, or None. Raises SelectorFailure / SearchLimitExceeded."""
        return list(self.picks) if self._solve(0) else None

    # -- recursion ----------------------------------------------------------------------------
    def _solve(self, index: int) -> bool:
        if index == len(self.slots):
            return True
        slot = self.slots[index]
        self.claim = slot.claim
        return any(self._solve_alt(index, slot, alt) for alt in slot.request.alternatives)

    def _solve_alt(self, index: int, slot: _Slot, alt: ExactRequest) -> bool:
        request = slot.request
        key = alt_key(request.name, alt, request.first_available)
        if alt.mode == MODE_ALL:
            devices = self.all_devices(key, alt, slot.claim)
            if not devices or (self.claim_picks[slot.claim] + len(devices) + slot.remaining_minimum > MAX_RESULTS):
                return False
            added = 0
            for cand in devices:
                if not self._try_add(slot, alt, key, cand):
                    break
                added += 1
            if added == len(devices) and self._solve(index + 1):
                return True
            for _ in range(added):
                self._undo()
            return False
        return self._pick(index, slot, alt, key, 0, 0)

    def eligible(self, key: AltKey, alt: ExactRequest, claim: int = 0) -> list[Candidate]:
        """The candidates the selectors do not reject, in search order (those whose selector fails to evaluate
        stay, so that the search meets the failure where it would). The search only walks these: on a fleet's
        node most devices are other products or types, rejected as whole groups by their selector verdict."""
        found = self._eligible.get((claim, key))
        if found is None:
            ctx = self.parts[claim].ctx
            verdicts = ctx.verdicts(key, alt)
            found = [c for c in ctx.pools.candidates if not isinstance(verdicts[c.order], Reject)]
            self._eligible[(claim, key)] = found
        return found

    def _pick(self, index: int, slot: _Slot, alt: ExactRequest, key: AltKey, taken: int, start: int) -> bool:
        if taken == alt.count:
            return self._solve(index + 1)
        if self.claim_picks[slot.claim] + (alt.count - taken) + slot.remaining_minimum > MAX_RESULTS:
            return False
        candidates = self.eligible(key, alt, slot.claim)
        for position in range(start, len(candidates)):
            cand = candidates[position]
            if not self._try_add(slot, alt, key, cand):
                continue
            if self._pick(index, slot, alt, key, taken + 1, position + 1):
                return True
            self._undo()
        return False

    # -- device placement ---------------------------------------------------------------------
    def all_devices(self, key: AltKey, alt: ExactRequest, claim: int = 0) -> list[Candidate]:
        """For allocationMode All: every device on the node that matches the selectors (and, with
        consumable capacity, could hold the capacity request), whether or not it is free."""
        found = self._all_devices.get((claim, key))
        if found is None:
            ctx = self.parts[claim].ctx
            found = []
            for cand in self.eligible(key, alt, claim):
                if ctx.selectable(key, alt, cand) is not None:
                    continue
                if ctx.gates.consumable_capacity and not isinstance(ctx.capacity(alt, cand, {}), dict):
                    continue
                found.append(cand)
            self._all_devices[(claim, key)] = found
        return found

    def _in_use(self, claim: int, ctx: AllocationContext, alt: ExactRequest, cand: Candidate) -> bool:
        if (claim, cand.id) in self.admin:
            return True  # one claim cannot take a device twice
        holder = self.exclusive.get(cand.id)
        if alt.admin_access:
            # Admin access ignores other claims' use, but one claim still cannot take a device twice.
            return holder == claim
        return holder is not None or cand.id in ctx.in_use.exclusive

    def _try_add(self, slot: _Slot, alt: ExactRequest, key: AltKey, cand: Candidate) -> bool:
        self.steps += 1
        if self.steps > self.max_steps:
            raise SearchLimitExceeded(f"gave up after trying {self.max_steps} device placements")
        claim = self.claim = slot.claim
        request = slot.request
        part = self.parts[claim]
        ctx = part.ctx
        if self._in_use(claim, ctx, alt, cand):
            return False
        if ctx.selectable(key, alt, cand) is not None:
            return False
        consumed = ctx.capacity(alt, cand, self.shares)
        if not isinstance(consumed, dict):
            return False
        device = cand.device
        multi = device.allow_multiple_allocations and ctx.gates.consumable_capacity
        if device.consumes_counters and not ctx.gates.partitionable_devices:
            return False
        # isSelectable (k8s.io/dynamic-resource-allocation/structured): with DRADeviceBindingConditions off, a device
        # that has bindingConditions is never allocated.
        if device.binding_conditions and not ctx.gates.binding_conditions:
            return False
        # A shared device draws its counters once, when its first share is allocated; admin access draws none.
        draw_counters = bool(device.consumes_counters) and not alt.admin_access
        if multi and (cand.id in self.shares or cand.id in ctx.in_use.shared):
            draw_counters = False
        # KEP-5963, checked as kube-scheduler does: not for a further share of a device already in use.
        groups: list[tuple[tuple[PoolKey, str], GroupState]] = []
        if ctx.gates.compatibility_groups and device.consumes_counters and not (
            multi and (cand.id in self.shares or cand.id in ctx.in_use.shared)
        ):
            found = self._groups_after(ctx, cand)
            if found is None:
                return False
            groups = found
        if draw_counters and ctx.counters(cand, self.counters) is not None:
            return False
        if ctx.taint(alt, cand) is not None:
            return False
        sub = alt.name if request.first_available else None
        values: list[tuple[int, Comparable]] = []
        constraint_values = self.constraint_values[claim]
        for i, constraint in enumerate(part.constraints):
            if not constraint_applies(constraint, request.name, sub):
                continue
            value = ctx.constraint_value(alt, cand, constraint.attribute)
            if value is None:
                return False
            comparable = _comparable(value)
            if not constraint_admits(constraint.kind, constraint_values[i], comparable):
                return False
            values.append((i, comparable))
        # Commit.
        for i, comparable in values:
            constraint_values[i].append(comparable)
        replaced: list[GroupChange] = [(set_key, self.group_states.get(set_key)) for set_key, _ in groups]
        for set_key, state in groups:
            self.group_states[set_key] = state
        if draw_counters:
            pool_key: PoolKey = (cand.id.driver, cand.id.pool)
            for consumption in device.consumes_counters:
                for counter, amount in consumption.counters.items():
                    ckey = (pool_key, (consumption.counter_set, counter))
                    self.counters[ckey] = self.counters.get(ckey, 0) + amount.nanos
        if multi:
            per_device = self.shares.setdefault(cand.id, {})
            for name, amount in consumed.items():
                ckey_cap = capacity_key(name, cand.id.driver)
                per_device[ckey_cap] = per_device.get(ckey_cap, 0) + amount.nanos
            self.share_counts[cand.id] = self.share_counts.get(cand.id, 0) + 1
        elif alt.admin_access:
            self.admin.add((claim, cand.id))
        else:
            self.exclusive[cand.id] = claim
        self.picks.append(Pick(request, alt, cand, consumed if multi else {}, multi, claim))
        self.claim_picks[claim] += 1
        self._undo_log.append((values, draw_counters, multi, replaced))
        return True

    def _groups_after(
        self, ctx: AllocationContext, cand: Candidate
    ) -> list[tuple[tuple[PoolKey, str], GroupState]] | None:
        """The group state of each counter set the device draws from once it is added, or None when its groups do
        not intersect those of the devices already there."""
        pool_key: PoolKey = (cand.id.driver, cand.id.pool)
        baseline = ctx.group_baseline(pool_key)
        out = []
        for consumption in cand.device.consumes_counters:
            key = (pool_key, consumption.counter_set)
            state = self.group_states.get(key, baseline.get(consumption.counter_set))
            if not compatibility.admits(state, consumption.groups):
                return None
            out.append((key, compatibility.add(state, consumption.groups)))
        return out

    def _undo(self) -> None:
        pick = self.picks.pop()
        values, drew_counters, multi, replaced = self._undo_log.pop()
        for key, previous in reversed(replaced):
            if previous is None:
                del self.group_states[key]
            else:
                self.group_states[key] = previous
        cand = pick.cand
        self.claim_picks[pick.claim] -= 1
        constraint_values = self.constraint_values[pick.claim]
        for i, _ in reversed(values):
            constraint_values[i].pop()
        if drew_counters:
            pool_key: PoolKey = (cand.id.driver, cand.id.pool)
            for consumption in cand.device.consumes_counters:
                for counter, amount in consumption.counters.items():
                    ckey = (pool_key, (consumption.counter_set, counter))
                    self.counters[ckey] -= amount.nanos
        if multi:
            per_device = self.shares[cand.id]
            for name, amount in pick.consumed.items():
                per_device[capacity_key(name, cand.id.driver)] -= amount.nanos
            self.share_counts[cand.id] -= 1
            if self.share_counts[cand.id] == 0:
                del self.share_counts[cand.id]
                del self.shares[cand.id]
        elif pick.alt.admin_access:
            self.admin.discard((pick.claim, cand.id))
        else:
            del self.exclusive[cand.id]
