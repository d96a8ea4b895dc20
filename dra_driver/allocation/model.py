"""Frozen views of the resource.k8s.io/v1 objects the allocator reads, parsed from API JSON dicts.

Parsing is strict about what the allocator depends on and names the offending field, so a bad object
produces "ResourceSlice node-1-gpu: spec.devices[3].capacity.memory.value: invalid quantity ..." rather
than a KeyError deep inside the search. Fields the allocator does not interpret are ignored.
"""

from __future__ import annotations

import operator
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Final

from dra_driver.cel import AttributeValue
from dra_driver.k8s.quantity import Quantity, QuantityError, parse_quantity
from dra_driver.k8s.semver import Semver, SemverError, parse_semver
from dra_driver.resourceapi import JSON, FieldReader, object_name, parse_selectors, read_object

ADMIN_ACCESS_LABEL = "resource.kubernetes.io/admin-access"


# -- ResourceSlice -------------------------------------------------------------------------------


@dataclass(frozen=True)
class Taint:
    key: str
    value: str
    effect: str

    def __str__(self) -> str:
        return f"{self.key}={self.value}:{self.effect}" if self.value else f"{self.key}:{self.effect}"


@dataclass(frozen=True)
class ValidRange:
    min: Quantity
    max: Quantity | None
    step: Quantity | None


@dataclass(frozen=True)
class RequestPolicy:
    default: Quantity | None
    valid_values: tuple[Quantity, ...]
    valid_range: ValidRange | None


@dataclass(frozen=True)
class DeviceCapacity:
    value: Quantity
    policy: RequestPolicy | None


@dataclass(frozen=True)
class CounterConsumption:
    counter_set: str
    counters: Mapping[str, Quantity]
    # KEP-5963 `compatibilityGroups` (gate DRADeviceCompatibilityGroups, alpha in 1.37): devices drawing from one
    # counter set may be allocated together only while every one's groups share a group (none: only with none).
    groups: frozenset[str] = frozenset()


@dataclass(frozen=True)
class CounterSet:
    name: str
    counters: Mapping[str, Quantity]


@dataclass(frozen=True)
class NodeTarget:
    """Where a slice (or, with perDeviceNodeSelection, a device) is usable."""

    node_name: str | None = None
    node_selector: JSON | None = None
    all_nodes: bool = False


@dataclass(frozen=True)
class Device:
    name: str
    attributes: Mapping[str, AttributeValue]
    capacity: Mapping[str, DeviceCapacity]
    consumes_counters: tuple[CounterConsumption, ...] = ()
    taints: tuple[Taint, ...] = ()
    allow_multiple_allocations: bool = False
    target: NodeTarget | None = None  # only with perDeviceNodeSelection
    binds_to_node: bool = False
    binding_conditions: tuple[str, ...] = ()
    binding_failure_conditions: tuple[str, ...] = ()
    # List-typed attributes (KEP-5491, 1.36 alpha) as (name, values): selectors do not see them; matchAttribute and
    # distinctAttribute compare them as sets (search.constraint_admits).
    list_attributes: tuple[tuple[str, tuple[Any, ...]], ...] = ()


@dataclass(frozen=True)
class ResourceSlice:
    name: str
    driver: str
    pool: str
    generation: int
    slice_count: int
    target: NodeTarget
    per_device_node_selection: bool
    devices: tuple[Device, ...]
    shared_counters: tuple[CounterSet, ...]

    @property
    def uses_compatibility_groups(self) -> bool:
        """A device of it names KEP-5963 compatibility groups (kube-scheduler ignores such a slice without the gate,
        which leaves its pool incomplete)."""
        return any(c.groups for d in self.devices for c in d.consumes_counters)


# -- fast paths ----------------------------------------------------------------------------------
# Every device of a fleet carries the same few attribute, capacity and counter shapes. These take the common,
# valid shape straight to its value (Quantity and Semver are immutable, so identical strings share one parsed
# object); anything else returns _SLOW and goes through the strict parser, which names the offending field.

_SLOW: Final = object()
_SEMVERS: dict[str, Semver] = {}
_CACHE_LIMIT: Final = 8192


