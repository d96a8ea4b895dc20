"""Which gated ResourceSlice fields the API server keeps, found by dry-run before the publisher sends any of them.

An API server whose feature gate is off drops the gated field from what it stores (the ResourceSlice strategy's
`dropDisabledFields`); an older server drops it as an unknown field. Either way the driver must not send it: a
dropped list value leaves its attribute empty and the slice is refused (`exactly one value must be specified`), a
dropped compatibility group makes the stored slice differ from the wanted one on every pass. Nothing in the API says
which gates are on, so each field is tried once, in a dry-run create (`dryRun=All`: validated and admitted, never
stored) of a one-device slice of the plugin's own driver, node and pool (the chart's admission policy allows exactly
that): the field is served when the answer carries it as sent (docs/reference/dra-in-flight.md, "How the driver
finds out what a server serves"). A field is probed only on a release that can know it.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from dataclasses import dataclass
from enum import Enum, StrEnum
from typing import Any, Final

import structlog

from dra_driver.k8s.client import ApiError, JsonObject, KubeRest

log = structlog.get_logger(__name__)

SLICES_PATH: Final = "/apis/resource.k8s.io/v1/resourceslices"
# Strict: an older server answers 400 naming the unknown field instead of dropping it in silence.
PROBE_QUERY: Final = {"dryRun": "All", "fieldValidation": "Strict"}
PROBE_DEVICE: Final = "feature-probe"
PROBE_COUNTER_SET: Final = "feature-probe"
PROBE_GROUP: Final = "probe"
NUMA_NODE: Final = "resource.kubernetes.io/numaNode"
# KEP-5677's partition types: the driver's own string attribute a slice names in `spec.partitionTypeAttribute`.
PARTITION_TYPE: Final = "partitionType"


class FeatureMode(StrEnum):
    """How a flag asks for a gated field: `auto` sends it where the server keeps it, `on` the same but a server that
    does not is an error in the log (what was asked for is not published), `off` never sends it."""

    AUTO = "auto"
    ON = "on"
    OFF = "off"


class SliceFeature(Enum):
    """A gated ResourceSlice field the driver may send: value = the Kubernetes feature gate."""

    LIST_ATTRIBUTES = "DRAListTypeAttributes"  # KEP-5491
    COMPATIBILITY_GROUPS = "DRADeviceCompatibilityGroups"  # KEP-5963
    NODE_ALLOCATABLE = "DRANodeAllocatableResources"  # KEP-5517 (1.36's field was another: only 1.37's is sent)
    PARTITION_TYPES = "DRAPartitionableDevicesType"  # KEP-5677's spec.partitionTypeAttribute

    @property
    def since(self) -> tuple[int, int]:
        """The first release whose API has the field (its gate's first entry in kube_features.go)."""
        return {SliceFeature.LIST_ATTRIBUTES: (1, 36), SliceFeature.COMPATIBILITY_GROUPS: (1, 37),
                SliceFeature.NODE_ALLOCATABLE: (1, 37), SliceFeature.PARTITION_TYPES: (1, 37)}[self]


def _device(feature: SliceFeature) -> JsonObject:
    if feature is SliceFeature.PARTITION_TYPES:
        # Validation wants the named attribute, as a string, on every device that consumes counters.
        return {"name": PROBE_DEVICE, "attributes": {PARTITION_TYPE: {"string": "probe"}},
                "consumesCounters": [{"counterSet": PROBE_COUNTER_SET, "counters": {"probe": {"value": "1"}}}]}
    if feature is SliceFeature.LIST_ATTRIBUTES:
        return {"name": PROBE_DEVICE, "attributes": {NUMA_NODE: {"ints": [0]}}}
    if feature is SliceFeature.NODE_ALLOCATABLE:
        return {"name": PROBE_DEVICE, "nodeAllocatableResources": {"memory": {"overhead": {"perPod": "1"}}}}
    return {
        "name": PROBE_DEVICE,
        "consumesCounters": [{"counterSet": PROBE_COUNTER_SET, "counters": {"probe": {"value": "1"}},
                              "compatibilityGroups": [PROBE_GROUP]}],
    }


def probe_slice(feature: SliceFeature, *, driver: str, node: str) -> JsonObject:
    """The slice a probe sends: the plugin's own driver, node and pool (generation 0), one device with the field."""
    extra: JsonObject = {"partitionTypeAttribute": f"{driver}/{PARTITION_TYPE}"} if (
        feature is SliceFeature.PARTITION_TYPES) else {}
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceSlice",
        "metadata": {"generateName": f"{node}-{driver.replace('.', '-')}-probe-"[:200]},
        "spec": {
            "driver": driver,
            "nodeName": node,
            "pool": {"name": node, "generation": 0, "resourceSliceCount": 1},
            "devices": [_device(feature)],
            **extra,
        },
    }


