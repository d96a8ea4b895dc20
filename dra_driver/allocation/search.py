"""Backtracking search over the claim's requests, in the order the kube-scheduler's allocator uses.

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

from dra_driver.allocation.context import AllocationContext, AltKey, Reject, alt_key
from dra_driver.allocation.model import MODE_ALL, Constraint, DeviceId, ExactRequest, Request
from dra_driver.allocation.pools import Candidate, PoolKey
from dra_driver.allocation.usage import CounterKey, capacity_key
from dra_driver.cel import AttributeValue, split_qualified_name
from dra_driver.k8s.quantity import Quantity

# resource.k8s.io/v1 AllocationResultsMaxSize.
MAX_RESULTS = 32


class SearchLimitExceeded(Exception):
    """The search tried more device placements than allowed (the scheduler's filter timeout analogue)."""


@dataclass(frozen=True)
class Pick:
    request: Request
    alt: ExactRequest
    cand: Candidate
    consumed: dict[str, Quantity]  # consumed capacity for a share ({} for an exclusive device)
    share: bool  # a share of a multi-allocatable device (gets a shareID)

    @property
    def request_name(self) -> str:
        return f"{self.request.name}/{self.alt.name}" if self.request.first_available else self.request.name


def lookup_attribute(cand: Candidate, attribute: str) -> AttributeValue | None:
    """A fully qualified attribute; a device's unqualified names belong to its driver's domain."""
    attrs = cand.device.attributes
    if attribute in attrs:
        return attrs[attribute]
    domain, ident = split_qualified_name(attribute, cand.id.driver)
    if domain == cand.id.driver and ident in attrs:
        return attrs[ident]
    return None


def _comparable(value: AttributeValue) -> tuple[str, str]:
    # Keep types apart (True must not equal 1) and compare versions by their exact string, as Kubernetes does.
    return (type(value).__name__, str(value))


def constraint_applies(constraint: Constraint, request: str, sub: str | None) -> bool:
    if not constraint.requests:
        return True
    return request in constraint.requests or (sub is not None and f"{request}/{sub}" in constraint.requests)


class Search:
    def __init__(
        self,
        ctx: AllocationContext,
        *,
        constraints: Sequence[Constraint],
        max_steps: int,
    ) -> None:
        self.ctx = ctx
        self.requests = ctx.claim.requests
        self.constraints = tuple(constraints)
        self.max_steps = max_steps
        self.steps = 0
        self.exclusive: set[DeviceId] = set()
        self.shares: dict[DeviceId, dict[str, int]] = {}
        self.share_counts: dict[DeviceId, int] = {}
        self.counters: dict[tuple[PoolKey, CounterKey], int] = {}
        self.constraint_values: list[list[tuple[str, str]]] = [[] for _ in self.constraints]
        self.picks: list[Pick] = []
        # One entry per pick: (constraint values added, counters drawn, share) so _undo is exact.
        self._undo_log: list[tuple[list[tuple[int, tuple[str, str]]], bool, bool]] = []
        self._all_devices: dict[AltKey, list[Candidate]] = {}
        self._eligible: dict[AltKey, list[Candidate]] = {}

    # -- public -------------------------------------------------------------------------------
    def run(self) -> list[Pick] | None:
        """The first solution in search order, or None. Raises SelectorFailure / SearchLimitExceeded."""
        return list(self.picks) if self._solve(0) else None

    # -- recursion ----------------------------------------------------------------------------
    def _solve(self, index: int) -> bool:
        if index == len(self.requests):
            return True
        request = self.requests[index]
        return any(self._solve_alt(index, request, alt) for alt in request.alternatives)

    def _remaining_minimum(self, index: int) -> int:
        return sum(min(a.count if a.mode != MODE_ALL else 1 for a in r.alternatives) for r in self.requests[index:])

    def _solve_alt(self, index: int, request: Request, alt: ExactRequest) -> bool:
        key = alt_key(request.name, alt, request.first_available)
        if alt.mode == MODE_ALL:
            devices = self.all_devices(key, alt)
            if not devices or len(self.picks) + len(devices) + self._remaining_minimum(index + 1) > MAX_RESULTS:
                return False
            added = 0
            for cand in devices:
                if not self._try_add(request, alt, key, cand):
                    break
                added += 1
            if added == len(devices) and self._solve(index + 1):
                return True
            for _ in range(added):
                self._undo()
            return False
        return self._pick(index, request, alt, key, 0, 0)

    def eligible(self, key: AltKey, alt: ExactRequest) -> list[Candidate]:
        """The candidates the selectors do not reject, in search order (those whose selector fails to evaluate
        stay, so that the search meets the failure where it would). The search only walks these: on a fleet's
        node most devices are other products or types, rejected as whole groups by their selector verdict."""
        found = self._eligible.get(key)
        if found is None:
            verdicts = self.ctx.verdicts(key, alt)
            found = [c for c in self.ctx.pools.candidates if not isinstance(verdicts[c.order], Reject)]
            self._eligible[key] = found
        return found

    def _pick(self, index: int, request: Request, alt: ExactRequest, key: AltKey, taken: int, start: int) -> bool:
        if taken == alt.count:
            return self._solve(index + 1)
        if len(self.picks) + (alt.count - taken) + self._remaining_minimum(index + 1) > MAX_RESULTS:
            return False
        candidates = self.eligible(key, alt)
        for position in range(start, len(candidates)):
            cand = candidates[position]
            if not self._try_add(request, alt, key, cand):
                continue
            if self._pick(index, request, alt, key, taken + 1, position + 1):
                return True
            self._undo()
        return False

    # -- device placement ---------------------------------------------------------------------
    def all_devices(self, key: AltKey, alt: ExactRequest) -> list[Candidate]:
        """For allocationMode All: every device on the node that matches the selectors (and, with
        consumable capacity, could hold the capacity request), whether or not it is free."""
        if key not in self._all_devices:
            chosen = []
            for cand in self.eligible(key, alt):
                if self.ctx.selectable(key, alt, cand) is not None:
                    continue
                if self.ctx.gates.consumable_capacity and not isinstance(self.ctx.capacity(alt, cand, {}), dict):
                    continue
                chosen.append(cand)
            self._all_devices[key] = chosen
        return self._all_devices[key]

    def _in_use(self, alt: ExactRequest, cand: Candidate) -> bool:
        if alt.admin_access:
            # Admin access ignores other claims' use, but one claim still cannot take a device twice.
            return cand.id in self.exclusive
        return cand.id in self.exclusive or cand.id in self.ctx.usage.exclusive

    def _try_add(self, request: Request, alt: ExactRequest, key: AltKey, cand: Candidate) -> bool:
        self.steps += 1
        if self.steps > self.max_steps:
            raise SearchLimitExceeded(f"gave up after trying {self.max_steps} device placements")
        ctx = self.ctx
        if self._in_use(alt, cand):
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
        # A shared device draws its counters once, when its first share is allocated; admin access draws none.
        draw_counters = bool(device.consumes_counters) and not alt.admin_access
        if multi and (cand.id in self.shares or cand.id in ctx.usage.shared):
            draw_counters = False
        if draw_counters and ctx.counters(cand, self.counters) is not None:
            return False
        if ctx.taint(alt, cand) is not None:
            return False
        sub = alt.name if request.first_available else None
        values: list[tuple[int, tuple[str, str]]] = []
        for i, constraint in enumerate(self.constraints):
            if not constraint_applies(constraint, request.name, sub):
                continue
            value = lookup_attribute(cand, constraint.attribute)
            if value is None:
                return False
            comparable = _comparable(value)
            seen = self.constraint_values[i]
            if constraint.kind == "matchAttribute" and seen and seen[0] != comparable:
                return False
            if constraint.kind == "distinctAttribute" and comparable in seen:
                return False
            values.append((i, comparable))
        # Commit.
        for i, comparable in values:
            self.constraint_values[i].append(comparable)
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
        else:
            self.exclusive.add(cand.id)
        self.picks.append(Pick(request, alt, cand, consumed if multi else {}, multi))
        self._undo_log.append((values, draw_counters, multi))
        return True

    def _undo(self) -> None:
        pick = self.picks.pop()
        values, drew_counters, multi = self._undo_log.pop()
        cand = pick.cand
        for i, _ in reversed(values):
            self.constraint_values[i].pop()
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
        else:
            self.exclusive.discard(cand.id)
