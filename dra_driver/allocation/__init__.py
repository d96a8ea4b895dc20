"""Pure DRA allocator (the kube-scheduler's structured allocation) and its explanations."""

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
