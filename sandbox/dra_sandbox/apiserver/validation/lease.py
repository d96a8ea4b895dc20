"""coordination.k8s.io Leases: the numeric rules of kube-apiserver's ValidateLeaseSpec
(pkg/apis/coordination/validation/validation.go); found by the differential suite (docs/differential.md)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from .fielderrors import FORBIDDEN, INVALID, FieldError


def validate_lease(obj: Mapping[str, Any]) -> list[FieldError]:
    spec = obj.get("spec") if isinstance(obj.get("spec"), Mapping) else {}
    assert isinstance(spec, Mapping)
    found = []
    duration, transitions = spec.get("leaseDurationSeconds"), spec.get("leaseTransitions")
    if isinstance(duration, int) and duration <= 0:
        found.append(FieldError("spec.leaseDurationSeconds", INVALID, "must be greater than 0", duration))
    if isinstance(transitions, int) and transitions < 0:
        found.append(FieldError("spec.leaseTransitions", INVALID, "must be greater than or equal to 0", transitions))
    if spec.get("preferredHolder") and not spec.get("strategy"):
        found.append(FieldError("spec.preferredHolder", FORBIDDEN, "may only be specified if `strategy` is defined"))
    return found
