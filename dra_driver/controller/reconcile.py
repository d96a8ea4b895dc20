"""One reconciliation of a GpuSharingPolicy: decode it, bring its DeviceClass to the rendered state, and say
what the status should be. Plain functions over the product's JSON REST client; kopf calls them
(`operator.py`) but nothing here depends on kopf, so tests can drive them directly."""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from dra_driver.cel.environment import CelCompileError, DraCelEnvironment
from dra_driver.k8s.client import ApiError, JsonObject, KubeRest
from dra_driver.policy.model import Policy, PolicyError, decode_policy
from dra_driver.policy.render import device_class, is_owned_by, merged_for_update, needs_update

CLASSES = "/apis/resource.k8s.io/v1/deviceclasses"

# Reasons of the Ready condition.
READY = "DeviceClassReady"
INVALID = "InvalidSpec"
CONFLICT = "DeviceClassConflict"
WRITE_FAILED = "DeviceClassWriteFailed"


@dataclass(frozen=True)
class Outcome:
    """What one reconciliation found: the Ready condition's parts, the class it manages, and whether trying
    again later may help (an API failure or a lost race; not an invalid spec)."""

    ready: bool
    reason: str
    message: str
    device_class_name: str | None
    retry: bool = False
    action: str = "none"  # created | updated | none


def check_selector(policy: Policy, cel: DraCelEnvironment) -> None:
    """The raw CEL selector must compile (the API server would refuse the DeviceClass otherwise)."""
    expression = policy.spec.devices.selector
    if expression is None:
        return
    try:
        cel.compile(expression)
    except CelCompileError as exc:
        raise PolicyError("spec.devices.selector", f"not a valid CEL expression: {exc}") from None


def reconcile(obj: Mapping[str, Any], rest: KubeRest, *, driver: str, cel: DraCelEnvironment) -> Outcome:
    """Make the policy's DeviceClass match it. Never touches a class the policy does not own."""
    try:
        policy = decode_policy(obj)
        check_selector(policy, cel)
    except PolicyError as exc:
        # The spec names the class even when something else is wrong; report it where it can be read.
        spec = obj.get("spec") if isinstance(obj.get("spec"), Mapping) else {}
        assert isinstance(spec, Mapping)
        name = spec.get("deviceClassName") or (obj.get("metadata") or {}).get("name")
        return Outcome(False, INVALID, str(exc), name if isinstance(name, str) else None)
    desired = device_class(policy, driver)
    name = policy.device_class_name
    try:
        current = rest.get(f"{CLASSES}/{name}")
        if current is None:
            rest.request("POST", CLASSES, body=desired)
            return Outcome(True, READY, _ready_message(name), name, action="created")
        if not is_owned_by(current, policy):
            return Outcome(
                False,
                CONFLICT,
                f"DeviceClass {name} exists and is not managed by this policy; delete it, or set "
                "spec.deviceClassName to another name",
                name,
                retry=True,
            )
        if needs_update(current, desired):
            rest.request("PUT", f"{CLASSES}/{name}", body=merged_for_update(current, desired))
            return Outcome(True, READY, _ready_message(name), name, action="updated")
        return Outcome(True, READY, _ready_message(name), name)
    except ApiError as exc:
        return Outcome(False, WRITE_FAILED, f"DeviceClass {name}: {exc}", name, retry=True)


def _ready_message(name: str) -> str:
    return f"DeviceClass {name} matches this policy"


def now_rfc3339() -> str:
    return dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def status_patch(
    obj: Mapping[str, Any], outcome: Outcome, *, clock: Callable[[], str] = now_rfc3339
) -> JsonObject:
    """The status fields to merge-patch; empty when the status already says all of it (no write, no event).
    The Ready condition keeps its lastTransitionTime while its status does not change."""
    status = obj.get("status") or {}
    generation = (obj.get("metadata") or {}).get("generation")
    conditions = [c for c in status.get("conditions") or [] if isinstance(c, Mapping)]
    old = next((c for c in conditions if c.get("type") == "Ready"), None)
    state = "True" if outcome.ready else "False"
    ready: JsonObject = {
        "type": "Ready",
        "status": state,
        "reason": outcome.reason,
        "message": outcome.message,
        "lastTransitionTime": old.get("lastTransitionTime") if old and old.get("status") == state else clock(),
        "observedGeneration": generation,
    }
    same = old is not None and all(old.get(k) == v for k, v in ready.items())
    wanted: JsonObject = {"deviceClassName": outcome.device_class_name, "observedGeneration": generation}
    patch: JsonObject = {k: v for k, v in wanted.items() if status.get(k) != v}
    if not same:
        patch["conditions"] = [*(c for c in conditions if c.get("type") != "Ready"), ready]
    return patch
