"""Which resource pools a claim's requests can reach, judged on the raw slices before any device is parsed.

`dra-driver explain` over a fleet asks one claim about every node; most pools hold no device its selectors can
accept (a claim for an H200 on a fleet of H100 nodes), and parsing their devices was most of its pass. A pool
none of whose devices any request alternative can select contributes no candidate on any node: its devices are
rejected by the selectors before anything else, its counters are consumed only by its own devices, and an
invalid or incomplete pool is skipped anyway. Leaving it out changes no allocation and no verdict (which nodes
fit, and the first device picked on each); it changes only the explanation's accounting of rejected devices
(`dra-driver explain --all-devices` keeps them; docs/allocator.md, "Explain over the fleet").

The judgement is by the selectors' static reads (`CompiledSelector.reads`): a device is judged on the raw values
of only the attributes every selector reads, evaluated once per distinct set of values. Anything this cannot
judge exactly keeps the pool: a selector whose reads are unknown, a read of capacity or of a qualified id, an
attribute value outside the common scalar shapes, a device or slice that is not a JSON object, a runtime error,
a request of allocationMode All (pool problems fail it), a class that is missing or invalid, a selector that does
not compile. `claim_reach` answers None then, and the caller parses everything, as before.

A claim that asks for more devices than a node has (nine GPUs of nodes with eight) is served by every pool and
fits on no node; the search would parse and account for every device to say so. When a request asks for two or
more, the sieve also counts, per node and per request alternative, the devices its selectors accept: an upper bound
of what the allocator can pick there (taints, allocations, constraints and counters only take away; a device that
allows multiple allocations, a slice it cannot read and a pool not local to one node make it unbounded or count for
every node). A node where every alternative of some request is short can fit nowhere by any allocation: its pools
are left out before parsing and `Pruned.short_nodes` says why, which explain prints as that node's answer.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

import msgspec

from dra_driver.allocation.context import FeatureGates
from dra_driver.allocation.model import _SLOW, _fast_attribute, parse_class
from dra_driver.cel import DraCelEnvironment
from dra_driver.cel.environment import CelCompileError, CelRuntimeError, CompiledSelector, DeviceInput, DeviceView
from dra_driver.cel.reads import Read
from dra_driver.resourceapi import MODE_ALL, InvalidObjectError, parse_resource_claim


@dataclass
class ClaimReach:
    """Judges raw ResourceSlices for one claim: `may_serve(slice)` is False only when no device of the slice can
    be selected by any request alternative of the claim. Memoises verdicts by the values the selectors read, so a
    fleet's 100k devices cost a few dictionary lookups each."""

    cel: DraCelEnvironment
    gates: FeatureGates
    # Per request alternative: its compiled selectors (the class's, then its own).
    alternatives: tuple[tuple[CompiledSelector, ...], ...]
    attribute_reads: tuple[tuple[str, str], ...]  # (domain, id) of every attribute read
    reads_allow_multiple: bool
    # Per request: its name and, per alternative (an index into `alternatives`), its name and count.
    requests: tuple[tuple[str, tuple[tuple[int, str, int], ...]], ...] = ()
    # Per distinct set of read values: which alternatives accept such a device.
    _verdicts: dict[tuple[Any, ...], tuple[bool, ...]] = field(default_factory=dict)
    _names_by_driver: dict[str, tuple[tuple[str, str | None], ...]] = field(default_factory=dict)
    _read_name_set: frozenset[str] | None = None

    @property
    def counts(self) -> bool:
        """Whether counting per node can tell anything: some request alternative asks for two devices or more."""
        return any(count > 1 for _, alternatives in self.requests for _, _, count in alternatives)

    def may_serve(self, raw_slice: Mapping[str, Any]) -> bool:
        return any(self.accepted(raw_slice))

    def accepted(self, raw_slice: Mapping[str, Any]) -> list[int]:
        """Per alternative, how many devices of the slice its selectors may accept (UNBOUNDED: any number)."""
        unknown = [UNBOUNDED] * len(self.alternatives)
        spec = raw_slice.get("spec")
        if not isinstance(spec, dict):
            return unknown
        driver = spec.get("driver")
        devices = spec.get("devices", [])
        if devices is None:
            return [0] * len(self.alternatives)  # a slice of counter sets only: it serves through the pool's others
        if not isinstance(driver, str) or not isinstance(devices, list):
            return unknown
        found = [0] * len(self.alternatives)
        for device in devices:
            _add(found, self._device_verdicts(driver, device), type(device) is dict
                 and device.get("allowMultipleAllocations") is True)
        return found

    def _device_verdicts(self, driver: str, device: Any) -> tuple[bool, ...]:
        every = (True,) * len(self.alternatives)
        if type(device) is not dict:
            return every
        attributes = device.get("attributes") or {}
        if type(attributes) is not dict:
            return every
        # The key: each read attribute's raw value under both its names, as the (kind, value) item of its
        # one-entry dict; a value of another shape keeps the device, an unhashable one (a list) too, below.
        key: list[Any] = [driver]
        for qualified, bare in self._names(driver):
            for name in (qualified, bare):
                value = attributes.get(name) if name else None
                if value is None:
                    key.append(None)
                elif type(value) is dict and len(value) == 1:
                    key.extend(value.items())
                else:
                    return every
        if self.reads_allow_multiple:
            key.append(device.get("allowMultipleAllocations") is True)
        group = tuple(key)
        try:
            verdict = self._verdicts.get(group)
        except TypeError:
            return every
        if verdict is None:
            verdict = self._verdicts[group] = self._judge(driver, attributes, device)
        return verdict

    def may_serve_light(self, spec: _LightSpec) -> bool:
        """`may_serve` on the light decode (the values of the attributes read are decoded only for a key not seen
        before; the key is their encoded bytes)."""
        driver = spec.driver
        if driver is None:
            return True
        return any(any(self._light_verdicts(driver, device)) for device in spec.devices or ())

    def accepted_light(self, spec: _LightSpec) -> list[int]:
        """`accepted` on the light decode."""
        driver = spec.driver
        if driver is None:
            return [UNBOUNDED] * len(self.alternatives)
        found = [0] * len(self.alternatives)
        for device in spec.devices or ():
            _add(found, self._light_verdicts(driver, device), device.allowMultipleAllocations is True)
        return found

    def light_verdicts(self, driver: str, device: _LightDevice) -> tuple[bool, ...]:
        """Per alternative, whether its selectors may accept the device of the light view (memoised)."""
        return self._light_verdicts(driver, device)

    def _light_verdicts(self, driver: str, device: _LightDevice) -> tuple[bool, ...]:
        attributes = device.attributes or {}
        key: list[Any] = ["light", driver,
                          device.allowMultipleAllocations is True if self.reads_allow_multiple else None]
        for qualified, bare in self._names(driver):
            for name in (qualified, bare):
                raw = attributes.get(name) if name else None
                key.append(None if raw is None else bytes(raw))
        group = tuple(key)
        verdict = self._verdicts.get(group)
        if verdict is None:
            values = {name: _FULL.decode(raw) for name, raw in attributes.items() if name in self._read_names}
            verdict = self._verdicts[group] = self._judge(
                driver, values, {"allowMultipleAllocations": device.allowMultipleAllocations is True}
            )
        return verdict

    def short_of(self, bounds: list[int]) -> str | None:
        """Why a node with at most `bounds[i]` devices acceptable to alternative i cannot fit the claim, or None when
        every request has an alternative with enough."""
        for request, alternatives in self.requests:
            if any(bounds[i] >= count for i, _, count in alternatives):
                continue
            if len(alternatives) == 1:
                i, _, count = alternatives[0]
                return (f"request '{request}' cannot be satisfied: needs {count} devices, at most {bounds[i]} on "
                        "the node match its selectors")
            each = "; ".join(f"'{name}' needs {count}, at most {bounds[i]} match" for i, name, count in alternatives)
            return f"request '{request}' cannot be satisfied: no subrequest has enough devices ({each})"
        return None

    @property
    def _read_names(self) -> frozenset[str]:
        found = self._read_name_set
        if found is None:
            found = self._read_name_set = frozenset(
                name for domain, ident in self.attribute_reads for name in (domain + "/" + ident, ident)
            )
        return found

    def _names(self, driver: str) -> tuple[tuple[str, str | None], ...]:
        """(qualified name, bare name when the domain is the driver's) of every attribute read."""
        found = self._names_by_driver.get(driver)
        if found is None:
            found = self._names_by_driver[driver] = tuple(
                (domain + "/" + ident, ident if domain == driver else None) for domain, ident in self.attribute_reads
            )
        return found

    def _judge(self, driver: str, attributes: Mapping[str, Any], device: Mapping[str, Any]) -> tuple[bool, ...]:
        """Per alternative: may its selectors accept the device (True where it cannot be told)."""
        every = (True,) * len(self.alternatives)
        values: dict[str, Any] = {}
        for domain, ident in self.attribute_reads:
            for name in (domain + "/" + ident, ident if domain == driver else None):
                if name is None or name not in attributes:
                    continue
                parsed = _fast_attribute(attributes[name])
                if parsed is _SLOW:
                    return every
                values[name] = parsed
        view = DeviceView(
            DeviceInput(driver=driver, attributes=values, capacity={},
                        allow_multiple_allocations=device.get("allowMultipleAllocations") is True),
            declare_allow_multiple=self.gates.consumable_capacity,
        )
        verdicts = []
        for selectors in self.alternatives:
            try:
                verdicts.append(all(self.cel.matches_view(selector, view) for selector in selectors))
            except CelRuntimeError:
                verdicts.append(True)  # the search aborts on it where it meets the device: keep it
        return tuple(verdicts)


