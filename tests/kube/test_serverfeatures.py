"""The dry-run probes of gated ResourceSlice fields (dra_driver/k8s/serverfeatures.py): a field is sent only where
the API server keeps it, a server without it gets no probe below the field's release and nothing it refuses, and a
probe stores nothing (docs/reference/dra-in-flight.md)."""

from __future__ import annotations

import copy
from typing import Any, cast

import pytest

from dra_driver.k8s.client import ApiError, JsonObject, KubeRest
from dra_driver.k8s.serverfeatures import (
    FeatureMode,
    Probe,
    SliceFeature,
    discover_slice_features,
    kept,
    probe,
    probe_slice,
)
from dra_sandbox.apiserver import ApiServer

DRIVER = "gpu.dra.dev"
NODE = "node-a"
SLICES = "/apis/resource.k8s.io/v1/resourceslices"


class _Answers:
    """A KubeRest stand-in that answers the probe's POST with what `answer` makes of the body, and records it."""

    def __init__(self, answer: Any) -> None:
        self.answer = answer
        self.sent: list[tuple[str, str, dict[str, Any], JsonObject]] = []

    def request(self, method: str, path: str, *, query: dict[str, Any], body: JsonObject) -> JsonObject:
        self.sent.append((method, path, dict(query), copy.deepcopy(body)))
        result = self.answer(body)
        if isinstance(result, ApiError):
            raise result
        return cast(JsonObject, result)


def _drop(feature: SliceFeature) -> Any:
    """What a 1.37 API server with the gate off stores: the field cut out (dropDisabledFields)."""

    def answer(body: JsonObject) -> JsonObject:
        out = copy.deepcopy(body)
        device = out["spec"]["devices"][0]
        if feature is SliceFeature.LIST_ATTRIBUTES:
            device["attributes"]["resource.kubernetes.io/numaNode"] = {}
        elif feature is SliceFeature.NODE_ALLOCATABLE:
            del device["nodeAllocatableResources"]
        elif feature is SliceFeature.PARTITION_TYPES:
            del out["spec"]["partitionTypeAttribute"]
        else:
            del device["consumesCounters"][0]["compatibilityGroups"]
        return out

    return answer


def _run(rest: Any, feature: SliceFeature, version: tuple[int, int] = (1, 37)) -> Probe:
    return probe(cast(KubeRest, rest), feature, driver=DRIVER, node=NODE, kube_version=version)


@pytest.mark.parametrize("feature", list(SliceFeature))
def test_a_probe_is_one_dry_run_create_of_the_plugins_own_slice(feature: SliceFeature) -> None:
    rest = _Answers(lambda body: body)
    assert _run(rest, feature) == Probe(feature, True, "")
    [(method, path, query, body)] = rest.sent
    assert (method, path) == ("POST", SLICES)
    assert query == {"dryRun": "All", "fieldValidation": "Strict"}
    spec = body["spec"]
    # What the chart's admission policy lets the plugin write: its driver, its node, its node's pool.
    assert (spec["driver"], spec["nodeName"], spec["pool"]["name"]) == (DRIVER, NODE, NODE)
    assert "name" not in body["metadata"] and body["metadata"]["generateName"].startswith(NODE)
    assert body == probe_slice(feature, driver=DRIVER, node=NODE)


@pytest.mark.parametrize("feature", list(SliceFeature))
def test_a_server_that_drops_the_field_does_not_serve_it(feature: SliceFeature) -> None:
    result = _run(_Answers(_drop(feature)), feature)
    assert not result.served and f"feature gate {feature.value} off" in result.reason


@pytest.mark.parametrize(
    ("error", "reason"),
    [(ApiError(400, "Bad Request", {"message": 'strict decoding error: unknown field "x"'}), "unknown field"),
     (ApiError(422, "Unprocessable Entity", {"message": "exactly one value must be specified"}), "exactly one"),
     (ApiError(403, "Forbidden", {"message": "may only write ResourceSlices"}), "may only write"),
     (ApiError(0, "connection refused"), "connection refused"),
     (ApiError(503, "Service Unavailable"), "503")],
)
def test_a_refused_or_failed_probe_is_not_served_and_never_raises(error: ApiError, reason: str) -> None:
    result = _run(_Answers(lambda body: error), SliceFeature.LIST_ATTRIBUTES)
    assert not result.served and "refused" in result.reason and reason in result.reason


@pytest.mark.parametrize(("feature", "version"), [(SliceFeature.LIST_ATTRIBUTES, (1, 35)),
                                                  (SliceFeature.COMPATIBILITY_GROUPS, (1, 36)),
                                                  (SliceFeature.PARTITION_TYPES, (1, 36))])
def test_a_release_without_the_field_gets_no_probe(feature: SliceFeature, version: tuple[int, int]) -> None:
    rest = _Answers(lambda body: body)
    result = _run(rest, feature, version)
    assert not result.served and "has no such field" in result.reason
    assert rest.sent == []


def test_kept_compares_the_value_sent() -> None:
    sent = probe_slice(SliceFeature.COMPATIBILITY_GROUPS, driver=DRIVER, node=NODE)
    changed = copy.deepcopy(sent)
    changed["spec"]["devices"][0]["consumesCounters"][0]["compatibilityGroups"] = ["other"]
    assert kept(SliceFeature.COMPATIBILITY_GROUPS, sent, sent)
    assert not kept(SliceFeature.COMPATIBILITY_GROUPS, sent, changed)
    assert not kept(SliceFeature.COMPATIBILITY_GROUPS, sent, {"spec": {"devices": []}})
    assert not kept(SliceFeature.COMPATIBILITY_GROUPS, sent, {})


