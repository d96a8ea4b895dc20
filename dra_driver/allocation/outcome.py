"""What allocate() returns: the allocation to write, or a structured explanation of why not."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class ReasonCount:
    """How many of the considered devices failed for one reason, with a few examples."""

    reason: str
    count: int
    examples: tuple[str, ...] = ()  # "driver/pool/device" or "driver/pool/device (detail)"


@dataclass(frozen=True)
class RequestExplanation:
    request: str  # "<request>" or "<request>/<subrequest>"
    device_class: str
    wanted: str  # "1 device", "3 devices", "all matching devices"
    considered: int  # devices on the node (including those in unusable pools)
    available: int  # devices that pass every per-device check on their own
    reasons: tuple[ReasonCount, ...]
    problem: str | None = None  # why this request cannot be satisfied on its own, if it cannot
    # The most telling device reason, with its detail: the most frequent one among the devices that match the
    # request's selectors (why the candidates are unavailable), else the most frequent one overall.
    leading: str = ""


@dataclass(frozen=True)
class Explanation:
    claim: str  # namespace/name
    node: str
    summary: str
    requests: tuple[RequestExplanation, ...] = ()
    pool_problems: tuple[str, ...] = ()
    unsatisfiable_constraints: tuple[str, ...] = ()
    errors: tuple[str, ...] = ()  # claim-level problems (class not found, admin access, gates, CEL)
    # One line naming the leading reason without the node or device names, so that a scheduler can group nodes
    # failing for the same reason (kube-scheduler's "N node(s) ..." summary). Empty: use `summary`.
    reason: str = ""

    @property
    def leading_reason(self) -> str:
        return self.reason or self.summary


@dataclass(frozen=True)
class AllocationOutcome:
    claim: str
    node: str
    allocation: Mapping[str, Any] | None = None  # the status.allocation object to write
    explanation: Explanation | None = None

    @property
    def ok(self) -> bool:
        return self.allocation is not None


@dataclass(frozen=True)
class PodAllocationOutcome:
    """All claims of a pod on one node: one allocated outcome per claim, in the pod's order, or the failure of the
    claim that decided that the node cannot take them (its explanation says why)."""

    outcomes: tuple[AllocationOutcome, ...] = ()
    failure: AllocationOutcome | None = None

    @property
    def ok(self) -> bool:
        return self.failure is None