def _fast_attribute(raw: Any) -> Any:
    if type(raw) is not dict or len(raw) != 1:
        return _SLOW
    ((kind, item),) = raw.items()
    item_type = type(item)
    if kind == "string":
        return item if item_type is str else _SLOW
    if kind == "int":
        return item if item_type is int else _SLOW
    if kind == "bool":
        return item if item_type is bool else _SLOW
    if kind == "version" and item_type is str and item:
        version = _SEMVERS.get(item)
        if version is None:
            try:
                version = parse_semver(item)
            except SemverError:
                return _SLOW
            if len(_SEMVERS) >= _CACHE_LIMIT:
                _SEMVERS.clear()
            _SEMVERS[item] = version
        return version
    return _SLOW


def _fast_quantity(raw: Any) -> Quantity | None:
    if type(raw) is not str:
        return None
    try:
        return parse_quantity(raw)
    except QuantityError:
        return None


def _fast_counters(raw: Any) -> dict[str, Quantity] | None:
    if type(raw) is not dict:
        return None
    out: dict[str, Quantity] = {}
    for name, entry in raw.items():
        if type(entry) is not dict or type(name) is not str:
            return None
        value = _fast_quantity(entry.get("value"))
        if value is None:
            return None
        out[name] = value
    return out


_VALUE: Final = operator.itemgetter("value")


class ParseCache:
    """Parsed pieces shared by the devices of many slices (one per SliceIndex: a pass over a fleet, or a
    long-lived scheduler index), so content repeated across devices (every GPU of a product has the same
    capacities and counter consumptions) is parsed and allocated once. Keys are built from the raw values
    themselves, so a hit means the same content, which parsed the same way before; only content of the common
    valid shape is cached (anything else goes through the strict parser every time). Values are immutable and
    shared: nothing is mutated after it is cached. Bounded (cleared when full); not thread-safe."""

    LIMIT: Final = 16384

    def __init__(self) -> None:
        self.capacities: dict[tuple[Any, ...], dict[str, DeviceCapacity]] = {}
        self.consumptions: dict[tuple[Any, ...], tuple[CounterConsumption, ...]] = {}

    def capacity(self, raw: Any) -> Mapping[str, DeviceCapacity] | None:
        """A capacity map whose entries are all exactly {"value": "<quantity>"} (no request policy; none when
        absent), else None."""
        if raw is None:
            return {}
        if type(raw) is not dict:
            return None
        try:
            # Names, entry sizes, values (loops in C): equal keys mean equal maps of {"value": v} entries.
            entries = raw.values()
            key = (tuple(raw), tuple(map(len, entries)), tuple(map(_VALUE, entries)))
            cached = self.capacities.get(key)
        except (TypeError, KeyError):  # an entry that is not an object, or an unhashable value
            return None
        if cached is None:
            cached = {}
            for name, entry in raw.items():
                quantity = _fast_quantity(entry["value"]) if len(entry) == 1 else None
                if quantity is None:
                    return None
                cached[name] = DeviceCapacity(value=quantity, policy=None)
            if len(self.capacities) >= self.LIMIT:
                self.capacities.clear()
            self.capacities[key] = cached
        return cached

    def consumes(self, raw: Any) -> tuple[CounterConsumption, ...] | None:
        """A consumesCounters list of the common valid shape (none when absent), else None (the strict parser then
        judges it)."""
        if raw is None:
            return ()
        if type(raw) is not list:
            return None
        if any(type(e) is not dict or "compatibilityGroups" in e for e in raw):
            return None  # rare (alpha): the strict parser reads the groups
        try:
            # Per entry: its counter set, its counter names, their values (other fields are ignored by any parse).
            key = tuple(
                (e["counterSet"], tuple(e["counters"]), tuple(map(_VALUE, e["counters"].values()))) for e in raw
            )
            cached = self.consumptions.get(key)
        except (TypeError, KeyError, AttributeError):
            return None
        if cached is None:
            out = []
            for entry in raw:
                if type(entry.get("counterSet")) is not str or not entry["counterSet"]:
                    return None
                counters = _fast_counters(entry.get("counters"))
                if counters is None:
                    return None
                out.append(CounterConsumption(counter_set=entry["counterSet"], counters=counters))
            if len(self.consumptions) >= self.LIMIT:
                self.consumptions.clear()
            cached = self.consumptions[key] = tuple(out)
        return cached


# Device fields the fast path understands; a device with any other field takes the strict parser.
_FAST_DEVICE_FIELDS: Final = frozenset({"name", "attributes", "capacity", "consumesCounters"})