def test_only_the_wanted_features_are_probed() -> None:
    asked: list[SliceFeature] = []

    def run(feature: SliceFeature) -> Probe:
        asked.append(feature)
        return Probe(feature, feature is SliceFeature.LIST_ATTRIBUTES, "")

    features, probes = discover_slice_features(frozenset({SliceFeature.LIST_ATTRIBUTES}), run)
    assert asked == [SliceFeature.LIST_ATTRIBUTES] and features.list_attributes
    assert not features.compatibility_groups and len(probes) == 1
    features, probes = discover_slice_features(frozenset(), run)
    assert probes == [] and asked == [SliceFeature.LIST_ATTRIBUTES]
    assert not features.served(SliceFeature.LIST_ATTRIBUTES)


def test_the_partition_type_probe_is_a_slice_1_37_validates() -> None:
    """validatePartitionTypeAttribute (1.37.2): the field only on a slice with a counter-consuming device, which
    carries the named attribute (bare, in the driver's domain) as a string."""
    spec = probe_slice(SliceFeature.PARTITION_TYPES, driver=DRIVER, node=NODE)["spec"]
    assert spec["partitionTypeAttribute"] == f"{DRIVER}/partitionType"
    [device] = spec["devices"]
    assert device["consumesCounters"] and device["attributes"]["partitionType"] == {"string": "probe"}
    assert all("partitionTypeAttribute" not in probe_slice(f, driver=DRIVER, node=NODE)["spec"]
               for f in SliceFeature if f is not SliceFeature.PARTITION_TYPES)


def test_feature_modes_are_the_flag_values() -> None:
    assert [m.value for m in FeatureMode] == ["auto", "on", "off"]


# --- against the sandbox API server (which validates and drops as its release does) ------------------------------


@pytest.mark.parametrize(("version", "gates", "served"), [
    ("1.37.0", {"DRAListTypeAttributes": True}, True),
    ("1.37.0", {}, False),  # the gate is off by default: the list is refused
    ("1.36.0", {"DRAListTypeAttributes": True}, True),
])
def test_the_list_probe_against_the_sandbox_stores_nothing(version: str, gates: dict[str, bool], served: bool) -> None:
    with ApiServer(kube_version=version, feature_gates=gates) as srv, srv.rest() as rest:
        minor = int(version.split(".")[1])
        result = probe(rest, SliceFeature.LIST_ATTRIBUTES, driver=DRIVER, node=NODE, kube_version=(1, minor))
        assert result.served is served, result.reason
        assert srv.request_log.count(verb="create", resource="resourceslices") == 1
        assert rest.request("GET", SLICES)["items"] == []  # dry run: nothing stored


@pytest.mark.parametrize(("version", "gate", "served"),
                         [("1.37.0", False, False), ("1.37.0", True, True), ("1.36.0", True, False)])
def test_the_sandbox_keeps_compatibility_groups_as_1_37_does(version: str, gate: bool, served: bool) -> None:
    """The imitation follows kube-apiserver 1.37: DRADeviceCompatibilityGroups off drops the KEP-5963 field without a
    word (it is known: Strict does not refuse it), on keeps it; 1.36 does not know it. Nothing is stored."""
    with ApiServer(kube_version=version, feature_gates={"DRADeviceCompatibilityGroups": gate}) as srv, \
            srv.rest() as rest:
        # The plugin does not probe below 1.37 (nothing to ask): this asks anyway, to see 1.36 refuse the field.
        result = probe(rest, SliceFeature.COMPATIBILITY_GROUPS, driver=DRIVER, node=NODE, kube_version=(1, 37))
        assert result.served is served, result.reason
        if not served:
            assert "compatibilityGroups" in result.reason or "drops the field" in result.reason, result.reason
        assert rest.request("GET", SLICES)["items"] == []


@pytest.mark.parametrize(("version", "gate", "served"),
                         [("1.37.0", False, False), ("1.37.0", True, True), ("1.36.0", True, False)])
def test_the_sandbox_keeps_the_partition_type_attribute_as_1_37_does(version: str, gate: bool, served: bool) -> None:
    """DRAPartitionableDevicesType off drops `spec.partitionTypeAttribute` without a word (known to Strict), on keeps
    it; 1.36 does not know it. Nothing is stored."""
    with ApiServer(kube_version=version, feature_gates={"DRAPartitionableDevicesType": gate}) as srv, \
            srv.rest() as rest:
        result = probe(rest, SliceFeature.PARTITION_TYPES, driver=DRIVER, node=NODE, kube_version=(1, 37))
        assert result.served is served, result.reason
        assert rest.request("GET", SLICES)["items"] == []


def test_the_sandbox_refuses_what_1_37_refuses_with_the_gate() -> None:
    """validatePartitionTypeAttribute: a counter-consuming device without the attribute, or with a non-string one;
    a slice with no counter-consuming device."""
    with ApiServer(kube_version="1.37.0", feature_gates={"DRAPartitionableDevicesType": True}) as srv, \
            srv.rest() as rest:
        body = probe_slice(SliceFeature.PARTITION_TYPES, driver=DRIVER, node=NODE)
        missing = copy.deepcopy(body)
        missing["spec"]["devices"][0]["attributes"] = {}
        wrong = copy.deepcopy(body)
        wrong["spec"]["devices"][0]["attributes"]["partitionType"] = {"int": 1}
        plain = copy.deepcopy(body)
        del plain["spec"]["devices"][0]["consumesCounters"]
        for bad, words in [(missing, "must be set"), (wrong, "must be a string value"),
                           (plain, "may only be set on a slice which declares devices that consume counters")]:
            with pytest.raises(ApiError) as caught:
                rest.request("POST", SLICES, query={"dryRun": "All"}, body=bad)
            assert caught.value.status == 422 and words in str(caught.value), caught.value