UNBOUNDED = 1 << 40  # "any number of devices": far above any count a request may ask for


def _add(found: list[int], verdicts: tuple[bool, ...], multiple: bool) -> None:
    for i, accepted in enumerate(verdicts):
        if accepted:
            found[i] = UNBOUNDED if multiple else found[i] + 1


def claim_reach(
    claim: Mapping[str, Any],
    classes: Iterable[Mapping[str, Any]],
    *,
    cel: DraCelEnvironment,
    feature_gates: Mapping[str, bool] | None = None,
) -> ClaimReach | None:
    """A judge of which slices can matter to `claim`, or None when it cannot judge exactly (module doc)."""
    try:
        parsed = parse_resource_claim(claim)
    except InvalidObjectError:
        return None
    by_name: dict[str, list[str]] = {}
    for raw in classes:
        try:
            device_class = parse_class(raw)
        except InvalidObjectError:
            return None
        by_name[device_class.name] = list(device_class.selectors)
    alternatives: list[tuple[CompiledSelector, ...]] = []
    requests: list[tuple[str, tuple[tuple[int, str, int], ...]]] = []
    reads: set[Read] = set()
    for request in parsed.requests:
        requests.append((request.name, tuple((len(alternatives) + k, alt.name, alt.count)
                                             for k, alt in enumerate(request.alternatives))))
        for alt in request.alternatives:
            if alt.mode == MODE_ALL or alt.class_name not in by_name:
                return None
            compiled: list[CompiledSelector] = []
            for expression in (*by_name[alt.class_name], *alt.selectors):
                try:
                    selector = cel.compile(expression)
                except CelCompileError:
                    return None
                if selector.reads is None:
                    return None
                reads.update(selector.reads)
                compiled.append(selector)
            alternatives.append(tuple(compiled))
    if not alternatives:
        return None
    attribute_reads: list[tuple[str, str]] = []
    reads_allow_multiple = False
    for read in sorted(reads):
        if read == ("driver",):
            continue
        if read == ("allowMultipleAllocations",):
            reads_allow_multiple = True
            continue
        if len(read) == 3 and read[0] == "attributes" and "/" not in read[2]:
            attribute_reads.append((read[1], read[2]))
            continue
        return None  # capacity, a whole domain map, a qualified id: not judged here
    return ClaimReach(
        cel=cel,
        gates=FeatureGates.from_mapping(feature_gates),
        alternatives=tuple(alternatives),
        attribute_reads=tuple(attribute_reads),
        reads_allow_multiple=reads_allow_multiple,
        requests=tuple(requests),
    )


