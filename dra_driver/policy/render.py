"""A GpuSharingPolicy → the DeviceClass it stands for (pure), and how to tell whether a class is a policy's."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

from dra_driver.claimconfig.api import API_VERSION as CONFIG_API_VERSION
from dra_driver.policy.model import API_VERSION, KIND, DeviceType, Policy

MANAGED_BY = "app.kubernetes.io/managed-by"
MANAGER = "dra-driver-controller"
POLICY_LABEL = "gpu.dra.dev/policy"


def cel_string(text: str) -> str:
    """A CEL string literal for `text` (JSON's escapes are valid CEL escapes)."""
    return json.dumps(text, ensure_ascii=False)


def _cel_list(items: Sequence[str]) -> str:
    return "[" + ", ".join(cel_string(i) for i in items) + "]"


def selector_expressions(policy: Policy, driver: str) -> list[str]:
    """The class's CEL selectors. The first pins driver and type (and product names, profiles), so that the
    user's raw selector, the second, is only evaluated on this driver's devices of that type: Kubernetes stops
    at the first selector that is false, and a missing attribute would otherwise be an evaluation error."""
    devices = policy.spec.devices
    attrs = f"device.attributes[{cel_string(driver)}]"
    terms = [f"device.driver == {cel_string(driver)}", f"{attrs}.type == {cel_string(devices.type.value)}"]
    if devices.product_names:
        terms.append(f"{attrs}.productName in {_cel_list(devices.product_names)}")
    if devices.mig_profiles:
        terms.append(f"{attrs}.profile in {_cel_list(devices.mig_profiles)}")
    expressions = [" && ".join(terms)]
    if devices.selector:
        expressions.append(devices.selector)
    return expressions


def owner_reference(policy: Policy) -> dict[str, Any]:
    return {
        "apiVersion": API_VERSION,
        "kind": KIND,
        "name": policy.name,
        "uid": policy.uid,
        "controller": True,
        "blockOwnerDeletion": True,
    }


def opaque_parameters(policy: Policy) -> dict[str, Any] | None:
    """The GpuConfig/MigDeviceConfig the class hands to the kubelet plugin, or None without `sharing`."""
    if policy.raw_sharing is None:
        return None
    kind = "MigDeviceConfig" if policy.spec.devices.type is DeviceType.MIG else "GpuConfig"
    return {"apiVersion": CONFIG_API_VERSION, "kind": kind, "sharing": dict(policy.raw_sharing)}


def device_class(policy: Policy, driver: str) -> dict[str, Any]:
    """The DeviceClass (resource.k8s.io/v1) the policy manages."""
    spec: dict[str, Any] = {"selectors": [{"cel": {"expression": e}} for e in selector_expressions(policy, driver)]}
    parameters = opaque_parameters(policy)
    if parameters is not None:
        spec["config"] = [{"opaque": {"driver": driver, "parameters": parameters}}]
    if policy.spec.extended_resource_name:
        spec["extendedResourceName"] = policy.spec.extended_resource_name
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "DeviceClass",
        "metadata": {
            "name": policy.device_class_name,
            "labels": {MANAGED_BY: MANAGER, POLICY_LABEL: policy.name},
            "ownerReferences": [owner_reference(policy)],
        },
        "spec": spec,
    }


def controller_uid(obj: Mapping[str, Any]) -> str | None:
    """The uid of the object's controlling owner when that owner is a GpuSharingPolicy."""
    for ref in (obj.get("metadata") or {}).get("ownerReferences") or []:
        if ref.get("controller") and ref.get("kind") == KIND and ref.get("apiVersion") == API_VERSION:
            return str(ref.get("uid"))
    return None


def is_owned_by(obj: Mapping[str, Any], policy: Policy) -> bool:
    return controller_uid(obj) == policy.uid


def needs_update(current: Mapping[str, Any], desired: Mapping[str, Any]) -> bool:
    """Whether `current` differs from `desired` in anything the controller decides (spec, its labels, owner)."""
    cur_meta, want_meta = current.get("metadata") or {}, desired["metadata"]
    labels = cur_meta.get("labels") or {}
    return (
        current.get("spec") != desired["spec"]
        or any(labels.get(k) != v for k, v in want_meta["labels"].items())
        or (cur_meta.get("ownerReferences") or []) != want_meta["ownerReferences"]
    )


def merged_for_update(current: Mapping[str, Any], desired: Mapping[str, Any]) -> dict[str, Any]:
    """`current` with the controller's parts replaced (a PUT body that keeps others' labels and annotations
    and carries the resourceVersion, so a concurrent change is a 409 rather than lost)."""
    meta = dict(current.get("metadata") or {})
    meta["labels"] = {**(meta.get("labels") or {}), **desired["metadata"]["labels"]}
    meta["ownerReferences"] = desired["metadata"]["ownerReferences"]
    return {**current, "metadata": meta, "spec": desired["spec"]}
