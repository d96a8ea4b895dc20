"""What a GpuSharingPolicy's status counts (pure): the published devices its class selects, the nodes they are on, and
the allocated ResourceClaims whose devices came from the class.

Slices are read with the allocator's parser (`dra_driver.allocation.model`) and devices are judged with the
project's CEL environment, exactly as the allocator would judge them against the class's selectors: all
selectors must be true; a selector that fails to evaluate on a device does not select it.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from dra_driver.allocation.model import ParseCache, parse_slice
from dra_driver.cel import CelCompileError, CelRuntimeError, DeviceInput, DeviceView, DraCelEnvironment
from dra_driver.resourceapi import InvalidObjectError, parse_resource_claim


@dataclass(frozen=True)
class PublishedDevice:
    """One device of a slice, with the node it is on (None: a slice for several nodes)."""

    node: str | None
    device: DeviceInput


@dataclass(frozen=True)
class SliceDevices:
    """What counting needs of one ResourceSlice."""

    name: str
    driver: str
    pool: str
    generation: int
    node: str | None
    devices: tuple[PublishedDevice, ...]


def slice_devices(obj: Mapping[str, Any], cache: ParseCache | None = None) -> SliceDevices | None:
    """A ResourceSlice object → its devices; None for a slice the allocator could not read either. `cache`: shared
    with other slices' parses (a long-lived view keeps one)."""
    try:
        parsed = parse_slice(dict(obj), cache)
    except InvalidObjectError:
        return None
    node = parsed.target.node_name
    devices = tuple(
        PublishedDevice(
            node=(d.target.node_name if d.target is not None else node),
            device=DeviceInput(
                driver=parsed.driver,
                attributes=d.attributes,
                capacity={name: cap.value for name, cap in d.capacity.items()},
                allow_multiple_allocations=d.allow_multiple_allocations,
            ),
        )
        for d in parsed.devices
    )
    return SliceDevices(parsed.name, parsed.driver, parsed.pool, parsed.generation, node, devices)


def current_slices(slices: Iterable[SliceDevices]) -> list[SliceDevices]:
    """The slices of each pool's newest generation (older ones are being replaced: their devices would count
    twice)."""
    slices = list(slices)
    newest: dict[tuple[str, str], int] = {}
    for s in slices:
        key = (s.driver, s.pool)
        newest[key] = max(newest.get(key, s.generation), s.generation)
    return [s for s in slices if s.generation == newest[(s.driver, s.pool)]]


def selects(cel: DraCelEnvironment, selectors: Sequence[str], device: DeviceInput) -> bool:
    """Whether every selector is true for the device (an evaluation or compile error: not selected)."""
    view = DeviceView(device, declare_allow_multiple=cel.consumable_capacity)  # verdicts cached per read values
    try:
        return all(cel.matches_view(cel.compile(expression), view) for expression in selectors)
    except (CelRuntimeError, CelCompileError):
        return False


@dataclass(frozen=True)
class Counts:
    devices: int
    nodes: int
    claims: int


def matching_nodes(cel: DraCelEnvironment, selectors: Sequence[str], slice_: SliceDevices) -> list[str | None]:
    """The node of every device of the slice the selectors select (None for a device without one node)."""
    return [d.node for d in slice_.devices if selects(cel, selectors, d.device)]


def tally(per_slice: Iterable[Sequence[str | None]], claims: int) -> Counts:
    """Counts from the matching devices' nodes of every current slice."""
    devices, nodes = 0, set[str]()
    for found in per_slice:
        devices += len(found)
        nodes.update(n for n in found if n is not None)
    return Counts(devices=devices, nodes=len(nodes), claims=claims)


def claim_classes(obj: Mapping[str, Any]) -> frozenset[str]:
    """The DeviceClasses the allocated devices of a ResourceClaim came from: each result's `request` (or
    `request/subrequest` for a prioritized list) → that request's `deviceClassName`. Empty when unallocated, and
    for a claim the strict parser refuses (the API server validates claims, so only a broken object is refused; it
    is not counted rather than counted wrongly)."""
    try:
        claim = parse_resource_claim(obj)
    except InvalidObjectError:
        return frozenset()
    return frozenset(name for result in claim.results if (name := claim.device_class_of(result)) is not None)