class _LightDevice(msgspec.Struct, frozen=True):
    attributes: dict[str, msgspec.Raw] | None = None
    allowMultipleAllocations: bool | None = None


class _LightPool(msgspec.Struct, frozen=True):
    name: str | None = None


class _LightSpec(msgspec.Struct, frozen=True):
    driver: str | None = None
    pool: _LightPool | None = None
    nodeName: str | None = None
    devices: list[_LightDevice] | None = None


class _LightSlice(msgspec.Struct, frozen=True):
    """What the sieve reads of a ResourceSlice: its pool, its node and its devices' attributes, each value left
    encoded (a typed decode skips every other field without building it: capacities, counters, names, metadata)."""

    spec: _LightSpec | None = None


# The light view's parts, for a caller that builds them from another encoding (explain's protobuf LIST).
LightSpec = _LightSpec
LightDevice = _LightDevice
LightPool = _LightPool
_LIGHT = msgspec.json.Decoder(_LightSlice)
_FULL: msgspec.json.Decoder[Any] = msgspec.json.Decoder()


@dataclass(frozen=True)
class Pruned:
    """What a PoolSieve left out: whole pools, their slices and devices, no request's selectors can use; and the
    nodes where some request's selectors accept fewer devices than it asks for (`short_nodes`: node -> why), with
    the pools, slices and devices of theirs left out for that."""

    pools: int = 0
    slices: int = 0
    devices: int = 0
    short_nodes: Mapping[str, str] = field(default_factory=dict)
    short_pools: int = 0
    short_slices: int = 0
    short_devices: int = 0

    def __add__(self, other: Pruned) -> Pruned:
        return Pruned(self.pools + other.pools, self.slices + other.slices, self.devices + other.devices,
                      {**self.short_nodes, **other.short_nodes}, self.short_pools + other.short_pools,
                      self.short_slices + other.short_slices, self.short_devices + other.short_devices)


