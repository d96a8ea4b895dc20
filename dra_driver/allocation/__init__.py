"""Pure DRA allocator (the kube-scheduler's structured allocation) and its explanations.

The package's names load their module on first use (PEP 562 `__getattr__`): a command that needs one small part,
as `status` needs the DeviceTaintRules of `allocation.taints`, does not import the allocator and the CEL compiler
with it (≈ 0.13 s)."""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from dra_driver.allocation.allocator import DEFAULT_MAX_STEPS, allocate, allocate_pod_claims
    from dra_driver.allocation.context import DEFAULT_FEATURE_GATES, FeatureGates
    from dra_driver.allocation.explain import explain_text
    from dra_driver.allocation.model import ADMIN_ACCESS_LABEL
    from dra_driver.allocation.outcome import (
        AllocationOutcome,
        Explanation,
        PodAllocationOutcome,
        ReasonCount,
        RequestExplanation,
    )
    from dra_driver.allocation.pools import SliceIndex, pools_to_complete
    from dra_driver.resourceapi import InvalidObjectError

# Each name the package offers -> the module that defines it.
_HOMES = {
    "DEFAULT_MAX_STEPS": "dra_driver.allocation.allocator",
    "allocate": "dra_driver.allocation.allocator",
    "allocate_pod_claims": "dra_driver.allocation.allocator",
    "DEFAULT_FEATURE_GATES": "dra_driver.allocation.context",
    "FeatureGates": "dra_driver.allocation.context",
    "explain_text": "dra_driver.allocation.explain",
    "ADMIN_ACCESS_LABEL": "dra_driver.allocation.model",
    "AllocationOutcome": "dra_driver.allocation.outcome",
    "Explanation": "dra_driver.allocation.outcome",
    "PodAllocationOutcome": "dra_driver.allocation.outcome",
    "ReasonCount": "dra_driver.allocation.outcome",
    "RequestExplanation": "dra_driver.allocation.outcome",
    "SliceIndex": "dra_driver.allocation.pools",
    "pools_to_complete": "dra_driver.allocation.pools",
    "InvalidObjectError": "dra_driver.resourceapi",
}

__all__ = [
    "ADMIN_ACCESS_LABEL",
    "DEFAULT_FEATURE_GATES",
    "DEFAULT_MAX_STEPS",
    "AllocationOutcome",
    "Explanation",
    "FeatureGates",
    "InvalidObjectError",
    "PodAllocationOutcome",
    "ReasonCount",
    "RequestExplanation",
    "SliceIndex",
    "allocate",
    "allocate_pod_claims",
    "explain_text",
    "pools_to_complete",
]


def __getattr__(name: str) -> Any:
    home = _HOMES.get(name)
    if home is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(home), name)
