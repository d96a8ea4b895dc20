"""resource.k8s.io v1beta1 and v1beta2 <-> v1, and events.k8s.io/v1 <-> core v1 Events, as the apiserver converts.

Storage is always v1; a request body in another version is converted to v1 before defaulting,
validation and storage, and every answer (GET, LIST, WATCH, write responses) is converted to the version
of the URL. Only two shapes differ:

- v1beta1 `DeviceRequest` holds the device fields inline (deviceClassName, selectors, allocationMode, count,
  adminAccess, tolerations, capacity) where v1 nests them under `exactly`; `firstAvailable` stays at the
  request level in both (a request with `firstAvailable` has no `exactly`).
- v1beta1 ResourceSlice devices keep everything but `name` under `basic`.

v1beta2 is shaped like v1 (conversion only changes apiVersion). DeviceClasses are the same in all three.
Unknown fields travel with the object, so pruning and strict decoding still see them (at their v1 path).
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from typing import Any, Final

GROUP: Final = "resource.k8s.io"
STORAGE_VERSION: Final = "v1"
DRA_VERSIONS: Final = ("v1", "v1beta2", "v1beta1")
# v1beta1 DeviceRequest fields that v1 keeps under `exactly` (ExactDeviceRequest)
_EXACT_FIELDS: Final = ("deviceClassName", "selectors", "allocationMode", "count", "adminAccess", "tolerations",
                        "capacity")


def _requests(spec: Any) -> list[Any]:
    devices = spec.get("devices") if isinstance(spec, dict) else None
    requests = devices.get("requests") if isinstance(devices, dict) else None
    return requests if isinstance(requests, list) else []


def _request_to_v1(req: dict[str, Any]) -> dict[str, Any]:
    out = {k: v for k, v in req.items() if k not in _EXACT_FIELDS}
    exact = {k: req[k] for k in _EXACT_FIELDS if k in req}
    if exact or not req.get("firstAvailable"):
        out["exactly"] = exact
    return out


def _unwrapped(obj: dict[str, Any], key: str) -> dict[str, Any]:
    """`obj` with the fields of its `key` object lifted to its own level (a v1 request's `exactly`, a v1beta1
    device's `basic`)."""
    out = {k: v for k, v in obj.items() if k != key}
    inner = obj.get(key)
    if isinstance(inner, Mapping):
        out.update(inner)
    return out


def _convert_claim_spec(spec: Any, to_v1: bool) -> None:
    requests = _requests(spec)
    for i, req in enumerate(requests):
        if isinstance(req, dict):
            requests[i] = _request_to_v1(req) if to_v1 else _unwrapped(req, "exactly")


def _device_from_v1(device: dict[str, Any]) -> dict[str, Any]:
    return {"name": device.get("name"), "basic": {k: v for k, v in device.items() if k != "name"}} \
        if "name" in device else {"basic": dict(device)}


def _convert_slice(obj: dict[str, Any], to_v1: bool) -> None:
    spec = obj.get("spec")
    devices = spec.get("devices") if isinstance(spec, dict) else None
    if not isinstance(devices, list):
        return
    for i, device in enumerate(devices):
        if isinstance(device, dict):
            devices[i] = _unwrapped(device, "basic") if to_v1 else _device_from_v1(device)


def _convert(kind: str, obj: dict[str, Any], to_v1: bool) -> None:
    if kind == "ResourceClaim":
        _convert_claim_spec(obj.get("spec"), to_v1)
    elif kind == "ResourceClaimTemplate":
        inner = obj.get("spec")
        if isinstance(inner, dict):
            _convert_claim_spec(inner.get("spec"), to_v1)
    elif kind == "ResourceSlice":
        _convert_slice(obj, to_v1)


# events.k8s.io/v1 Event <-> core v1 Event (kubernetes/kubernetes pkg/apis/events/v1/conversion.go): storage is the
# core shape; these fields are renamed, the rest (reason, type, action, eventTime, series, related, metadata) shared.
EVENTS_GROUP: Final = "events.k8s.io"
_EVENT_RENAMES: Final = (("regarding", "involvedObject"), ("note", "message"),
                         ("reportingController", "reportingComponent"), ("deprecatedSource", "source"),
                         ("deprecatedFirstTimestamp", "firstTimestamp"), ("deprecatedLastTimestamp", "lastTimestamp"),
                         ("deprecatedCount", "count"))


def _rename_event(obj: dict[str, Any], to_core: bool) -> dict[str, Any]:
    pairs = {a: b for a, b in _EVENT_RENAMES} if to_core else {b: a for a, b in _EVENT_RENAMES}
    return {pairs.get(k, k): v for k, v in obj.items()}


def needs_conversion(group: str, version: str) -> bool:
    return group == GROUP and version == "v1beta1"


def to_storage(group: str, kind: str, version: str, obj: dict[str, Any]) -> dict[str, Any]:
    """A body sent at `version`, in storage (v1) shape; apiVersion becomes the storage version's."""
    if group == EVENTS_GROUP:
        return {**_rename_event(obj, to_core=True), "apiVersion": "v1"}
    if group != GROUP or version == STORAGE_VERSION:
        return obj
    out = copy.deepcopy(obj)
    if version == "v1beta1":
        _convert(kind, out, to_v1=True)
    out["apiVersion"] = f"{GROUP}/{STORAGE_VERSION}"
    return out


def from_storage(group: str, kind: str, version: str, obj: dict[str, Any]) -> dict[str, Any]:
    """A stored (v1) object as served at `version` (the caller sets apiVersion)."""
    if group == EVENTS_GROUP:
        return _rename_event(obj, to_core=False)
    if group != GROUP or version == STORAGE_VERSION:
        return obj
    out = copy.deepcopy(obj)
    if version == "v1beta1":
        _convert(kind, out, to_v1=False)
    return out
