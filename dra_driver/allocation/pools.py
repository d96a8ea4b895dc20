"""Which resource pools (and devices) a node can allocate from.

Rules (Kubernetes structured allocator): slices are grouped into pools by (driver, pool name); only
the newest generation of a pool counts; a pool with fewer slices at that generation than
resourceSliceCount is incomplete and skipped; a pool whose counter sets, counter references or device
names are inconsistent is invalid and skipped. Counter sets may live in other slices of the same pool
(the 1.35 split layout), including slices that do not target this node.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from dra_driver.allocation.model import (
    CounterSet,
    Device,
    DeviceClass,
    Node,
    ParseCache,
    ResourceSlice,
    parse_class,
    parse_slice,
)
from dra_driver.allocation.nodes import target_matches
from dra_driver.resourceapi import DeviceId, InvalidObjectError, ResourceClaim, parse_resource_claim

PoolKey = tuple[str, str]  # (driver, pool name)


@dataclass(frozen=True)
class Candidate:
    """A device this node may allocate, with its place in the deterministic search order."""

    id: DeviceId
    device: Device
    slice: ResourceSlice
    order: int


@dataclass(frozen=True)
class PoolProblem:
    driver: str
    pool: str
    kind: str  # "incomplete" | "invalid"
    reason: str

    def __str__(self) -> str:
        return f"pool {self.driver}/{self.pool} is {self.kind}: {self.reason}"


@dataclass(frozen=True)
class Pool:
    driver: str
    name: str
    generation: int
    devices_on_node: tuple[Device, ...]
    # Every device of the current generation, on any node: allocated ones consume counters wherever they live.
    all_devices: Mapping[str, Device]
    counter_sets: Mapping[str, CounterSet]

    @property
    def key(self) -> PoolKey:
        return (self.driver, self.name)


@dataclass(frozen=True)
class NodePools:
    pools: tuple[Pool, ...]
    candidates: tuple[Candidate, ...]  # devices of usable pools on this node, in slice/device order
    problems: tuple[PoolProblem, ...]  # incomplete/invalid pools that touch this node
    unusable_devices: tuple[tuple[DeviceId, PoolProblem], ...]  # devices on this node inside such pools

    def pool(self, key: PoolKey) -> Pool | None:
        for pool in self.pools:
            if pool.key == key:
                return pool
        return None


def _lenient_ids(obj: Mapping[str, Any]) -> tuple[str, str, str | None]:
    spec = obj.get("spec") if isinstance(obj.get("spec"), Mapping) else {}
    assert isinstance(spec, Mapping)
    pool = spec.get("pool") if isinstance(spec.get("pool"), Mapping) else {}
    assert isinstance(pool, Mapping)
    node_name = spec.get("nodeName")
    return (
        str(spec.get("driver") or "?"),
        str(pool.get("name") or "?"),
        node_name if isinstance(node_name, str) else None,
    )


def _version(obj: Mapping[str, Any]) -> tuple[str, str] | None:
    """(uid, resourceVersion) of an object that has both, else None."""
    meta = obj.get("metadata")
    if not isinstance(meta, Mapping):
        return None
    uid, version = meta.get("uid"), meta.get("resourceVersion")
    return (uid, version) if isinstance(uid, str) and uid and isinstance(version, str) and version else None


def _slice_touches_node(s: ResourceSlice, node: Node, partitionable: bool) -> bool:
    if s.per_device_node_selection:
        return partitionable and any(d.target is not None and target_matches(d.target, node) for d in s.devices)
    return target_matches(s.target, node)


def _validate_pool(current: list[ResourceSlice]) -> str | None:
    counts = {s.slice_count for s in current}
    if len(counts) > 1:
        return f"slices disagree on resourceSliceCount ({sorted(counts)}) at generation {current[0].generation}"
    if len(current) > current[0].slice_count:
        return (
            f"{len(current)} slices at generation {current[0].generation} but resourceSliceCount is "
            f"{current[0].slice_count}"
        )
    names: set[str] = set()
    sets: dict[str, CounterSet] = {}
    for s in current:
        for cs in s.shared_counters:
            if cs.name in sets:
                return f"counter set {cs.name!r} is defined more than once (slice {s.name})"
            sets[cs.name] = cs
        for d in s.devices:
            if d.name in names:
                return f"device name {d.name!r} appears more than once (slice {s.name})"
            names.add(d.name)
    for s in current:
        for d in s.devices:
            for consumption in d.consumes_counters:
                counter_set = sets.get(consumption.counter_set)
                if counter_set is None:
                    return (
                        f"device {d.name!r} consumes from counter set {consumption.counter_set!r}, "
                        "which the pool does not define"
                    )
                for counter in consumption.counters:
                    if counter not in counter_set.counters:
                        return (
                            f"device {d.name!r} consumes counter {counter!r}, which counter set "
                            f"{consumption.counter_set!r} does not define"
                        )
    return None


class SliceIndex:
    """The cluster's ResourceSlices, grouped by pool without parsing, each parsed at most once, on demand.

    Build one per pass over many nodes (`dra-driver explain`, a scheduler pass) and give it to every
    `allocate()` call: a node then parses only the pools that can touch it (a pool all of whose slices name
    another node in `spec.nodeName` cannot), and a slice parsed for one node is reused for the next.
    The raw objects must not change while the index is in use.

    `previous`: the index of an earlier pass (a long-lived scheduler). A slice whose metadata.uid and
    metadata.resourceVersion are both those of a slice it had parsed is not parsed again (the API server
    gives every change a new resourceVersion), and parsed pieces are shared through its ParseCache.
    """

    def __init__(self, raw_slices: Iterable[Mapping[str, Any]], *, previous: SliceIndex | None = None) -> None:
        self._raw: list[Mapping[str, Any]] = list(raw_slices)
        self._parsed: dict[int, ResourceSlice | InvalidObjectError] = {}
        # Devices of one product share their parsed capacities and counters.
        self._cache: ParseCache = previous._cache if previous is not None else ParseCache()
        self._versions: list[tuple[str, str] | None] = [_version(raw) for raw in self._raw]
        self._by_pool: dict[PoolKey, list[int]] = {}
        self._on_node: dict[str, set[PoolKey]] = {}  # node name -> pools with a slice naming that node
        self._anywhere: set[PoolKey] = set()  # pools with a slice that does not name one node
        self._claims: dict[int, tuple[Mapping[str, Any], ResourceClaim]] = {}
        self._classes: dict[int, tuple[Mapping[str, Any], DeviceClass | InvalidObjectError]] = {}
        # A view's judge of pools (`sieved`), and its verdicts so far; None: every pool is kept.
        self._may_serve: Callable[[Mapping[str, Any]], bool] | None = None
        self._kept: dict[PoolKey, bool] = {}
        if previous is not None:
            known = previous._parsed_by_version()
            for i, version in enumerate(self._versions):
                parsed = known.get(version) if version is not None else None
                if parsed is not None:
                    self._parsed[i] = parsed
        for i, raw in enumerate(self._raw):
            driver, pool_name, node_name = _lenient_ids(raw)
            key = (driver, pool_name)
            self._by_pool.setdefault(key, []).append(i)
            if node_name:
                self._on_node.setdefault(node_name, set()).add(key)
            else:
                self._anywhere.add(key)

    def __len__(self) -> int:
        return len(self._raw)

    def allocated_claim(self, obj: Mapping[str, Any]) -> ResourceClaim:
        """An allocated claim of the pass, parsed once for all the nodes the pass tries (the allocator reads every
        allocated claim for each). By identity: the raw objects must not change while the index is in use, and a
        claim rebuilt with a tentative allocation is a new object, so it is parsed anew."""
        hit = self._claims.get(id(obj))
        if hit is not None and hit[0] is obj:
            return hit[1]
        parsed = parse_resource_claim(obj)
        self._claims[id(obj)] = (obj, parsed)  # holding `obj` keeps its id from being reused
        return parsed

    def device_class(self, obj: Mapping[str, Any]) -> DeviceClass:
        """A DeviceClass of the pass, parsed once for all its nodes (by identity, as `allocated_claim`); raises
        InvalidObjectError, every time, for a malformed one."""
        hit = self._classes.get(id(obj))
        if hit is None or hit[0] is not obj:
            try:
                parsed: DeviceClass | InvalidObjectError = parse_class(obj)
            except InvalidObjectError as err:
                parsed = err
            hit = self._classes[id(obj)] = (obj, parsed)
        if isinstance(hit[1], InvalidObjectError):
            raise hit[1]
        return hit[1]

    @property
    def parsed_count(self) -> int:
        """How many slices this index holds parsed (taken over from `previous` or parsed on demand)."""
        return len(self._parsed)

    def _parsed_by_version(self) -> dict[tuple[str, str], ResourceSlice | InvalidObjectError]:
        out = {}
        for i, parsed in self._parsed.items():
            version = self._versions[i]
            if version is not None:
                out[version] = parsed
        return out

    def parsed(self, i: int) -> ResourceSlice | InvalidObjectError:
        cached = self._parsed.get(i)
        if cached is None:
            try:
                cached = parse_slice(self._raw[i], self._cache)
            except InvalidObjectError as err:
                cached = err
            self._parsed[i] = cached
        return cached

    def relevant(self, node_name: str) -> list[int]:
        """Indexes (in input order) of every slice of every pool that may touch `node_name`.

        A slice whose spec.nodeName is another node never touches this one, parsed or not (a valid one
        targets only that node, a malformed one only invalidates its pool there), so a pool made only
        of such slices is left out; any other pool is kept whole, since its other slices decide its
        completeness, validity and counter sets. A sieved view also leaves out the pools its judge rejects."""
        keys = self._anywhere | self._on_node.get(node_name, set())
        if self._may_serve is not None:
            keys = {key for key in keys if self._pool_kept(key)}
        return sorted(i for key in keys for i in self._by_pool[key])

    def sieved(self, may_serve: Callable[[Mapping[str, Any]], bool]) -> SliceIndex:
        """A view of this index without the pools none of whose raw slices `may_serve` (for one pass of one
        claim or pod: allocation/prune.py's `ClaimReach.may_serve` judges a slice before any device is parsed).
        A pool is kept or left out whole, as `relevant` keeps it. The view shares this index's parses and caches,
        so what it parses is parsed for the index too (a long-lived scheduler index keeps it for the next pod);
        each pool is judged once, on the first node that could use it."""
        view = copy.copy(self)
        view._may_serve = may_serve
        view._kept = {}
        return view

    @property
    def left_out(self) -> int:
        """How many pools this view's judge has left out so far (0 for an index that is no view)."""
        return sum(1 for kept in self._kept.values() if not kept)

    def _pool_kept(self, key: PoolKey) -> bool:
        kept = self._kept.get(key)
        if kept is None:
            assert self._may_serve is not None
            kept = self._kept[key] = any(self._may_serve(self._raw[i]) for i in self._by_pool[key])
        return kept

    def raw(self, i: int) -> Mapping[str, Any]:
        return self._raw[i]


def _lenient_int(value: Any, *, default: int) -> int | None:
    """An integer field as parse_slice reads it (None: not an integer, the parser will refuse the slice)."""
    if value is None:
        return default
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def pools_to_complete(raw_slices: Iterable[Mapping[str, Any]]) -> list[PoolKey]:
    """The pools among `raw_slices` that these slices alone do not complete, in first-seen order.

    For a caller that fetched only part of the cluster's slices (those naming one node, and those naming
    none): a pool listed here has fewer slices at the newest generation seen than that generation's
    resourceSliceCount (or counts that cannot be read), so its missing slices, which name other nodes, must be
    fetched before gathering: they decide its completeness and may hold its counter sets. A pool that looks
    complete is taken as it is; it can differ from the whole cluster's view only when the same pool also has
    slices naming other nodes beside complete slices here (a newer generation, or surplus slices), which no
    driver publishing one pool per node produces."""
    seen: dict[PoolKey, list[tuple[int, int] | None]] = {}  # pool -> (generation, resourceSliceCount) per slice
    for raw in raw_slices:
        driver, pool_name, _ = _lenient_ids(raw)
        spec = raw.get("spec") if isinstance(raw.get("spec"), Mapping) else {}
        assert isinstance(spec, Mapping)
        pool = spec.get("pool") if isinstance(spec.get("pool"), Mapping) else {}
        assert isinstance(pool, Mapping)
        generation = _lenient_int(pool.get("generation"), default=0)
        count = _lenient_int(pool.get("resourceSliceCount"), default=1)
        entry = (generation, count) if generation is not None and count is not None else None
        seen.setdefault((driver, pool_name), []).append(entry)
    out = []
    for key, entries in seen.items():
        readable = [e for e in entries if e is not None]
        if len(readable) < len(entries):
            out.append(key)
            continue
        generation = max(g for g, _ in readable)
        counts = {c for g, c in readable if g == generation}
        current = sum(1 for g, _ in readable if g == generation)
        if len(counts) > 1 or current < counts.pop():
            out.append(key)
    return out


def gather_pools(
    raw_slices: Iterable[Mapping[str, Any]] | SliceIndex,
    node: Node,
    *,
    partitionable: bool,
    compatibility_groups: bool = False,
) -> NodePools:
    """Group slices into pools and keep the devices usable on `node`, in input order. Without
    `compatibility_groups` (DRADeviceCompatibilityGroups) a slice whose devices name KEP-5963 groups is ignored and
    its pool counts as incomplete, as kube-scheduler 1.37's GatherPools does: it could not enforce them."""
    index = raw_slices if isinstance(raw_slices, SliceIndex) else SliceIndex(raw_slices)
    grouped: dict[PoolKey, list[ResourceSlice]] = {}
    broken: dict[PoolKey, str] = {}
    for i in index.relevant(node.name):
        parsed = index.parsed(i)
        if isinstance(parsed, InvalidObjectError):
            driver, pool_name, node_name = _lenient_ids(index.raw(i))
            if node_name in (None, node.name):
                broken.setdefault((driver, pool_name), str(parsed))
                grouped.setdefault((driver, pool_name), [])
            continue
        grouped.setdefault((parsed.driver, parsed.pool), []).append(parsed)

    pools: list[Pool] = []
    problems: list[PoolProblem] = []
    unusable: list[tuple[DeviceId, PoolProblem]] = []
    candidates: list[Candidate] = []
    for (driver, name), slices in grouped.items():
        if (driver, name) in broken:
            problems.append(PoolProblem(driver, name, "invalid", broken[(driver, name)]))
            continue
        generation = max(s.generation for s in slices)
        current = [s for s in slices if s.generation == generation]
        grouped_out = 0 if compatibility_groups else sum(s.uses_compatibility_groups for s in current)
        if grouped_out:
            current = [s for s in current if not s.uses_compatibility_groups]
        # Without DRAPartitionableDevices the scheduler does not see per-device node selection at all.
        current_for_node = current if partitionable else [s for s in current if not s.per_device_node_selection]
        touching = [s for s in current_for_node if _slice_touches_node(s, node, partitionable)]
        if not touching:
            continue
        # Incompleteness comes first: a missing slice may hold the counter sets the others refer to.
        problem: PoolProblem | None = None
        reason = _validate_pool(current)
        expected = max(s.slice_count for s in current)
        if grouped_out:
            problem = PoolProblem(
                driver,
                name,
                "incomplete",
                f"{grouped_out} of its {expected} slices name KEP-5963 compatibility groups, which are ignored "
                "without DRADeviceCompatibilityGroups",
            )
        elif len(current) < expected:
            problem = PoolProblem(
                driver,
                name,
                "incomplete",
                f"{len(current)} of {expected} slices published at generation {generation}; "
                "the driver is still updating it",
            )
        elif reason is not None:
            problem = PoolProblem(driver, name, "invalid", reason)
        node_devices: list[tuple[ResourceSlice, Device]] = []
        for s in touching:
            for d in s.devices:
                if s.per_device_node_selection and (d.target is None or not target_matches(d.target, node)):
                    continue
                node_devices.append((s, d))
        if problem is not None:
            problems.append(problem)
            unusable.extend((DeviceId(driver, name, d.name), problem) for _, d in node_devices)
            continue
        pool = Pool(
            driver=driver,
            name=name,
            generation=generation,
            devices_on_node=tuple(d for _, d in node_devices),
            all_devices={d.name: d for s in current for d in s.devices},
            counter_sets={cs.name: cs for s in current for cs in s.shared_counters} if partitionable else {},
        )
        pools.append(pool)
        for s, d in node_devices:
            candidates.append(Candidate(DeviceId(driver, name, d.name), d, s, len(candidates)))
    return NodePools(tuple(pools), tuple(candidates), tuple(problems), tuple(unusable))