def _fast_device(raw: Any, cache: ParseCache) -> Device | None:
    """The common valid device (name, scalar attributes, capacities without request policy, counter consumptions)
    parsed with shared pieces, or None: anything else (and anything invalid) goes through _parse_device, which
    gives the same Device for valid input and names the offending field otherwise."""
    if type(raw) is not dict or not raw.keys() <= _FAST_DEVICE_FIELDS:
        return None
    name = raw.get("name")
    if type(name) is not str or not name:
        return None
    attributes: dict[str, AttributeValue] = {}
    raw_attributes = raw.get("attributes")
    if raw_attributes is not None:
        if type(raw_attributes) is not dict:
            return None
        for key, value in raw_attributes.items():
            if type(value) is not dict or len(value) != 1:
                return None
            # Strings and ints (most attributes) inline; a dict of one entry holds one kind only.
            item = value.get("string")
            if type(item) is str:
                attributes[key] = item
                continue
            item = value.get("int")
            if type(item) is int:
                attributes[key] = item
                continue
            parsed = _fast_attribute(value)
            if parsed is _SLOW:
                return None
            attributes[key] = parsed
    capacity = cache.capacity(raw.get("capacity"))
    consumes = cache.consumes(raw.get("consumesCounters"))
    if capacity is None or consumes is None:
        return None
    return Device(name=name, attributes=attributes, capacity=capacity, consumes_counters=consumes)


def _parse_attribute(ctx: FieldReader, path: str, raw: Any) -> AttributeValue | list[Any]:
    value = ctx.mapping(raw, path, required=True)
    kinds = [k for k in ("int", "bool", "string", "version", "ints", "bools", "strings", "versions") if k in value]
    if len(kinds) != 1:
        raise ctx.fail(path, f"must set exactly one of int, bool, string, version; found {kinds or 'none'}")
    kind = kinds[0]
    item = value[kind]
    if kind == "int":
        return ctx.integer(item, f"{path}.int", default=0)
    if kind == "bool":
        return ctx.boolean(item, f"{path}.bool")
    if kind == "string":
        if not isinstance(item, str):
            raise ctx.fail(f"{path}.string", f"must be a string, got {item!r}")
        return item
    if kind == "version":
        try:
            return parse_semver(ctx.string(item, f"{path}.version", required=True))
        except SemverError as err:
            raise ctx.fail(f"{path}.version", str(err)) from err
    items = list(ctx.seq(item, f"{path}.{kind}"))
    if kind == "versions":  # compared like scalar versions (matchAttribute between a version and a versions list)
        try:
            return [parse_semver(ctx.string(v, f"{path}.versions", required=True)) for v in items]
        except SemverError as err:
            raise ctx.fail(f"{path}.versions", str(err)) from err
    return items


def _parse_policy(ctx: FieldReader, path: str, raw: Any) -> RequestPolicy | None:
    if raw is None:
        return None
    policy = ctx.mapping(raw, path)
    default = ctx.quantity(policy["default"], f"{path}.default") if policy.get("default") is not None else None
    values = tuple(
        ctx.quantity(v, f"{path}.validValues[{i}]") for i, v in enumerate(ctx.seq(policy.get("validValues"), path))
    )
    if list(values) != sorted(values):
        raise ctx.fail(f"{path}.validValues", "must be sorted in ascending order")
    valid_range = None
    if policy.get("validRange") is not None:
        rng = ctx.mapping(policy["validRange"], f"{path}.validRange")
        if rng.get("min") is None:
            raise ctx.fail(f"{path}.validRange.min", "is required")
        valid_range = ValidRange(
            min=ctx.quantity(rng["min"], f"{path}.validRange.min"),
            max=ctx.quantity(rng["max"], f"{path}.validRange.max") if rng.get("max") is not None else None,
            step=ctx.quantity(rng["step"], f"{path}.validRange.step") if rng.get("step") is not None else None,
        )
        if valid_range.step is not None and valid_range.step.sign() <= 0:
            raise ctx.fail(f"{path}.validRange.step", "must be positive")
    if values and valid_range is not None:
        raise ctx.fail(path, "set at most one of validValues and validRange")
    return RequestPolicy(default=default, valid_values=values, valid_range=valid_range)


