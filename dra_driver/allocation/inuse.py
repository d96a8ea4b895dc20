"""What the cluster's existing allocations already use: exclusive devices, shares, counters."""

from __future__ import annotations

from collections.abc import Callable, Collection, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from dra_driver.allocation.pools import Pool
from dra_driver.cel import split_qualified_name
from dra_driver.resourceapi import DeviceId, ResourceClaim, parse_resource_claim

CounterKey = tuple[str, str]  # (counter set, counter)


def capacity_key(name: str, driver: str) -> str:
    """Canonical `domain/id` for a capacity name so "memory" and "gpu.dra.dev/memory" meet."""
    domain, ident = split_qualified_name(name, driver)
    return f"{domain}/{ident}"


@dataclass(frozen=True)
class InUse:
    exclusive: Mapping[DeviceId, str] = field(default_factory=dict)  # device -> claim (ns/name) holding it
    shared: Mapping[DeviceId, Mapping[str, int]] = field(default_factory=dict)  # device -> capacity key -> nanos
    share_holders: Mapping[DeviceId, tuple[str, ...]] = field(default_factory=dict)

    def in_use(self, device: DeviceId) -> bool:
        """In use for counter accounting: held exclusively or by at least one share."""
        return device in self.exclusive or device in self.shared

    def counters_consumed(self, pool: Pool) -> dict[CounterKey, int]:
        """Counter amounts (nanos) drawn by the pool's allocated devices, wherever those devices live."""
        consumed: dict[CounterKey, int] = {}
        for name, device in pool.all_devices.items():
            if not self.in_use(DeviceId(pool.driver, pool.name, name)):
                continue
            for consumption in device.consumes_counters:
                for counter, amount in consumption.counters.items():
                    key = (consumption.counter_set, counter)
                    consumed[key] = consumed.get(key, 0) + amount.nanos
        return consumed


def gather_in_use(
    allocated_claims: Iterable[Mapping[str, Any]],
    *,
    skip_claims: Collection[str] = (),
    parse: Callable[[Mapping[str, Any]], ResourceClaim] = parse_resource_claim,
) -> InUse:
    """Admin-access results do not use the device; results with a shareID add to the device's shares. The claims
    being allocated (`skip_claims`, namespace/name) are left out. `parse`: SliceIndex.allocated_claim in a pass over
    many nodes."""
    exclusive: dict[DeviceId, str] = {}
    shared: dict[DeviceId, dict[str, int]] = {}
    holders: dict[DeviceId, list[str]] = {}
    for obj in allocated_claims:
        claim = parse(obj)
        if claim.key in skip_claims:
            continue
        for result in claim.results:
            if result.admin_access:
                continue
            if result.share_id is None:
                exclusive.setdefault(result.id, claim.key)
                continue
            per_device = shared.setdefault(result.id, {})
            for name, amount in result.consumed_capacity.items():
                key = capacity_key(name, result.driver)
                per_device[key] = per_device.get(key, 0) + amount.nanos
            holders.setdefault(result.id, []).append(claim.key)
    return InUse(exclusive, shared, {k: tuple(v) for k, v in holders.items()})
