"""`dra-driver controller` against the sandbox API server: the CRD from the chart, the controller (kopf,
embedded in a thread, logging in through a kubeconfig the sandbox wrote), and policies applied through the
API, with every expectation read back from the API server."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import kubernetes.client as k
import pytest
import yaml

from dra_driver.controller.operator import ControllerSettings, run
from dra_driver.k8s.client import ApiError, KubeRest
from dra_driver.policy.crd import custom_resource_definition
from dra_sandbox.apiserver import ApiServer
from tests.polling import wait_for

REPO = Path(__file__).resolve().parents[2]
CHART_CRD = REPO / "charts/dra-driver/crds/gpusharingpolicies.yaml"
POLICIES = "/apis/gpu.dra.dev/v1beta1/gpusharingpolicies"
CLASSES = "/apis/resource.k8s.io/v1/deviceclasses"
DRIVER = "gpu.dra.dev"
TIMEOUT = 20.0


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[tuple[ApiServer, KubeRest]]:
    """A fresh API server with the chart's CRD applied, and the controller running against it."""
    with ApiServer() as srv, srv.rest() as rest:
        crd = yaml.safe_load(CHART_CRD.read_text())
        assert crd == custom_resource_definition()
        rest.request("POST", "/apis/apiextensions.k8s.io/v1/customresourcedefinitions", body=crd)
        kubeconfig = tmp_path / "kubeconfig"
        srv.write_kubeconfig(kubeconfig)
        stop, ready = threading.Event(), threading.Event()
        options = ControllerSettings(driver_name=DRIVER, kubeconfig=str(kubeconfig), healthz_port=-1,
                                    resync_seconds=1.0, watch_timeout_seconds=10)
        thread = threading.Thread(target=run, args=(options,), kwargs={"stop_flag": stop, "ready_flag": ready},
                                  daemon=True)
        thread.start()
        try:
            assert ready.wait(TIMEOUT), "the controller did not become ready"
            yield srv, rest
        finally:
            stop.set()
            thread.join(TIMEOUT)
        assert not thread.is_alive(), "the controller did not stop"


def policy(name: str, spec: dict[str, Any]) -> dict[str, Any]:
    return {"apiVersion": "gpu.dra.dev/v1beta1", "kind": "GpuSharingPolicy", "metadata": {"name": name}, "spec": spec}


def ready_condition(obj: dict[str, Any]) -> dict[str, Any] | None:
    return next((c for c in (obj.get("status") or {}).get("conditions") or [] if c["type"] == "Ready"), None)


def wait_ready(rest: KubeRest, name: str, status: str, *, generation: int | None = None) -> dict[str, Any]:
    def check() -> dict[str, Any] | None:
        obj = rest.get(f"{POLICIES}/{name}")
        cond = ready_condition(obj) if obj else None
        if obj is None or cond is None or cond["status"] != status:
            return None
        wanted = generation or obj["metadata"]["generation"]
        return obj if obj["status"].get("observedGeneration") == wanted else None

    return wait_for(check, TIMEOUT, f"policy {name} Ready={status}", interval=0.05)


TIMESLICED = {
    "devices": {"type": "gpu", "productNames": ["NVIDIA H100 80GB HBM3"]},
    "sharing": {"strategy": "TimeSlicing", "timeSlicingConfig": {"interval": "Short"}},
    "extendedResourceName": "example.com/h100-shared",
}