_MIXED = "\0mixed"  # a pool whose slices name different nodes, or none: it counts for every node


class PoolSieve:
    """Takes raw slices one by one, as a LIST or watch-list decodes them, and keeps every slice of each pool that
    one of its slices may serve (`ClaimReach.may_serve`): a pool is kept or left out whole, since its other slices
    decide its completeness, validity and counter sets. `reach` None keeps everything. The slices of a pool not
    (yet) known to serve are held until `result()`: a later slice of the pool may still turn it. Where the claim
    asks for several devices (`ClaimReach.counts`), it also counts per pool the devices each request alternative
    may accept, and leaves out the pools of nodes that cannot have enough (module doc)."""

    def __init__(self, reach: ClaimReach | None) -> None:
        self._reach = reach
        self._counting = reach is not None and reach.counts
        # Each slice decoded, or still encoded (add_encoded), with its pool and its count of devices.
        self._slices: list[tuple[dict[str, Any] | bytes | Callable[[], dict[str, Any]], tuple[str, str], int]] = []
        self._serving: set[tuple[str, str]] = set()
        # Counting: per pool, its node (_MIXED: none or several) and per alternative the devices it may accept.
        self._node_of: dict[tuple[str, str], str] = {}
        self._accepted: dict[tuple[str, str], list[int]] = {}

    def add(self, raw: dict[str, Any]) -> None:
        key = _pool_key(raw)
        spec = raw.get("spec")
        found = spec.get("devices") if isinstance(spec, dict) else None
        self._slices.append((raw, key, len(found) if isinstance(found, list) else 0))
        if self._counting:
            assert self._reach is not None
            node = spec.get("nodeName") if isinstance(spec, dict) else None
            self._count(key, node if isinstance(node, str) else None, self._reach.accepted(raw))
        elif key not in self._serving and (self._reach is None or self._reach.may_serve(raw)):
            self._serving.add(key)

    def add_encoded(self, encoded: bytes) -> None:
        """A slice as its JSON bytes: only its pool and its devices' attributes are decoded now; the whole slice is
        decoded in `result()`, and only when its pool is kept. Raises ValueError for what is not JSON."""
        try:
            light = _LIGHT.decode(encoded)
        except msgspec.ValidationError:
            # Not of the shape the light view expects (a field of another type): judged on the full decode, where
            # every check keeps what it cannot read.
            self.add(_FULL.decode(encoded))
            return
        self.add_light(light.spec or _LightSpec(), encoded)

    def add_light(self, spec: LightSpec, whole: bytes | Callable[[], dict[str, Any]]) -> None:
        """A slice whose light view was decoded elsewhere (explain's protobuf LIST: k8s/sliceproto.py), with the slice
        whole: its JSON bytes, or a function that decodes it, called in `result()` only when its pool is kept."""
        key = (spec.driver or "?", (spec.pool.name if spec.pool else None) or "?")
        self._slices.append((whole, key, len(spec.devices or ())))
        if self._counting:
            assert self._reach is not None
            self._count(key, spec.nodeName, self._reach.accepted_light(spec))
        elif key not in self._serving and (self._reach is None or self._reach.may_serve_light(spec)):
            self._serving.add(key)

    def judging(self, pool: tuple[str, str]) -> bool:
        """Whether a slice of `pool` (driver, pool name) needs its devices judged for `add_judged`: not where the
        sieve does not count per node and the pool is already known to serve (a pool is kept whole)."""
        return self._counting or pool not in self._serving

    def add_judged(self, pool: tuple[str, str], node: str | None, devices: int, accepted: list[int] | None,
                   whole: bytes | Callable[[], dict[str, Any]]) -> None:
        """A slice judged by the caller (explain's protobuf feed judges each distinct device once per slice): its
        pool (driver or "?", pool name or "?"), node, count of devices and, per request alternative, how many of
        its devices the selectors may accept (UNBOUNDED: any number), as `ClaimReach.accepted_light` counts them;
        None only where `judging(pool)` is False."""
        self._slices.append((whole, pool, devices))
        if accepted is None:
            if self.judging(pool):
                raise ValueError(f"pool {pool}: a slice that needs judging came without its verdicts")
            return
        if self._counting:
            self._count(pool, node, accepted)
        elif any(accepted):
            self._serving.add(pool)

    def _count(self, key: tuple[str, str], node: str | None, accepted: list[int]) -> None:
        if any(accepted):
            self._serving.add(key)
        known = self._node_of.setdefault(key, node or _MIXED)
        if known != node:
            self._node_of[key] = _MIXED
        total = self._accepted.get(key)
        if total is None:
            self._accepted[key] = accepted
        else:
            for i, n in enumerate(accepted):
                total[i] = min(total[i] + n, UNBOUNDED)

    def clear(self) -> None:
        """Forget every slice taken (the LIST starts again from its first object)."""
        self._slices, self._serving, self._node_of, self._accepted = [], set(), {}, {}

    def _short_nodes(self) -> dict[str, str]:
        """Node -> why it cannot fit the claim, for the nodes whose own serving pools, with every pool not local to
        one node, hold fewer devices some request accepts than it asks for."""
        if not self._counting or self._reach is None:
            return {}
        everywhere = [0] * len(self._reach.alternatives)
        by_node: dict[str, list[int]] = {}
        for key in self._serving:
            node = self._node_of[key]
            into = everywhere if node == _MIXED else by_node.setdefault(node, [0] * len(everywhere))
            for i, n in enumerate(self._accepted[key]):
                into[i] = min(into[i] + n, UNBOUNDED)
        short = {}
        for node, bounds in by_node.items():
            why = self._reach.short_of([min(a + b, UNBOUNDED) for a, b in zip(bounds, everywhere, strict=True)])
            if why is not None:
                short[node] = why
        return short

    def result(self) -> tuple[list[dict[str, Any]], Pruned]:
        """(the kept slices in the order they came, what was left out)."""
        short = self._short_nodes()
        kept: list[dict[str, Any]] = []
        left_pools: set[tuple[str, str]] = set()
        short_pools: set[tuple[str, str]] = set()
        slices = devices = short_slices = short_devices = 0
        for raw, key, count in self._slices:
            if key in self._serving:
                if short and self._node_of[key] in short:
                    short_pools.add(key)
                    short_slices += 1
                    short_devices += count
                    continue
                if isinstance(raw, bytes):
                    decoded = _FULL.decode(raw)
                    if not isinstance(decoded, dict):
                        raise ValueError(f"a ResourceSlice that is not a JSON object: {raw[:80]!r}")
                    raw = decoded
                elif callable(raw):
                    raw = raw()
                kept.append(raw)
                continue
            left_pools.add(key)
            slices += 1
            devices += count
        return kept, Pruned(len(left_pools), slices, devices, short, len(short_pools), short_slices, short_devices)


def _pool_key(raw: Mapping[str, Any]) -> tuple[str, str]:
    spec = raw.get("spec")
    pool = spec.get("pool") if isinstance(spec, dict) else None
    driver = spec.get("driver") if isinstance(spec, dict) else None
    name = pool.get("name") if isinstance(pool, dict) else None
    return (str(driver or "?"), str(name or "?"))
