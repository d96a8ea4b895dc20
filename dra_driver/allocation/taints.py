"""Device taints and request tolerations (DRADeviceTaints), and the taints DeviceTaintRules add (KEP-5055)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # a type only: `status` applies DeviceTaintRules without loading the allocator's model
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


# -- DeviceTaintRules (KEP-5055) ---------------------------------------------------------------------------


def rule_selects(rule: Mapping[str, Any], driver: str, pool: str, device: str) -> bool:
    """Whether a DeviceTaintRule's `spec.deviceSelector` picks this device: every field set must match; no selector
    picks nothing, an empty one every device (kubernetes/kubernetes pkg/controller/devicetainteviction
    `ruleMatchesDevice`, staging/src/k8s.io/dynamic-resource-allocation resourceslice/tracker)."""
    spec = rule.get("spec") if isinstance(rule.get("spec"), Mapping) else {}
    selector = spec.get("deviceSelector") if isinstance(spec, Mapping) else None
    if not isinstance(selector, Mapping):
        return False
    wanted = {"driver": driver, "pool": pool, "device": device}
    return all(selector.get(k) is None or selector.get(k) == v for k, v in wanted.items())


def rule_taint(rule: Mapping[str, Any]) -> dict[str, Any] | None:
    spec = rule.get("spec")
    taint = spec.get("taint") if isinstance(spec, Mapping) else None
    if not isinstance(taint, Mapping):
        return None
    return {k: taint[k] for k in ("key", "value", "effect", "timeAdded") if taint.get(k) not in (None, "")}


def apply_taint_rules(slices: Sequence[dict[str, Any]], rules: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """The slices as the scheduler sees them: every device a DeviceTaintRule selects carries that rule's taint
    after its own (the resourceslice tracker of k8s.io/dynamic-resource-allocation does this for kube-scheduler
    and the eviction controller). Pure; slices no rule touches are returned as they are, a changed slice is a
    copy whose `metadata.resourceVersion` names the rules too, so a parse cache keyed by it sees the change."""
    taints = [(rule, taint) for rule in rules if (taint := rule_taint(rule)) is not None]
    if not taints:
        return list(slices)
    out: list[dict[str, Any]] = []
    for raw in slices:
        spec = raw.get("spec") if isinstance(raw.get("spec"), Mapping) else None
        devices = spec.get("devices") if isinstance(spec, Mapping) else None
        if not isinstance(spec, Mapping) or not isinstance(devices, list):
            out.append(raw)
            continue
        driver = str(spec.get("driver") or "")
        pool = str((spec.get("pool") or {}).get("name") or "") if isinstance(spec.get("pool"), Mapping) else ""
        applied: list[str] = []
        new_devices: list[Any] = []
        for device in devices:
            name = str(device.get("name") or "") if isinstance(device, Mapping) else ""
            extra = [t for rule, t in taints if name and rule_selects(rule, driver, pool, name)]
            if not extra:
                new_devices.append(device)
                continue
            assert isinstance(device, Mapping)
            new_devices.append({**device, "taints": [*(device.get("taints") or []), *extra]})
            applied += [f"{name}:{t.get('key')}={t.get('value', '')}:{t.get('effect')}@{t.get('timeAdded', '')}"
                        for t in extra]
        if not applied:
            out.append(raw)
            continue
        meta = raw.get("metadata") if isinstance(raw.get("metadata"), Mapping) else {}
        assert isinstance(meta, Mapping)
        version = f"{meta.get('resourceVersion', '')}+rules:{'|'.join(applied)}"
        out.append({**raw, "metadata": {**meta, "resourceVersion": version}, "spec": {**spec, "devices": new_devices}})
    return out
