"""Device taints and request tolerations (DRADeviceTaints)."""

from __future__ import annotations

from collections.abc import Sequence

from dra_driver.allocation.model import Taint
from dra_driver.resourceapi import Toleration

# Only these effects keep a device from being allocated; None (1.35+) and unknown effects never do.
BLOCKING_EFFECTS = frozenset({"NoSchedule", "NoExecute"})


def tolerates(toleration: Toleration, taint: Taint) -> bool:
    if toleration.effect and toleration.effect != taint.effect:
        return False
    if toleration.operator == "Exists":
        return not toleration.key or toleration.key == taint.key
    return toleration.key == taint.key and toleration.value == taint.value


def blocking_taint(taints: Sequence[Taint], tolerations: Sequence[Toleration]) -> Taint | None:
    """The first taint that prevents allocation, or None when the device is usable."""
    for taint in taints:
        if taint.effect in BLOCKING_EFFECTS and not any(tolerates(t, taint) for t in tolerations):
            return taint
    return None
