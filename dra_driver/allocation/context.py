"""Per-call allocation context: the inputs, the feature gates and the device checks shared by the
search and by the explanation, so both judge a device by exactly the same rules."""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field, fields
from types import MappingProxyType
from typing import Any, Final, cast

from dra_driver.allocation import compatibility
from dra_driver.allocation.capacity import CapacityShortfall, share_amount
from dra_driver.allocation.compatibility import GroupState
from dra_driver.allocation.inuse import CounterKey, InUse, capacity_key
from dra_driver.allocation.model import DeviceCapacity, DeviceClass, Node
from dra_driver.allocation.pools import Candidate, NodePools, PoolKey
from dra_driver.allocation.taints import blocking_taint
from dra_driver.cel import (
    AttributeValue,
    CelCompileError,
    CelRuntimeError,
    CompiledSelector,
    DerivedValue,
    DeviceInput,
    DeviceView,
    DraCelEnvironment,
    split_qualified_name,
    values_key,
)
from dra_driver.cel.reads import Read
from dra_driver.k8s.quantity import Quantity
from dra_driver.resourceapi import DeviceId, ExactRequest, ResourceClaim


def _gate(name: str, default: bool) -> Any:
    """A FeatureGates field: the Kubernetes feature gate it follows and that gate's default."""
    return field(default=default, metadata={"gate": name})


@dataclass(frozen=True)
class FeatureGates:
    """The feature gates the allocator honours, with their Kubernetes 1.36 defaults."""

    admin_access: bool = _gate("DRAAdminAccess", True)
    prioritized_list: bool = _gate("DRAPrioritizedList", True)
    partitionable_devices: bool = _gate("DRAPartitionableDevices", True)
    device_taints: bool = _gate("DRADeviceTaints", True)
    consumable_capacity: bool = _gate("DRAConsumableCapacity", True)
    binding_conditions: bool = _gate("DRADeviceBindingConditions", True)
    # KEP-6080 and KEP-5963: alpha in 1.37, off by default.
    derived_attributes: bool = _gate("DRADerivedAttributes", False)
    compatibility_groups: bool = _gate("DRADeviceCompatibilityGroups", False)

    @classmethod
    def from_mapping(cls, gates: Mapping[str, bool] | None) -> FeatureGates:
        """Unrelated gate names are ignored so callers may pass the cluster's whole gate map."""
        merged = dict(DEFAULT_FEATURE_GATES)
        for name, value in (gates or {}).items():
            if name in merged:
                if not isinstance(value, bool):
                    raise ValueError(f"feature gate {name}: value must be true or false, got {value!r}")
                merged[name] = value
        return cls(**{f.name: merged[f.metadata["gate"]] for f in fields(cls)})


DEFAULT_FEATURE_GATES: Mapping[str, bool] = MappingProxyType(
    {f.metadata["gate"]: cast(bool, f.default) for f in fields(FeatureGates)})


def lookup_attribute(cand: Candidate, attribute: str) -> AttributeValue | list[Any] | None:
    """A fully qualified attribute (a scalar, or the values of a list-type one); a device's unqualified names belong
    to its driver's domain."""
    attrs = cand.device.attributes
    if attribute in attrs:
        return attrs[attribute]
    domain, ident = split_qualified_name(attribute, cand.id.driver)
    if domain == cand.id.driver and ident in attrs:
        return attrs[ident]
    for name, values in cand.device.list_attributes:  # rare (alpha): a short scan only when a scalar is missing
        if name == attribute or (domain == cand.id.driver and name == ident):
            return list(values)
    return None


@dataclass(frozen=True)
class Reject:
    """Why one device cannot serve one request. `key` groups devices in the explanation."""

    key: str
    detail: str = ""


class SelectorFailure(Exception):
    """A selector raised at runtime. Kubernetes aborts the allocation attempt in that case."""

    def __init__(self, device: DeviceId, source: str, error: CelRuntimeError) -> None:
        super().__init__(f"{source} on device {device}: {error}")
        self.device = device
        self.source = source
        self.error = error


AltKey = tuple[str, str]  # (request name, subrequest name or "")


@dataclass(frozen=True)
class SelectorError:
    """A selector that raised on a device: which one, and the error."""

    source: str
    error: CelRuntimeError


Verdict = Reject | SelectorError | None
_UNSET: Final = object()
_NO_CAPACITY: Final[Mapping[str, Quantity]] = MappingProxyType({})