def test_policy_lifecycle_create_update_delete(cluster: tuple[ApiServer, KubeRest]) -> None:
    srv, rest = cluster
    created = rest.request("POST", POLICIES, body=policy("h100-ts", TIMESLICED))
    obj = wait_ready(rest, "h100-ts", "True")
    cond = ready_condition(obj)
    assert cond is not None and cond["reason"] == "DeviceClassReady"
    assert obj["status"]["deviceClassName"] == "h100-ts"

    cls = rest.get(f"{CLASSES}/h100-ts")
    assert cls is not None
    assert cls["spec"]["selectors"] == [{"cel": {"expression": (
        "device.driver == \"gpu.dra.dev\" && device.attributes[\"gpu.dra.dev\"].type == \"gpu\" && "
        "device.attributes[\"gpu.dra.dev\"].productName in [\"NVIDIA H100 80GB HBM3\"]")}}]
    assert cls["spec"]["config"] == [{"opaque": {"driver": DRIVER, "parameters": {
        "apiVersion": "gpu.dra.dev/v1beta1", "kind": "GpuConfig",
        "sharing": {"strategy": "TimeSlicing", "timeSlicingConfig": {"interval": "Short"}}}}}]
    assert cls["spec"]["extendedResourceName"] == "example.com/h100-shared"
    [owner] = cls["metadata"]["ownerReferences"]
    assert owner == {"apiVersion": "gpu.dra.dev/v1beta1", "kind": "GpuSharingPolicy", "name": "h100-ts",
                     "uid": created["metadata"]["uid"], "controller": True, "blockOwnerDeletion": True}
    assert cls["metadata"]["labels"]["gpu.dra.dev/policy"] == "h100-ts"

    # Update: MPS with a thread limit; the class follows and the status observes the new generation.
    current = rest.get(f"{POLICIES}/h100-ts")
    assert current is not None
    mps = {"strategy": "MPS", "mpsConfig": {"defaultActiveThreadPercentage": 50,
                                            "defaultPinnedDeviceMemoryLimit": "10Gi"}}
    # (A merge patch: the old timeSlicingConfig must be removed explicitly, or the spec is invalid for MPS.)
    sharing_patch = {**mps, "timeSlicingConfig": None}
    rest.request("PATCH", f"{POLICIES}/h100-ts", body={"spec": {"sharing": sharing_patch, "extendedResourceName": None}},
                 content_type="application/merge-patch+json")
    wait_ready(rest, "h100-ts", "True", generation=current["metadata"]["generation"] + 1)

    def class_updated() -> dict[str, Any] | None:
        c = rest.get(f"{CLASSES}/h100-ts")
        return c if c and c["spec"]["config"][0]["opaque"]["parameters"]["sharing"] == mps else None

    cls = wait_for(class_updated, TIMEOUT, "the DeviceClass to follow the policy", interval=0.05)
    assert "extendedResourceName" not in cls["spec"]

    # Delete: the class goes with its owner (the API server's garbage collector, through the ownerReference).
    rest.request("DELETE", f"{POLICIES}/h100-ts")
    wait_for(lambda: rest.get(f"{CLASSES}/h100-ts") is None, TIMEOUT, "the DeviceClass to be deleted",
             interval=0.05)
    assert rest.get(f"{POLICIES}/h100-ts") is None
    assert srv.request_log.count(verb="patch", resource="gpusharingpolicies/status") >= 2


def test_foreign_device_class_is_a_conflict_and_stays_untouched(cluster: tuple[ApiServer, KubeRest]) -> None:
    _, rest = cluster
    foreign = {"apiVersion": "resource.k8s.io/v1", "kind": "DeviceClass",
               "metadata": {"name": "taken", "labels": {"owner": "someone-else"}},
               "spec": {"selectors": [{"cel": {"expression": "device.driver == 'other.example.com'"}}]}}
    before = rest.request("POST", CLASSES, body=foreign)
    rest.request("POST", POLICIES, body=policy("wants-taken", {
        "devices": {"type": "mig", "migProfiles": ["1g.10gb"]}, "deviceClassName": "taken"}))
    obj = wait_ready(rest, "wants-taken", "False")
    cond = ready_condition(obj)
    assert cond is not None and cond["reason"] == "DeviceClassConflict"
    assert "taken" in cond["message"]

    def warning() -> list[dict[str, Any]] | None:
        items = rest.request("GET", "/api/v1/namespaces/default/events")["items"]
        return [e for e in items if e["involvedObject"].get("name") == "wants-taken" and e["type"] == "Warning"
                and e["reason"] == "DeviceClassConflict"] or None

    wait_for(warning, TIMEOUT, "a Warning event about the conflict", interval=0.05)
    after = rest.get(f"{CLASSES}/taken")
    assert after == before  # same resourceVersion, spec and metadata: never written

    # Once the foreign class is gone, the resync creates the policy's own.
    rest.request("DELETE", f"{CLASSES}/taken")
    obj = wait_ready(rest, "wants-taken", "True")
    cls = rest.get(f"{CLASSES}/taken")
    assert cls is not None and cls["metadata"]["ownerReferences"][0]["uid"] == obj["metadata"]["uid"]
    assert "profile in [\"1g.10gb\"]" in cls["spec"]["selectors"][0]["cel"]["expression"]


