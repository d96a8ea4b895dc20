"""Consumable capacity (DRAConsumableCapacity): how much of a device one allocation takes."""

from __future__ import annotations

from dataclasses import dataclass

from dra_driver.allocation.model import DeviceCapacity
from dra_driver.k8s.quantity import Quantity


@dataclass(frozen=True)
class CapacityShortfall:
    """Why a capacity request cannot be served by a device."""

    capacity: str
    detail: str


def consumed_amount(name: str, capacity: DeviceCapacity, requested: Quantity | None) -> Quantity | CapacityShortfall:
    """The amount one share consumes, after applying the capacity's requestPolicy.

    No request: the policy default, else the whole capacity. With validValues the request rounds up to the
    smallest valid value; with validRange it is raised to min and rounded up to a multiple of step above
    min, and must not exceed max.
    """
    policy = capacity.policy
    if requested is None:
        if policy is not None and policy.default is not None:
            return policy.default
        return capacity.value
    if policy is None:
        return requested
    if policy.valid_values:
        for value in policy.valid_values:
            if value >= requested:
                return value
        return CapacityShortfall(
            name, f"requested {requested} is above the largest valid value {policy.valid_values[-1]}"
        )
    if policy.valid_range is not None:
        rng = policy.valid_range
        amount = requested if requested >= rng.min else rng.min
        if rng.step is not None:
            over = amount.nanos - rng.min.nanos
            steps = -(-over // rng.step.nanos)
            amount = Quantity(rng.min.nanos + steps * rng.step.nanos, requested.format)
        if rng.max is not None and amount > rng.max:
            return CapacityShortfall(name, f"requested {requested} rounds to {amount}, above the maximum {rng.max}")
        return amount
    return requested
