"""Consumable capacity (DRAConsumableCapacity, KEP-5075): how much of a device one allocation takes.

Mirrors the scheduler's allocator (k8s.io/dynamic-resource-allocation, consumable capacity):
- the consumed amount per capacity of the device (`calculateConsumedCapacity`): no request entry -> the
  policy's default, or the whole value when there is no default; validValues -> the smallest valid value
  >= the request; validRange -> below min: min; with a step: min + n*step rounded up (integer `Value()`s);
- then the policy check on that amount (`violatesPolicy`): a default-only policy accepts only the default;
  validRange: not above max and a whole number of steps from min; validValues: one of them.
A violation makes the device ineligible for the request (it is skipped, not an error).
"""

from __future__ import annotations

from dataclasses import dataclass

from dra_driver.allocation.model import DeviceCapacity, RequestPolicy, ValidRange
from dra_driver.k8s.quantity import Quantity, QuantityFormat

_NANO = 10**9


@dataclass(frozen=True)
class CapacityShortfall:
    """Why a capacity request cannot be served by a device."""

    capacity: str
    detail: str


def int_value(quantity: Quantity) -> int:
    """resource.Quantity.Value(): the integer value, rounded up away from zero."""
    magnitude = -(-abs(quantity.nanos) // _NANO)
    return magnitude if quantity.nanos >= 0 else -magnitude


def _round_up_range(requested: Quantity, rng: ValidRange) -> Quantity:
    if requested < rng.min:
        return rng.min
    if rng.step is None:
        return requested
    step, low = int_value(rng.step), int_value(rng.min)
    if step <= 0:  # pragma: no cover - the model refuses a non-positive step
        return requested
    steps = -(-(int_value(requested) - low) // step)
    return Quantity.from_int(low + step * steps, QuantityFormat.BINARY_SI)


def consumed_amount(capacity: DeviceCapacity, requested: Quantity | None) -> Quantity:
    """The amount one share consumes of `capacity` before the policy check (`calculateConsumedCapacity`)."""
    policy = capacity.policy
    if requested is None:
        if policy is not None and policy.default is not None:
            return policy.default
        return capacity.value
    if policy is None:
        return requested
    if policy.valid_values:
        return next((v for v in policy.valid_values if requested <= v), requested)
    if policy.valid_range is not None:
        return _round_up_range(requested, policy.valid_range)
    return requested


def policy_violation(amount: Quantity, policy: RequestPolicy | None) -> str | None:
    """Why `amount` is not allowed by `policy` (`violatesPolicy`), or None."""
    if policy is None:
        return None
    if policy.default is not None and not policy.valid_values and policy.valid_range is None:
        return None if amount == policy.default else f"only the default {policy.default} is allowed"
    rng = policy.valid_range
    if rng is not None:
        if rng.max is not None and amount > rng.max:
            return f"above the maximum {rng.max}"
        step = int_value(rng.step) if rng.step is not None else 0
        if step > 0 and (int_value(amount) - int_value(rng.min)) % step != 0:
            return f"not a whole number of steps of {rng.step} from {rng.min}"
        return None
    if policy.valid_values and amount not in policy.valid_values:
        return f"above the largest valid value {policy.valid_values[-1]}"
    return None


def share_amount(name: str, capacity: DeviceCapacity, requested: Quantity | None) -> Quantity | CapacityShortfall:
    """The amount one share consumes of `capacity`, or why the device's request policy refuses it."""
    amount = consumed_amount(capacity, requested)
    problem = policy_violation(amount, capacity.policy)
    if problem is None:
        return amount
    asked = f"requested {requested}" if requested is not None else "no request"
    rounded = f" rounds to {amount}," if requested is not None and amount != requested else ""
    return CapacityShortfall(name, f"{name}: {asked}{rounded} {problem}")