def test_out_of_range_mps_thread_percentage_is_refused_by_the_crd_schema(cluster: tuple[ApiServer, KubeRest]) -> None:
    _, rest = cluster
    bad = policy("too-many-threads", {"devices": {"type": "gpu"}, "sharing": {
        "strategy": "MPS", "mpsConfig": {"defaultActiveThreadPercentage": 101}}})
    with pytest.raises(ApiError) as err:
        rest.request("POST", POLICIES, body=bad)
    assert err.value.status == 422
    [cause] = err.value.body["details"]["causes"]
    assert cause["field"] == "spec.sharing.mpsConfig.defaultActiveThreadPercentage"
    assert "should be less than or equal to 100" in cause["message"]
    assert rest.get(f"{POLICIES}/too-many-threads") is None
    # The controller refuses it too, naming the same field, for an API server that skipped the schema:
    # tests/controller/test_policy.py (test_invalid_specs_name_the_field).


def test_invalid_policies_the_schema_cannot_catch_name_the_field(cluster: tuple[ApiServer, KubeRest]) -> None:
    _, rest = cluster
    cases: dict[str, tuple[dict[str, Any], str]] = {
        "mig-interval": ({"devices": {"type": "mig"}, "sharing": {
            "strategy": "TimeSlicing", "timeSlicingConfig": {"interval": "Long"}}}, "spec.sharing.timeSlicingConfig.interval"),
        "profiles-on-gpu": ({"devices": {"type": "gpu", "migProfiles": ["1g.10gb"]}}, "spec.devices.migProfiles"),
        "bad-cel": ({"devices": {"type": "gpu", "selector": "device.attributes[ == 1"}}, "spec.devices.selector"),
        "mps-block-without-mps": ({"devices": {"type": "gpu"}, "sharing": {
            "strategy": "TimeSlicing", "mpsConfig": {}}}, "spec.sharing.mpsConfig"),
    }
    for name, (spec, _) in cases.items():
        rest.request("POST", POLICIES, body=policy(name, spec))
    for name, (_, field) in cases.items():
        cond = ready_condition(wait_ready(rest, name, "False"))
        assert cond is not None and cond["reason"] == "InvalidSpec", (name, cond)
        assert cond["message"].startswith(f"{field}:"), (name, cond["message"])
        assert rest.get(f"{CLASSES}/{name}") is None


def test_events_are_posted_for_the_policy(cluster: tuple[ApiServer, KubeRest]) -> None:
    srv, rest = cluster
    rest.request("POST", POLICIES, body=policy("evented", {"devices": {"type": "gpu-share"}}))
    wait_ready(rest, "evented", "True")

    def events() -> list[dict[str, Any]] | None:
        items = rest.request("GET", "/api/v1/namespaces/default/events")["items"]
        mine = [e for e in items if e["involvedObject"].get("name") == "evented"]
        return mine or None

    found = wait_for(events, TIMEOUT, "kopf's events about the policy", interval=0.05)
    assert all(e["involvedObject"]["kind"] == "GpuSharingPolicy" for e in found)
    assert "DeviceClassCreated" in {e["reason"] for e in found}
    assert srv.request_log.count(verb="create", resource="events") >= 1
    with srv.api_client() as api:  # the typed client reads the CRD-backed object too
        obj: Any = k.CustomObjectsApi(api).get_cluster_custom_object("gpu.dra.dev", "v1beta1", "gpusharingpolicies",
                                                                 "evented")
    assert obj["status"]["deviceClassName"] == "evented"
