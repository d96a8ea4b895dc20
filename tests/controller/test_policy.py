"""GpuSharingPolicy without an API server: decoding (field paths), the DeviceClass it renders, the generated
CRD (structural, equal to the chart's file), the status patch, and the reconciler over a fake REST client."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from dra_driver.cel.environment import DraCelEnvironment
from dra_driver.cli import main
from dra_driver.controller.reconcile import CONFLICT, INVALID, READY, Outcome, reconcile, status_patch
from dra_driver.k8s.client import ApiError, JsonObject, KubeRest
from dra_driver.policy.crd import crd_yaml, custom_resource_definition
from dra_driver.policy.model import PolicyError, decode_policy
from dra_driver.policy.render import device_class
from tests import kubeschema

REPO = Path(__file__).resolve().parents[2]
CEL = DraCelEnvironment()


def obj(spec: Any, name: str = "p", uid: str = "uid-1", generation: int = 1) -> dict[str, Any]:
    return {"apiVersion": "gpu.dra.dev/v1beta1", "kind": "GpuSharingPolicy",
            "metadata": {"name": name, "uid": uid, "generation": generation}, "spec": spec}


@pytest.mark.parametrize(("spec", "path", "words"), [
    ({"devices": {"type": "tpu"}}, "spec.devices.type", "must be one of gpu, mig, gpu-share"),
    ({}, "spec.devices", "required field is missing"),
    ({"devices": {"type": "gpu"}, "sharing": {"strategy": "MPS", "mpsConfig": {"defaultActiveThreadPercentage": 101}}},
     "spec.sharing.mpsConfig.defaultActiveThreadPercentage", "between 1 and 100"),
    ({"devices": {"type": "gpu"}, "sharing": {"strategy": "MPS", "mpsConfig": {"defaultPinnedDeviceMemoryLimit": "1Ki"}}},
     "spec.sharing.mpsConfig.defaultPinnedDeviceMemoryLimit", "at least 1Mi"),
    ({"devices": {"type": "mig"}, "sharing": {"strategy": "TimeSlicing", "timeSlicingConfig": {}}},
     "spec.sharing.timeSlicingConfig", "a MIG device takes no time-slice interval"),
    ({"devices": {"type": "mig"}, "sharing": {"strategy": "TimeSlicing", "timeSlicingConfig": {"interval": "Long"}}},
     "spec.sharing.timeSlicingConfig.interval", "remove sharing.timeSlicingConfig"),
    ({"devices": {"type": "gpu-share"}, "sharing": {"strategy": "MPS"}}, "spec.sharing", "not allowed with type"),
    ({"devices": {"type": "gpu", "migProfiles": ["1g.10gb"]}}, "spec.devices.migProfiles", "only allowed with type mig"),
    ({"devices": {"type": "gpu"}, "deviceClassName": "Not_A_Name"}, "spec.deviceClassName", "not a valid DeviceClass"),
    ({"devices": {"type": "gpu"}, "extendedResourceName": "gpu"}, "spec.extendedResourceName", "domain prefix"),
    ({"devices": {"type": "gpu", "colour": "red"}}, "spec.devices.colour", "unknown field"),
])
def test_invalid_specs_name_the_field(spec: Any, path: str, words: str) -> None:
    with pytest.raises(PolicyError) as err:
        decode_policy(obj(spec))
    assert err.value.path == path, err.value
    assert words in err.value.message


def test_mig_policy_renders_mig_device_config_with_profiles_and_raw_selector() -> None:
    policy = decode_policy(obj({
        "devices": {"type": "mig", "migProfiles": ["1g.10gb", "3g.40gb"], "productNames": ["NVIDIA H100 80GB HBM3"],
                    "selector": "device.attributes['gpu.dra.dev'].index < 4"},
        "sharing": {"strategy": "MPS", "mpsConfig": {"defaultActiveThreadPercentage": 25}},
    }, name="mig-mps"))
    cls = device_class(policy, "gpu.example.com")
    assert cls["metadata"]["name"] == "mig-mps"
    first, raw = (s["cel"]["expression"] for s in cls["spec"]["selectors"])
    assert first == ('device.driver == "gpu.example.com" && device.attributes["gpu.example.com"].type == "mig" && '
                     'device.attributes["gpu.example.com"].productName in ["NVIDIA H100 80GB HBM3"] && '
                     'device.attributes["gpu.example.com"].profile in ["1g.10gb", "3g.40gb"]')
    assert raw == "device.attributes['gpu.dra.dev'].index < 4"
    assert cls["spec"]["config"] == [{"opaque": {"driver": "gpu.example.com", "parameters": {
        "apiVersion": "gpu.dra.dev/v1beta1", "kind": "MigDeviceConfig",
        "sharing": {"strategy": "MPS", "mpsConfig": {"defaultActiveThreadPercentage": 25}}}}}]
    assert "extendedResourceName" not in cls["spec"]
    for selector in cls["spec"]["selectors"]:
        CEL.compile(selector["cel"]["expression"])  # what the API server would compile


def test_selectors_match_only_the_policys_devices() -> None:
    from dra_driver.cel.environment import DeviceInput

    policy = decode_policy(obj({"devices": {"type": "gpu", "productNames": ['A "quoted" GPU']}}))
    [expr] = [s["cel"]["expression"] for s in device_class(policy, "gpu.dra.dev")["spec"]["selectors"]]

    def device(driver: str, kind: str, product: str) -> DeviceInput:
        return DeviceInput(driver=driver, attributes={"gpu.dra.dev/type": kind, "gpu.dra.dev/productName": product},
                           capacity={})

    assert CEL.matches(expr, device("gpu.dra.dev", "gpu", 'A "quoted" GPU'))
    assert not CEL.matches(expr, device("gpu.dra.dev", "mig", 'A "quoted" GPU'))
    assert not CEL.matches(expr, device("gpu.dra.dev", "gpu", "another GPU"))
    assert not CEL.matches(expr, device("other.dev", "gpu", 'A "quoted" GPU'))


def test_the_chart_crd_is_what_the_models_generate() -> None:
    shipped = (REPO / "charts/dra-driver/crds/gpusharingpolicies.yaml").read_text()
    assert shipped == crd_yaml(), "regenerate: dra-driver controller --print-crd > charts/dra-driver/crds/gpusharingpolicies.yaml"


def test_print_crd(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["controller", "--print-crd"]) == 0
    assert yaml.safe_load(capsys.readouterr().out) == custom_resource_definition()


def _walk(node: Any, path: str = "") -> list[str]:
    """Structural-schema violations: a node without a type, $ref, null types, additionalProperties: false..."""
    problems: list[str] = []
    if not isinstance(node, dict):
        return problems
    # ... and defaults, which the API server would write into every stored object.
    if "$ref" in node or "default" in node or node.get("type") == "null" or node.get("additionalProperties") is False:
        problems.append(path)
    if "type" not in node and not node.get("x-kubernetes-int-or-string"):
        problems.append(f"{path} has no type")
    for name, sub in (node.get("properties") or {}).items():
        problems += _walk(sub, f"{path}.{name}")
    for key in ("items", "additionalProperties"):
        if isinstance(node.get(key), dict):
            problems += _walk(node[key], f"{path}[{key}]")
    for member in node.get("anyOf") or []:
        if set(member) - {"type"}:
            problems.append(f"{path}.anyOf holds more than value checks")
    return problems


def test_the_crd_schema_is_structural_and_valid_for_kubernetes() -> None:
    crd = custom_resource_definition()
    schema = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    assert _walk(schema) == []
    kubeschema.validate(crd, "1.34.0")


class FakeRest(KubeRest):
    """The REST calls the reconciler makes, against a dict of DeviceClasses."""

    def __init__(self, classes: dict[str, JsonObject], fail: int = 0) -> None:
        self.classes = classes
        self.fail = fail
        self.calls: list[str] = []

    def request(self, method: str, path: str, **kwargs: Any) -> JsonObject:
        self.calls.append(f"{method} {path}")
        if self.fail:
            raise ApiError(self.fail, "injected")
        name = path.rsplit("/", 1)[-1]
        if method == "GET":
            if name not in self.classes:
                raise ApiError(404, "NotFound")
            return self.classes[name]
        body: JsonObject = kwargs["body"]
        self.classes[body["metadata"]["name"]] = body
        return body


def test_reconcile_creates_updates_and_refuses_foreign_classes() -> None:
    rest = FakeRest({})
    policy = obj({"devices": {"type": "gpu"}, "sharing": {"strategy": "TimeSlicing"}}, name="ts")
    assert reconcile(policy, rest, driver="gpu.dra.dev", cel=CEL) == Outcome(
        True, READY, "DeviceClass ts matches this policy", "ts", action="created")
    assert reconcile(policy, rest, driver="gpu.dra.dev", cel=CEL).action == "none"
    policy["spec"]["sharing"] = {"strategy": "Exclusive"}
    assert reconcile(policy, rest, driver="gpu.dra.dev", cel=CEL).action == "updated"
    assert rest.classes["ts"]["spec"]["config"][0]["opaque"]["parameters"]["sharing"] == {"strategy": "Exclusive"}

    other = obj({"devices": {"type": "gpu"}, "deviceClassName": "ts"}, name="other", uid="uid-2")
    writes = len([c for c in rest.calls if not c.startswith("GET")])
    outcome = reconcile(other, rest, driver="gpu.dra.dev", cel=CEL)
    assert (outcome.ready, outcome.reason, outcome.retry) == (False, CONFLICT, True)
    assert len([c for c in rest.calls if not c.startswith("GET")]) == writes
    assert rest.classes["ts"]["metadata"]["ownerReferences"][0]["uid"] == "uid-1"


def test_reconcile_reports_api_failures_for_a_retry_and_invalid_specs_without() -> None:
    failed = reconcile(obj({"devices": {"type": "gpu"}}), FakeRest({}, fail=500), driver="d.example", cel=CEL)
    assert (failed.ready, failed.reason, failed.retry) == (False, "DeviceClassWriteFailed", True)
    invalid = reconcile(obj({"devices": {"type": "gpu", "selector": "1 +"}}), FakeRest({}), driver="d.example",
                        cel=CEL)
    assert (invalid.reason, invalid.retry) == (INVALID, False)
    assert invalid.message.startswith("spec.devices.selector: not a valid CEL expression")


def test_status_patch_keeps_the_transition_time_and_writes_nothing_when_unchanged() -> None:
    policy = obj({"devices": {"type": "gpu"}}, generation=3)
    ok = Outcome(True, READY, "fine", "p")
    first = status_patch(policy, ok, clock=lambda: "T1")
    assert first == {"deviceClassName": "p", "observedGeneration": 3, "conditions": [
        {"type": "Ready", "status": "True", "reason": READY, "message": "fine", "lastTransitionTime": "T1",
         "observedGeneration": 3}]}
    policy["status"] = first
    assert status_patch(policy, ok, clock=lambda: "T2") == {}
    policy["metadata"]["generation"] = 4
    again = status_patch(policy, ok, clock=lambda: "T2")
    assert again["conditions"][0]["lastTransitionTime"] == "T1"  # still True: no transition
    assert again["observedGeneration"] == 4
    bad = status_patch(policy, Outcome(False, CONFLICT, "taken", "p"), clock=lambda: "T3")
    assert bad["conditions"][0]["lastTransitionTime"] == "T3"
    assert bad["conditions"][0]["status"] == "False"