def _parse_counters(ctx: FieldReader, path: str, raw: Any) -> dict[str, Quantity]:
    counters: dict[str, Quantity] = {}
    for name, counter in ctx.mapping(raw, path).items():
        entry = ctx.mapping(counter, f"{path}.{name}", required=True)
        if entry.get("value") is None:
            raise ctx.fail(f"{path}.{name}.value", "is required (a quantity)")
        counters[str(name)] = ctx.quantity(entry["value"], f"{path}.{name}.value")
    return counters


def _parse_target(ctx: FieldReader, path: str, raw: JSON) -> NodeTarget:
    node_name = ctx.string(raw.get("nodeName"), f"{path}.nodeName") or None
    selector = raw.get("nodeSelector")
    if selector is not None:
        selector = ctx.mapping(selector, f"{path}.nodeSelector")
    return NodeTarget(
        node_name=node_name, node_selector=selector, all_nodes=ctx.boolean(raw.get("allNodes"), f"{path}.allNodes")
    )


def _parse_device(ctx: FieldReader, path: str, raw: Any, per_device: bool) -> Device:
    """The strict parser (parse_slice tries _fast_device first)."""
    dev = ctx.mapping(raw, path, required=True)
    name = ctx.string(dev.get("name"), f"{path}.name", required=True)
    attributes: dict[str, AttributeValue] = {}
    list_attributes: list[tuple[str, tuple[Any, ...]]] = []
    for key, value in ctx.mapping(dev.get("attributes"), f"{path}.attributes").items():
        parsed = _fast_attribute(value)
        if parsed is _SLOW:
            parsed = _parse_attribute(ctx, f"{path}.attributes.{key}", value)
        if isinstance(parsed, list):
            list_attributes.append((str(key), tuple(parsed)))
        else:
            attributes[str(key)] = parsed
    capacity: dict[str, DeviceCapacity] = {}
    for key, value in ctx.mapping(dev.get("capacity"), f"{path}.capacity").items():
        if type(value) is dict and value.get("requestPolicy") is None:
            quantity = _fast_quantity(value.get("value"))
            if quantity is not None:
                capacity[str(key)] = DeviceCapacity(value=quantity, policy=None)
                continue
        cap = ctx.mapping(value, f"{path}.capacity.{key}", required=True)
        if cap.get("value") is None:
            raise ctx.fail(f"{path}.capacity.{key}.value", "is required (a quantity)")
        capacity[str(key)] = DeviceCapacity(
            value=ctx.quantity(cap["value"], f"{path}.capacity.{key}.value"),
            policy=_parse_policy(ctx, f"{path}.capacity.{key}.requestPolicy", cap.get("requestPolicy")),
        )
    consumes_list: list[CounterConsumption] = []
    for i, c in enumerate(ctx.seq(dev.get("consumesCounters"), f"{path}.consumesCounters")):
        groups = frozenset(ctx.strings(ctx.mapping(c, f"{path}.consumesCounters[{i}]").get("compatibilityGroups"),
                                       f"{path}.consumesCounters[{i}].compatibilityGroups"))
        if type(c) is dict and type(c.get("counterSet")) is str and c["counterSet"]:
            fast = _fast_counters(c.get("counters"))
            if fast is not None:
                consumes_list.append(CounterConsumption(counter_set=c["counterSet"], counters=fast, groups=groups))
                continue
        consumes_list.append(
            CounterConsumption(
                counter_set=ctx.string(
                    ctx.mapping(c, f"{path}.consumesCounters[{i}]").get("counterSet"),
                    f"{path}.consumesCounters[{i}].counterSet",
                    required=True,
                ),
                counters=_parse_counters(
                    ctx, f"{path}.consumesCounters[{i}].counters", ctx.mapping(c, "").get("counters")
                ),
                groups=groups,
            )
        )
    consumes = tuple(consumes_list)
    taints = []
    for i, t in enumerate(ctx.seq(dev.get("taints"), f"{path}.taints")):
        taint = ctx.mapping(t, f"{path}.taints[{i}]", required=True)
        taints.append(
            Taint(
                key=ctx.string(taint.get("key"), f"{path}.taints[{i}].key", required=True),
                value=ctx.string(taint.get("value"), f"{path}.taints[{i}].value"),
                effect=ctx.string(taint.get("effect"), f"{path}.taints[{i}].effect"),
            )
        )
    target = _parse_target(ctx, path, dev) if per_device else None
    return Device(
        name=name,
        attributes=attributes,
        capacity=capacity,
        consumes_counters=consumes,
        taints=tuple(taints),
        allow_multiple_allocations=ctx.boolean(dev.get("allowMultipleAllocations"), f"{path}.allowMultipleAllocations"),
        target=target,
        binds_to_node=ctx.boolean(dev.get("bindsToNode"), f"{path}.bindsToNode"),
        binding_conditions=tuple(str(c) for c in ctx.seq(dev.get("bindingConditions"), f"{path}.bindingConditions")),
        binding_failure_conditions=tuple(
            str(c) for c in ctx.seq(dev.get("bindingFailureConditions"), f"{path}.bindingFailureConditions")
        ),
        list_attributes=tuple(list_attributes),
    )


