"""KEP-5007 binding conditions, as kube-scheduler's DynamicResources plugin applies them. Pure.

Upstream: `pkg/scheduler/framework/plugins/dynamicresources/dynamicresources.go` (PreBind, bindClaim,
isClaimReadyForBinding, isClaimTimeout, isPodReadyForBinding, Filter, PostFilter) and
`staging/src/k8s.io/dynamic-resource-allocation/structured` (isSelectable). Facts (docs/reference/kubernetes-dra.md):

- Gates DRADeviceBindingConditions (alpha 1.34, beta and on from 1.36) and DRAResourceClaimDeviceStatus (on since
  1.33, GA 1.37). Without both the allocator never picks a device that has bindingConditions and PreBind waits for
  nothing.
- PreBind writes the allocation and the reservation, with `allocation.allocationTimestamp` (set once), then waits
  until, for every allocated device whose result lists bindingConditions, the claim's `status.devices[]` entry of
  that driver/pool/device has each of them True. A bindingFailureCondition that is True fails the attempt
  ("claim <name> binding failed: reason=<reason>, message=<message>"); so does allocationTimestamp +
  bindingTimeout passing ("claim <name> binding timeout"). A missing status entry means "not ready yet".
- A failed attempt unreserves the pod; the next attempt's Filter finds the claim unusable on every node and
  PostFilter clears the claim's allocation ("deallocation of ResourceClaim completed"), so it is allocated afresh.
- `bindingTimeout` is DynamicResourcesArgs.bindingTimeout: default 600 s, at least 1 s.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta
from enum import Enum
from typing import Any

BINDING_TIMEOUT_DEFAULT_S = 600.0
BINDING_CONDITIONS_PENDING = "BindingConditionsPending"  # the Normal event PreBind records on the pod
DEALLOCATED = "deallocation of ResourceClaim completed"  # PostFilter's status after clearing the allocation


def binding_conditions_enabled(kube_minor: int) -> bool:
    """DRADeviceBindingConditions at its default (beta, on from 1.36) and DRAResourceClaimDeviceStatus (on)."""
    return kube_minor >= 36


def scheduler_feature_gates(kube_minor: int) -> dict[str, bool]:
    """The allocator gates kube-scheduler of that release has by default, for the gates this module owns."""
    return {"DRADeviceBindingConditions": binding_conditions_enabled(kube_minor)}


class Readiness(Enum):
    READY = "ready"  # every binding condition True (or none to wait for)
    WAITING = "waiting"
    FAILED = "failed"  # a failure condition is True
    TIMED_OUT = "timed out"


@dataclass(frozen=True)
class BindingCheck:
    readiness: Readiness
    message: str = ""


def parse_time(text: str) -> datetime | None:
    try:
        return datetime.fromisoformat(text.replace("Z", "+00:00"))
    except (TypeError, ValueError):
        return None


def has_binding_conditions(claim: Mapping[str, Any]) -> bool:
    results = (((claim.get("status") or {}).get("allocation") or {}).get("devices") or {}).get("results") or []
    return any(r.get("bindingConditions") for r in results)


def _device_status(claim: Mapping[str, Any], result: Mapping[str, Any]) -> Mapping[str, Any] | None:
    for entry in (claim.get("status") or {}).get("devices") or []:
        if all(entry.get(k) == result.get(k) for k in ("driver", "pool", "device")):
            return entry  # type: ignore[no-any-return]
    return None


def _condition(conditions: Iterable[Mapping[str, Any]], kind: str) -> Mapping[str, Any] | None:
    return next((c for c in conditions if c.get("type") == kind), None)


def claim_readiness(claim: Mapping[str, Any], now: datetime, timeout_s: float) -> BindingCheck:
    """isClaimReadyForBinding, then isClaimTimeout for a claim that is not ready."""
    name = (claim.get("metadata") or {}).get("name", "")
    allocation = (claim.get("status") or {}).get("allocation")
    if not allocation:
        return BindingCheck(Readiness.WAITING)
    ready = True
    for result in (allocation.get("devices") or {}).get("results") or []:
        wanted = result.get("bindingConditions") or []
        if not wanted:
            continue
        status = _device_status(claim, result)
        if status is None:
            ready = False
            break
        conditions = status.get("conditions") or []
        for kind in result.get("bindingFailureConditions") or []:
            failed = _condition(conditions, kind)
            if failed is not None and failed.get("status") == "True":
                return BindingCheck(
                    Readiness.FAILED,
                    f"claim {name} binding failed: reason={failed.get('reason', '')}, "
                    f"message={_go_quote(str(failed.get('message', '')))}",
                )
        if not all((_condition(conditions, kind) or {}).get("status") == "True" for kind in wanted):
            ready = False
            break
    if ready:
        return BindingCheck(Readiness.READY)
    stamp = parse_time(str(allocation.get("allocationTimestamp") or ""))
    if stamp is not None and stamp + timedelta(seconds=timeout_s) < now:
        return BindingCheck(Readiness.TIMED_OUT, f"claim {name} binding timeout")
    return BindingCheck(Readiness.WAITING)


def pod_readiness(claims: Iterable[Mapping[str, Any]], now: datetime, timeout_s: float) -> BindingCheck:
    """isPodReadyForBinding: the first claim that is not ready decides (failed, timed out or waiting)."""
    for claim in claims:
        check = claim_readiness(claim, now, timeout_s)
        if check.readiness is not Readiness.READY:
            return check
    return BindingCheck(Readiness.READY)


def with_allocation_timestamp(status: Mapping[str, Any], now: datetime) -> dict[str, Any]:
    """bindClaim: allocationTimestamp is set on the allocation once, when both gates are on."""
    out = dict(status)
    allocation = out.get("allocation")
    if allocation and not allocation.get("allocationTimestamp"):
        out["allocation"] = {**allocation, "allocationTimestamp": now.strftime("%Y-%m-%dT%H:%M:%SZ")}
    return out


def deallocated_status(status: Mapping[str, Any], pod_uid: str) -> dict[str, Any] | None:
    """Unreserve (drop the pod from reservedFor), then PostFilter's deallocation when no other pod holds the claim:
    the status to write, or None when another consumer keeps it allocated (only the reservation goes)."""
    reserved = [r for r in status.get("reservedFor") or [] if r.get("uid") != pod_uid]
    out = {k: v for k, v in status.items() if k != "reservedFor"}
    if reserved:
        return {**out, "reservedFor": reserved}
    out.pop("allocation", None)
    # The API server drops status.devices entries of devices no longer allocated (ResourceClaim status strategy);
    # dropping them here keeps the write valid whether a server drops them or refuses them.
    out.pop("devices", None)
    return out


def _go_quote(text: str) -> str:
    """fmt's %q for the printable ASCII text condition messages hold."""
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n") + '"'