def _path(feature: SliceFeature) -> tuple[str | int, ...]:
    if feature is SliceFeature.PARTITION_TYPES:
        return ("spec", "partitionTypeAttribute")
    if feature is SliceFeature.LIST_ATTRIBUTES:
        return ("spec", "devices", 0, "attributes", NUMA_NODE)
    if feature is SliceFeature.NODE_ALLOCATABLE:
        return ("spec", "devices", 0, "nodeAllocatableResources")
    return ("spec", "devices", 0, "consumesCounters", 0, "compatibilityGroups")


def _at(obj: Any, path: tuple[str | int, ...]) -> Any:
    for step in path:
        if isinstance(step, int):
            obj = obj[step] if isinstance(obj, list) and len(obj) > step else None
        else:
            obj = obj.get(step) if isinstance(obj, dict) else None
    return obj


def kept(feature: SliceFeature, sent: JsonObject, answer: JsonObject) -> bool:
    """Whether the server's answer carries the probed field as it was sent."""
    path = _path(feature)
    value = _at(answer, path)
    return value is not None and value == _at(sent, path)


@dataclass(frozen=True)
class Probe:
    feature: SliceFeature
    served: bool
    reason: str  # why not served ("" when served)


def probe(rest: KubeRest, feature: SliceFeature, *, driver: str, node: str,
          kube_version: tuple[int, int]) -> Probe:
    """One dry-run create (none below the feature's first release). Never raises: an answer that is no answer
    (unreachable, 403, 5xx) counts as not served, with the reason."""
    if kube_version < feature.since:
        return Probe(feature, False, f"Kubernetes {kube_version[0]}.{kube_version[1]} has no such field "
                                     f"(first in {feature.since[0]}.{feature.since[1]})")
    sent = probe_slice(feature, driver=driver, node=node)
    try:
        answer = rest.request("POST", SLICES_PATH, query=PROBE_QUERY, body=copy.deepcopy(sent))
    except ApiError as exc:
        return Probe(feature, False, f"the dry-run create was refused: {exc}")
    if kept(feature, sent, answer):
        return Probe(feature, True, "")
    return Probe(feature, False, f"the API server drops the field (feature gate {feature.value} off)")


@dataclass(frozen=True)
class SliceFeatures:
    """What the plugin found at start: the gated fields it may send."""

    list_attributes: bool = False
    compatibility_groups: bool = False
    node_allocatable: bool = False
    partition_types: bool = False

    def served(self, feature: SliceFeature) -> bool:
        return {SliceFeature.LIST_ATTRIBUTES: self.list_attributes,
                SliceFeature.COMPATIBILITY_GROUPS: self.compatibility_groups,
                SliceFeature.NODE_ALLOCATABLE: self.node_allocatable,
                SliceFeature.PARTITION_TYPES: self.partition_types}[feature]


ProbeFn = Callable[[SliceFeature], Probe]


def discover_slice_features(wanted: frozenset[SliceFeature], run: ProbeFn) -> tuple[SliceFeatures, list[Probe]]:
    """Probe each wanted feature (only those: nothing is asked about a field the settings would not send)."""
    probes = [run(f) for f in sorted(wanted, key=lambda f: f.value)]
    served = {p.feature for p in probes if p.served}
    return SliceFeatures(
        list_attributes=SliceFeature.LIST_ATTRIBUTES in served,
        compatibility_groups=SliceFeature.COMPATIBILITY_GROUPS in served,
        node_allocatable=SliceFeature.NODE_ALLOCATABLE in served,
        partition_types=SliceFeature.PARTITION_TYPES in served,
    ), probes


def report(probes: list[Probe], modes: dict[SliceFeature, FeatureMode]) -> None:
    """One log line per probe: info when served or when `auto` found it not served, error when `on` asked for it."""
    for p in probes:
        mode = modes.get(p.feature, FeatureMode.AUTO)
        if p.served:
            log.info("the API server keeps this field: publishing it", feature_gate=p.feature.value)
        elif mode is FeatureMode.ON:
            log.error("asked for a field the API server does not keep: not publishing it", feature_gate=p.feature.value,
                      reason=p.reason, fix=f"turn the feature gate {p.feature.value} on in kube-apiserver and "
                      "kube-scheduler, then restart this plugin (docs/reference/dra-in-flight.md)")
        else:
            log.info("the API server does not keep this field: not publishing it", feature_gate=p.feature.value,
                     reason=p.reason)