def parse_slice(obj: JSON, cache: ParseCache | None = None) -> ResourceSlice:
    """`cache`: share parsed pieces with other slices (SliceIndex passes its own); None: a private one."""
    cache = cache if cache is not None else ParseCache()
    ctx = FieldReader(f"ResourceSlice {object_name(obj)}")
    spec = ctx.mapping(obj.get("spec"), "spec", required=True)
    pool = ctx.mapping(spec.get("pool"), "spec.pool", required=True)
    slice_count = ctx.integer(pool.get("resourceSliceCount"), "spec.pool.resourceSliceCount", default=1)
    if slice_count < 1:
        raise ctx.fail("spec.pool.resourceSliceCount", f"must be >= 1, got {slice_count}")
    generation = ctx.integer(pool.get("generation"), "spec.pool.generation", default=0)
    per_device = ctx.boolean(spec.get("perDeviceNodeSelection"), "spec.perDeviceNodeSelection")
    target = _parse_target(ctx, "spec", spec)
    chosen = [target.node_name is not None, target.node_selector is not None, target.all_nodes, per_device]
    if sum(chosen) != 1:
        raise ctx.fail("spec", "set exactly one of nodeName, nodeSelector, allNodes, perDeviceNodeSelection")
    parsed_devices = []
    for i, d in enumerate(ctx.seq(spec.get("devices"), "spec.devices")):
        quick = None if per_device else _fast_device(d, cache)
        parsed_devices.append(quick if quick is not None else _parse_device(ctx, f"spec.devices[{i}]", d, per_device))
    devices = tuple(parsed_devices)
    sets = []
    for i, raw in enumerate(ctx.seq(spec.get("sharedCounters"), "spec.sharedCounters")):
        entry = ctx.mapping(raw, f"spec.sharedCounters[{i}]", required=True)
        sets.append(
            CounterSet(
                name=ctx.string(entry.get("name"), f"spec.sharedCounters[{i}].name", required=True),
                counters=_fast_counters(entry.get("counters"))
                or _parse_counters(ctx, f"spec.sharedCounters[{i}].counters", entry.get("counters")),
            )
        )
    return ResourceSlice(
        name=object_name(obj),
        driver=ctx.string(spec.get("driver"), "spec.driver", required=True),
        pool=ctx.string(pool.get("name"), "spec.pool.name", required=True),
        generation=generation,
        slice_count=slice_count,
        target=target,
        per_device_node_selection=per_device,
        devices=devices,
        shared_counters=tuple(sets),
    )


# -- DeviceClass ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class DeviceClass:
    name: str
    selectors: tuple[str, ...]
    config: tuple[JSON, ...]  # DeviceClassConfiguration objects as in the API (inline `opaque`)


def parse_class(obj: JSON) -> DeviceClass:
    ctx, meta = read_object("DeviceClass", obj)
    spec = ctx.mapping(obj.get("spec"), "spec")
    return DeviceClass(
        name=ctx.string(meta.get("name"), "metadata.name", required=True),
        selectors=parse_selectors(ctx, "spec.selectors", spec.get("selectors")),
        config=tuple(
            ctx.mapping(c, f"spec.config[{i}]") for i, c in enumerate(ctx.seq(spec.get("config"), "spec.config"))
        ),
    )


@dataclass(frozen=True)
class Node:
    name: str
    labels: Mapping[str, str]


def parse_node(obj: JSON) -> Node:
    ctx, meta = read_object("Node", obj)
    labels = ctx.mapping(meta.get("labels"), "metadata.labels")
    return Node(
        name=ctx.string(meta.get("name"), "metadata.name", required=True),
        labels={str(k): str(v) for k, v in labels.items()},
    )
