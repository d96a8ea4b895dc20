"""Known fields of each kind, for strict decoding and pruning, as the apiserver's typed decoder does."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Final

from .fielderrors import child, index, key
from .options import DEFAULT_OPTIONS, ValidationOptions
from .resourceslice import LIST_ATTRIBUTE_TYPES, SCALAR_ATTRIBUTE_TYPES


@dataclass(frozen=True)
class Struct:
    fields: Mapping[str, Schema]
    # field -> first Kubernetes minor that knows it
    since: Mapping[str, int] = field(default_factory=dict)
    # field -> the feature gate without which the API server drops it silently (its strategy's dropDisabledFields:
    # the field is known, so strict decoding does not refuse it)
    gates: Mapping[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class MapOf:
    values: Schema


@dataclass(frozen=True)
class ListOf:
    items: Schema


Schema = Struct | MapOf | ListOf | None  # None: a scalar or free-form JSON (RawExtension)

_NODE_SELECTOR_REQ: Final = Struct({"key": None, "operator": None, "values": None})
_NODE_SELECTOR: Final = Struct(
    {"nodeSelectorTerms": ListOf(Struct({"matchExpressions": ListOf(_NODE_SELECTOR_REQ),
                                         "matchFields": ListOf(_NODE_SELECTOR_REQ)}))}
)
_OWNER_REF: Final = Struct(
    {f: None for f in ("apiVersion", "kind", "name", "uid", "controller", "blockOwnerDeletion")}
)
OBJECT_META_SCHEMA: Final = Struct(
    {
        **{f: None for f in ("name", "generateName", "namespace", "selfLink", "uid", "resourceVersion",
                             "generation", "creationTimestamp", "deletionTimestamp",
                             "deletionGracePeriodSeconds", "finalizers", "managedFields")},
        "labels": MapOf(None),
        "annotations": MapOf(None),
        "ownerReferences": ListOf(_OWNER_REF),
    }
)
_COUNTERS: Final = MapOf(Struct({"value": None}))
_OPAQUE: Final = Struct({"opaque": Struct({"driver": None, "parameters": None})})
_SELECTORS: Final = ListOf(Struct({"cel": Struct({"expression": None})}))
_TOLERATIONS: Final = ListOf(Struct({f: None for f in ("key", "operator", "value", "effect", "tolerationSeconds")}))
_DEVICE: Final = Struct(
    {
        "name": None,
        "attributes": MapOf(Struct({f: None for f in SCALAR_ATTRIBUTE_TYPES + LIST_ATTRIBUTE_TYPES},
                                   since=dict.fromkeys(LIST_ATTRIBUTE_TYPES, 36))),
        "capacity": MapOf(Struct({"value": None, "requestPolicy": Struct({
            "default": None, "validValues": None, "validRange": Struct({"min": None, "max": None, "step": None})})})),
        # compatibilityGroups: KEP-5963 (1.37, gate DRADeviceCompatibilityGroups)
        "consumesCounters": ListOf(Struct({"counterSet": None, "counters": _COUNTERS, "compatibilityGroups": None},
                                          {"compatibilityGroups": 37},
                                          {"compatibilityGroups": "DRADeviceCompatibilityGroups"})),
        "nodeName": None,
        "nodeSelector": _NODE_SELECTOR,
        "allNodes": None,
        "taints": ListOf(Struct({f: None for f in ("key", "value", "effect", "timeAdded")})),
        "bindsToNode": None,
        "bindingConditions": None,
        "bindingFailureConditions": None,
        "allowMultipleAllocations": None,
        "nodeAllocatableResourceMappings": MapOf(Struct({"capacityKey": None, "allocationMultiplier": None})),
        # KEP-5517's 1.37 shape (gate DRANodeAllocatableResources): kept with the gate, dropped silently without
        "nodeAllocatableResources": MapOf(Struct({
            "mapping": Struct({"capacityKey": None, "capacityMultiplier": None, "deviceMultiplier": None}),
            "overhead": Struct({"perPod": None, "perContainer": None})})),
    },
    since={"nodeAllocatableResourceMappings": 36, "nodeAllocatableResources": 37},
    gates={"nodeAllocatableResources": "DRANodeAllocatableResources"},
)
_SLICE: Final = Struct(
    {
        "apiVersion": None,
        "kind": None,
        "metadata": OBJECT_META_SCHEMA,
        "spec": Struct(
            {
                "driver": None,
                "pool": Struct({"name": None, "generation": None, "resourceSliceCount": None}),
                "nodeName": None,
                "nodeSelector": _NODE_SELECTOR,
                "allNodes": None,
                "devices": ListOf(_DEVICE),
                "perDeviceNodeSelection": None,
                "sharedCounters": ListOf(Struct({"name": None, "counters": _COUNTERS})),
                # KEP-5677 partition types (1.37, gate DRAPartitionableDevicesType)
                "partitionTypeAttribute": None,
            },
            {"partitionTypeAttribute": 37},
            {"partitionTypeAttribute": "DRAPartitionableDevicesType"},
        ),
    }
)
_CLASS: Final = Struct(
    {
        "apiVersion": None,
        "kind": None,
        "metadata": OBJECT_META_SCHEMA,
        "spec": Struct({"selectors": _SELECTORS, "config": ListOf(_OPAQUE), "extendedResourceName": None}),
    }
)
_EXACT_FIELDS: Final[dict[str, Schema]] = {
    "deviceClassName": None,
    "selectors": _SELECTORS,
    "allocationMode": None,
    "count": None,
    "tolerations": _TOLERATIONS,
    "capacity": Struct({"requests": MapOf(None)}),
    # KEP-6080 (1.37, gate DRADerivedAttributes)
    "derivedAttributes": ListOf(Struct({"name": None, "expression": None})),
}
_EXACT_SINCE: Final = {"derivedAttributes": 37}
_EXACT_GATES: Final = {"derivedAttributes": "DRADerivedAttributes"}
_CLAIM_SPEC: Final = Struct(
    {
        "devices": Struct(
            {
                "requests": ListOf(Struct({
                    "name": None,
                    "exactly": Struct({**_EXACT_FIELDS, "adminAccess": None}, _EXACT_SINCE, _EXACT_GATES),
                    "firstAvailable": ListOf(Struct({"name": None, **_EXACT_FIELDS}, _EXACT_SINCE, _EXACT_GATES)),
                })),
                "constraints": ListOf(Struct({"requests": None, "matchAttribute": None, "distinctAttribute": None})),
                "config": ListOf(Struct({"requests": None, "opaque": Struct({"driver": None, "parameters": None})})),
            }
        )
    }
)
_CONDITION: Final = Struct(
    {f: None for f in ("type", "status", "observedGeneration", "lastTransitionTime", "reason", "message")}
)
_CLAIM_STATUS: Final = Struct(
    {
        "allocation": Struct(
            {
                "devices": Struct(
                    {
                        "results": ListOf(Struct({
                            **{f: None for f in ("request", "driver", "pool", "device", "adminAccess",
                                                 "bindingConditions", "bindingFailureConditions", "shareID")},
                            "tolerations": _TOLERATIONS,
                            "consumedCapacity": MapOf(None),
                        })),
                        "config": ListOf(Struct({"source": None, "requests": None,
                                                 "opaque": Struct({"driver": None, "parameters": None})})),
                    }
                ),
                "nodeSelector": _NODE_SELECTOR,
                "allocationTimestamp": None,
            }
        ),
        "reservedFor": ListOf(Struct({f: None for f in ("apiGroup", "resource", "name", "uid")})),
        "devices": ListOf(Struct({
            **{f: None for f in ("driver", "pool", "device", "data", "shareID")},
            "conditions": ListOf(_CONDITION),
            "networkData": Struct({"interfaceName": None, "ips": None, "hardwareAddress": None}),
        })),
    }
)
_CLAIM: Final = Struct(
    {"apiVersion": None, "kind": None, "metadata": OBJECT_META_SCHEMA, "spec": _CLAIM_SPEC, "status": _CLAIM_STATUS}
)
_TEMPLATE: Final = Struct(
    {
        "apiVersion": None,
        "kind": None,
        "metadata": OBJECT_META_SCHEMA,
        "spec": Struct({"metadata": OBJECT_META_SCHEMA, "spec": _CLAIM_SPEC}),
    }
)

_TAINT_RULE: Final = Struct(
    {
        "apiVersion": None,
        "kind": None,
        "metadata": OBJECT_META_SCHEMA,
        "spec": Struct({
            "deviceSelector": Struct({"driver": None, "pool": None, "device": None}),
            "taint": Struct({f: None for f in ("key", "value", "effect", "timeAdded")}),
        }),
        "status": Struct({"conditions": ListOf(_CONDITION)}),
    }
)

SCHEMAS: Final[Mapping[str, Struct]] = {
    "ResourceSlice": _SLICE,
    "DeviceClass": _CLASS,
    "ResourceClaim": _CLAIM,
    "ResourceClaimTemplate": _TEMPLATE,
    "DeviceTaintRule": _TAINT_RULE,
}


def unknown_fields(obj: Mapping[str, Any], kind: str | None = None,
                   options: ValidationOptions = DEFAULT_OPTIONS) -> list[str]:
    """Paths of fields the typed API does not declare (`spec.devices[0].atributes`), in document order."""
    return prune_unknown_fields(obj, kind, options)[1]


def prune_unknown_fields(
    obj: Mapping[str, Any], kind: str | None = None, options: ValidationOptions = DEFAULT_OPTIONS
) -> tuple[dict[str, Any], list[str]]:
    """A copy of `obj` without undeclared fields (the apiserver drops them while decoding), plus their paths."""
    schema = SCHEMAS.get(kind or str(obj.get("kind")))
    if schema is None:
        return dict(obj), []
    dropped: list[str] = []
    pruned = _prune(obj, schema, "", dropped, options.kube_version[1], options.enabled_gates)
    assert isinstance(pruned, dict)
    return pruned, dropped


def _prune(value: Any, schema: Schema, path: str, dropped: list[str], minor: int, gates: frozenset[str]) -> Any:
    if schema is None:
        return value
    if isinstance(schema, Struct) and isinstance(value, Mapping):
        out: dict[str, Any] = {}
        for k, v in value.items():
            sub_path = child(path, k)
            if k not in schema.fields or schema.since.get(k, 0) > minor:
                dropped.append(sub_path)
                continue
            gate = schema.gates.get(k)
            if gate is not None and gate not in gates:
                continue  # known but off: dropped without a word, as the strategy does
            out[k] = _prune(v, schema.fields[k], sub_path, dropped, minor, gates)
        return out
    if isinstance(schema, MapOf) and isinstance(value, Mapping):
        return {k: _prune(v, schema.values, key(path, k), dropped, minor, gates) for k, v in value.items()}
    if isinstance(schema, ListOf) and isinstance(value, list):
        return [_prune(v, schema.items, index(path, i), dropped, minor, gates) for i, v in enumerate(value)]
    return value  # wrong JSON type: left for the validators to report