class _CapacityValues(Mapping[str, Quantity]):
    """A device's capacity values as a selector sees them, read through from the parsed capacities (building a
    dict per device would cost more than most devices' selector checks)."""

    __slots__ = ("_capacity",)

    def __init__(self, capacity: Mapping[str, DeviceCapacity]) -> None:
        self._capacity = capacity

    def __getitem__(self, name: str) -> Quantity:
        return self._capacity[name].value

    def __iter__(self) -> Iterator[str]:
        return iter(self._capacity)

    def __len__(self) -> int:
        return len(self._capacity)


def alt_key(request: str, alt: ExactRequest, first_available: bool) -> AltKey:
    return (request, alt.name if first_available else "")


def excerpt(expression: str, limit: int = 80) -> str:
    flat = " ".join(expression.split())
    return flat if len(flat) <= limit else flat[: limit - 3] + "..."


@dataclass(eq=False, repr=False, kw_only=True)
class AllocationContext:
    """Inputs plus memoised, side-effect-free device checks for one allocate() call."""

    claim: ResourceClaim
    node: Node
    gates: FeatureGates
    pools: NodePools
    in_use: InUse
    classes: Mapping[str, DeviceClass]
    cel: DraCelEnvironment
    _views: list[DeviceView | None] = field(init=False)  # by candidate order
    _verdicts: dict[AltKey, list[Verdict]] = field(default_factory=dict, init=False)
    _pool_counters: dict[PoolKey, dict[CounterKey, int]] = field(default_factory=dict, init=False)
    _derived: dict[tuple[int, str], DerivedValue | CelRuntimeError] = field(default_factory=dict, init=False)
    _group_baselines: dict[PoolKey, dict[str, GroupState]] = field(default_factory=dict, init=False)

    def __post_init__(self) -> None:
        self._views = [None] * len(self.pools.candidates)

    # -- selectors ---------------------------------------------------------------------------
    def _device_view(self, cand: Candidate) -> DeviceView:
        view = self._views[cand.order]
        if view is None:
            device = cand.device
            view = DeviceView(
                DeviceInput(
                    driver=cand.id.driver,
                    attributes=device.attributes,
                    capacity=_CapacityValues(device.capacity),
                    allow_multiple_allocations=device.allow_multiple_allocations,
                ),
                declare_allow_multiple=self.gates.consumable_capacity,
            )
            self._views[cand.order] = view
        return view

    def _selectors(self, alt: ExactRequest) -> list[tuple[str, str]]:
        """(source, expression) of every selector the request uses: the class's, then its own."""
        device_class = self.classes.get(alt.class_name)
        sources = [
            (f"device class {alt.class_name!r} selector #{i}", e)
            for i, e in enumerate(device_class.selectors if device_class else ())
        ]
        return sources + [(f"request {alt.name!r} selector #{i}", e) for i, e in enumerate(alt.selectors)]

    def compile_errors(self, alt: ExactRequest) -> list[str]:
        """Compile every selector the request uses; return the problems (empty when all compile)."""
        problems = []
        for source, expression in self._selectors(alt):
            try:
                self.cel.compile(expression)
            except CelCompileError as err:
                problems.append(f"{source}: {err}")
        return problems

    def verdicts(self, key: AltKey, alt: ExactRequest) -> Sequence[Verdict]:
        """The selector verdict of every candidate (indexed by `Candidate.order`): None when all selectors are
        true, the Reject of the first false one, or the runtime error of the first that fails (raised as a
        SelectorFailure only where the search meets that device, as Kubernetes does).

        Computed once per request for all candidates. When every selector's result depends only on device paths
        it reads (`CompiledSelector.reads`), devices that agree on all of those values share one verdict: on a
        fleet most devices differ only in attributes no selector reads, so a node's hundred devices cost a few
        dictionary lookups each, not a hundred selector evaluations."""
        found = self._verdicts.get(key)
        if found is not None:
            return found
        checks = [(source, expression, self.cel.compile(expression)) for source, expression in self._selectors(alt)]
        reads: tuple[Read, ...] | None = ()
        for _, _, selector in checks:
            reads = None if reads is None or selector.reads is None else (*reads, *selector.reads)
        reads = None if reads is None else tuple(sorted(set(reads)))
        needs_capacity = reads is not None and any(read[0] == "capacity" for read in reads)
        shared: dict[tuple[Any, ...], Verdict] = {}
        out: list[Verdict] = []
        for cand in self.pools.candidates:
            if reads is None:
                out.append(self._judge(checks, self._device_view(cand)))
                continue
            device = cand.device
            values = values_key(
                reads,
                cand.id.driver,
                device.attributes,
                _CapacityValues(device.capacity) if needs_capacity else _NO_CAPACITY,
                device.allow_multiple_allocations,
            )
            group = (cand.id.driver, values if values is not None else self._device_view(cand).key(reads))
            verdict = shared.get(group, _UNSET)
            if verdict is _UNSET:
                verdict = shared[group] = self._judge(checks, self._device_view(cand))
            out.append(cast(Verdict, verdict))
        self._verdicts[key] = out
        return out

    def _judge(self, checks: list[tuple[str, str, CompiledSelector]], view: DeviceView) -> Verdict:
        for source, expression, selector in checks:
            try:
                matched = self.cel.matches_view(selector, view)
            except CelRuntimeError as err:
                return SelectorError(source, err)
            if not matched:
                return Reject(f"{source} is false: {excerpt(expression)}")
        return None

    # -- derived attributes (KEP-6080) ----------------------------------------------------------
    def derived_compile_errors(self, request: str, alt: ExactRequest) -> list[str]:
        problems = []
        for name, expression in alt.derived_attributes.items():
            try:
                self.cel.compile_derived(expression)
            except CelCompileError as err:
                problems.append(f"request {request!r}: compile derived attribute {name} failed: {err}")
        return problems

    def constraint_value(self, alt: ExactRequest, cand: Candidate, attribute: str) -> DerivedValue | None:
        """What a matchAttribute/distinctAttribute constraint on `attribute` compares for this device: the request's
        derived attribute of that name where it has one (its expression evaluated on the device, once per device and
        expression, as kube-scheduler caches it), else the device's own attribute. A failing expression aborts the
        allocation (SelectorFailure), as kube-scheduler's allocator returns the error."""
        expression = alt.derived_attributes.get(attribute)
        if expression is None:
            return lookup_attribute(cand, attribute)
        key = (cand.order, expression)
        value = self._derived.get(key)
        if value is None:
            try:
                value = self.cel.compile_derived(expression).evaluate(self._device_view(cand).activation)
            except CelRuntimeError as err:
                value = err
            self._derived[key] = value
        if isinstance(value, CelRuntimeError):
            raise SelectorFailure(cand.id, f"derived attribute {attribute}", value)
        return value

    def selectable(self, key: AltKey, alt: ExactRequest, cand: Candidate) -> Reject | None:
        """Class selectors, then request selectors (all must be true). Raises SelectorFailure."""
        verdict = self.verdicts(key, alt)[cand.order]
        if isinstance(verdict, SelectorError):
            raise SelectorFailure(cand.id, verdict.source, verdict.error)
        return verdict

    # -- capacity ----------------------------------------------------------------------------
    def capacity(
        self, alt: ExactRequest, cand: Candidate, allocating: Mapping[DeviceId, Mapping[str, int]]
    ) -> dict[str, Quantity] | Reject:
        """Consumed capacity for a share of a multi-allocatable device ({} for an exclusive device),
        or why the request does not fit. Without DRAConsumableCapacity every device is exclusive."""
        driver = cand.id.driver
        device = cand.device
        by_key = {capacity_key(name, driver): name for name in device.capacity}
        requested: dict[str, Quantity] = {}
        for name, amount in alt.capacity.items():
            key = capacity_key(name, driver)
            if key not in by_key:
                return Reject(f"device has no capacity {name!r}", f"request asks for {amount} of {name!r}")
            requested[key] = amount
        multi = device.allow_multiple_allocations and self.gates.consumable_capacity
        if not multi:
            for key, amount in requested.items():
                have = device.capacity[by_key[key]].value
                if have < amount:
                    return Reject(f"insufficient capacity {by_key[key]!r}", f"requested {amount}, device has {have}")
            return {}
        consumed: dict[str, Quantity] = {}
        existing = self.in_use.shared.get(cand.id, {})
        pending = allocating.get(cand.id, {})
        for key, name in by_key.items():
            cap = device.capacity[name]
            share = share_amount(name, cap, requested.get(key))
            if isinstance(share, CapacityShortfall):
                return Reject(f"capacity {name!r} request policy not satisfiable", share.detail)
            used = existing.get(key, 0) + pending.get(key, 0)
            if share.nanos > cap.value.nanos - used:
                return Reject(
                    f"insufficient capacity {name!r}",
                    self._shortfall(cand, name, requested.get(key), share, used, bool(pending.get(key))),
                )
            consumed[name] = share
        return consumed

    def _shortfall(
        self, cand: Candidate, name: str, requested: Quantity | None, amount: Quantity, used: int, pending: bool
    ) -> str:
        """E.g. "memory 20Gi requested, 60Gi of 79Gi already consumed by 3 shares"."""
        total = cand.device.capacity[name].value
        if requested is None:
            asked = f"{name} {amount} by default (nothing requested)"
        elif requested != amount:
            asked = f"{name} {requested} requested ({amount} after the request policy)"
        else:
            asked = f"{name} {requested} requested"
        shares = len(self.in_use.share_holders.get(cand.id, ()))
        holders = [f"{shares} share" + ("s" if shares != 1 else "")] if shares else []
        if pending:
            holders.append("earlier requests of this claim")
        by = " and ".join(holders) or "nothing"
        return f"{asked}, {Quantity(used, total.format)} of {total} already consumed by {by}"

    # -- counters ----------------------------------------------------------------------------
    def pool_counters_consumed(self, key: PoolKey) -> dict[CounterKey, int]:
        if key not in self._pool_counters:
            pool = self.pools.pool(key)
            self._pool_counters[key] = self.in_use.counters_consumed(pool) if pool is not None else {}
        return self._pool_counters[key]

    def counters(self, cand: Candidate, allocating: Mapping[tuple[PoolKey, CounterKey], int]) -> Reject | None:
        """Every counter the device draws must still be available after all allocated devices' draws."""
        pool_key: PoolKey = (cand.id.driver, cand.id.pool)
        pool = self.pools.pool(pool_key)
        if pool is None:  # pragma: no cover - candidates only come from usable pools
            return Reject("pool not usable")
        used = self.pool_counters_consumed(pool_key)
        for consumption in cand.device.consumes_counters:
            counter_set = pool.counter_sets[consumption.counter_set]
            for counter, amount in consumption.counters.items():
                total = counter_set.counters[counter]
                ckey = (consumption.counter_set, counter)
                left = total.nanos - used.get(ckey, 0) - allocating.get((pool_key, ckey), 0)
                if amount.nanos > left:
                    holders = self.counter_holders(pool_key, consumption.counter_set, cand.id.device)
                    return Reject(
                        f"counter {counter!r} of counter set {consumption.counter_set!r} exhausted",
                        f"needs {amount}, {Quantity(max(left, 0), total.format)} of {total} left"
                        + (f"; held by {holders}" if holders else ""),
                    )
        return None

    def group_baseline(self, key: PoolKey) -> Mapping[str, GroupState]:
        """KEP-5963: per counter set of the pool, the compatibility groups of its allocated devices."""
        found = self._group_baselines.get(key)
        if found is None:
            found = self._group_baselines[key] = {}
            pool = self.pools.pool(key)
            for name, device in (pool.all_devices.items() if pool is not None else ()):
                if not self.in_use.in_use(DeviceId(key[0], key[1], name)):
                    continue
                for consumption in device.consumes_counters:
                    found[consumption.counter_set] = compatibility.add(
                        found.get(consumption.counter_set), consumption.groups
                    )
        return found

    def counter_holders(self, pool_key: PoolKey, counter_set: str, asking: str) -> str:
        """The allocated devices that draw from `counter_set`, e.g. "gpu-0-shared (3 shares)"."""
        pool = self.pools.pool(pool_key)
        if pool is None:  # pragma: no cover - only called for usable pools
            return ""
        names = []
        for name, device in pool.all_devices.items():
            device_id = DeviceId(pool.driver, pool.name, name)
            if name == asking or not self.in_use.in_use(device_id):
                continue
            if not any(c.counter_set == counter_set for c in device.consumes_counters):
                continue
            if device_id in self.in_use.exclusive:
                names.append(f"{name} (claim {self.in_use.exclusive[device_id]})")
            else:
                shares = len(self.in_use.share_holders.get(device_id, ()))
                names.append(f"{name} ({shares} share{'s' if shares != 1 else ''})")
        shown = ", ".join(names[:3])
        return shown + (f" and {len(names) - 3} more" if len(names) > 3 else "")

    # -- taints ------------------------------------------------------------------------------
    def taint(self, alt: ExactRequest, cand: Candidate) -> Reject | None:
        if not self.gates.device_taints:
            return None
        taint = blocking_taint(cand.device.taints, alt.tolerations)
        if taint is None:
            return None
        return Reject(f"tainted {taint} and the request does not tolerate it")
