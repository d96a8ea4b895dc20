"""DeviceTaintRule in the sandbox: served in each release's versions only, validated with upstream's messages, its
taints applied to the slices the scheduler and `explain` see, and NoExecute evicting as kube-controller-manager's
device taint eviction controller does (tolerationSeconds included, on an injected clock)."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from typing import Any

import pytest

from dra_driver.allocation.taints import apply_taint_rules, rule_selects
from dra_driver.cel.environment import DraCelEnvironment
from dra_driver.defaults import DRIVER_NAME
from dra_driver.k8s.client import ApiError, KubeRest
from dra_driver.k8s.taintrules import taint_rule_version
from dra_sandbox.apiserver import ApiServer
from dra_sandbox.devicetainteviction import (
    DISRUPTION_REASON,
    EVENT_REASON,
    DeviceTaintEvictionController,
    claim_eviction,
    format_time,
    newest_devices,
    plan,
    rule_condition,
)
from dra_sandbox.kubelet.nodestatus import ready_node
from dra_sandbox.scheduler import plan_pod
from tests.polling import wait_for

D = DRIVER_NAME
T0 = 1_800_000_000.0
RULE_KEY = f"{D}/unhealthy"


def rule(name: str, effect: str = "NoExecute", *, device: str | None = "gpu-0", uid: str = "", time: float = T0,
         generation: int = 1) -> dict[str, Any]:
    selector: dict[str, Any] = {"driver": D, "pool": "n1"}
    if device is not None:
        selector["device"] = device
    return {"apiVersion": "resource.k8s.io/v1", "kind": "DeviceTaintRule",
            "metadata": {"name": name, "uid": uid or f"uid-{name}", "generation": generation},
            "spec": {"deviceSelector": selector,
                     "taint": {"key": RULE_KEY, "value": "true", "effect": effect, "timeAdded": format_time(time)}}}


def slice_of(devices: list[str], *, generation: int = 1, taints: list[dict[str, Any]] | None = None
             ) -> dict[str, Any]:
    return {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceSlice",
            "metadata": {"name": f"n1-{generation}", "uid": f"s{generation}", "resourceVersion": "7"},
            "spec": {"driver": D, "nodeName": "n1", "pool": {"name": "n1", "generation": generation,
                                                             "resourceSliceCount": 1},
                     "devices": [{"name": d, "attributes": {"type": {"string": "gpu"}},
                                  **({"taints": taints} if taints else {})} for d in devices]}}


def allocated(name: str, device: str, tolerations: list[dict[str, Any]] | None = None,
              pod_uid: str = "") -> dict[str, Any]:
    result: dict[str, Any] = {"request": "gpu", "driver": D, "pool": "n1", "device": device}
    if tolerations:
        result["tolerations"] = tolerations
    return {"metadata": {"name": name, "namespace": "ns", "uid": f"c-{name}"},
            "status": {"allocation": {"devices": {"results": [result]}},
                       "reservedFor": [{"resource": "pods", "name": name, "uid": pod_uid or f"p-{name}"}]}}


def pod_of(name: str, claim: str = "") -> dict[str, Any]:
    return {"metadata": {"name": name, "namespace": "ns", "uid": f"p-{name}"},
            "spec": {"nodeName": "n1", "resourceClaims": [{"name": "gpu", "resourceClaimName": claim or name}]},
            "status": {"phase": "Running"}}


NO_EXECUTE_TOLERATION = {"key": RULE_KEY, "operator": "Equal", "value": "true", "effect": "NoExecute"}


# --- serving and validation ------------------------------------------------------------------------------------


@pytest.mark.parametrize(("version", "served"), [("1.34.0", "v1alpha3"), ("1.35.0", "v1alpha3"),
                                                 ("1.36.0", "v1beta2"), ("1.37.0", "v1")])
def test_each_release_serves_the_kind_in_its_versions_only(version: str, served: str) -> None:
    with ApiServer(kube_version=version) as srv:
        rest = srv.rest()
        assert taint_rule_version(rest) == served
        listing = rest.get(f"/apis/resource.k8s.io/{served}") or {}
        entry = next(r for r in listing["resources"] if r["name"] == "devicetaintrules")
        assert entry["namespaced"] is False and entry["kind"] == "DeviceTaintRule"
        assert any(r["name"] == "devicetaintrules/status" for r in listing["resources"])
        for other in {"v1", "v1beta2", "v1alpha3"} - {served} - ({"v1beta2"} if version == "1.37.0" else set()):
            with pytest.raises(ApiError) as refused:
                rest.request("GET", f"/apis/resource.k8s.io/{other}/devicetaintrules")
            assert refused.value.status == 404


@pytest.fixture(scope="module")
def server() -> Iterator[KubeRest]:
    with ApiServer(kube_version="1.37.0") as srv:
        yield srv.rest()


PATH = "/apis/resource.k8s.io/v1/devicetaintrules"


def test_a_rule_gets_time_added_generation_and_its_status_through_the_subresource(server: KubeRest) -> None:
    body = rule("timed")
    del body["spec"]["taint"]["timeAdded"], body["metadata"]["uid"], body["metadata"]["generation"]
    created = server.request("POST", PATH, body={**body, "status": {"conditions": []}})
    assert created["spec"]["taint"]["timeAdded"] and created["metadata"]["generation"] == 1
    assert "status" not in created
    changed = server.request("PUT", f"{PATH}/timed", body={**created, "spec": {
        **created["spec"], "taint": {**created["spec"]["taint"], "effect": "NoSchedule"}}})
    assert changed["metadata"]["generation"] == 2
    condition = {"type": "EvictionInProgress", "status": "False", "reason": "NotStarted", "message": "",
                 "observedGeneration": 2, "lastTransitionTime": "2027-01-01T00:00:00Z"}
    status = server.request("PUT", f"{PATH}/timed/status", body={**changed, "status": {"conditions": [condition]}})
    assert status["status"]["conditions"] == [condition]
    with pytest.raises(ApiError) as too_many:
        server.request("PUT", f"{PATH}/timed/status", body={**status, "status": {"conditions": [
            {**condition, "type": f"T{i}"} for i in range(9)]}})
    assert "status.conditions: Too many: 9: must have at most 8 items" in str(too_many.value)
    with pytest.raises(ApiError) as bad_reason:
        server.request("PUT", f"{PATH}/timed/status", body={**status, "status": {"conditions": [
            {**condition, "reason": "not a reason"}]}})
    assert "status.conditions[0].reason: Invalid value" in str(bad_reason.value)


def test_refusals_name_the_field_as_upstream_does(server: KubeRest) -> None:
    bad = rule("Bad_Name")
    bad["spec"]["deviceSelector"] = {"driver": "Not A Driver", "pool": "a//b", "device": "GPU_0"}
    bad["spec"]["taint"] = {"key": "", "value": "-x-", "effect": "PreferNoSchedule"}
    with pytest.raises(ApiError) as refused:
        server.request("POST", PATH, body=bad)
    text = str(refused.value)
    for expected in ("metadata.name: Invalid value: \"Bad_Name\"", "spec.deviceSelector.driver: Invalid value",
                     "spec.deviceSelector.pool: Invalid value", "spec.deviceSelector.device: Invalid value",
                     "spec.taint.key: Required value", "spec.taint.value: Invalid value",
                     'spec.taint.effect: Unsupported value: "PreferNoSchedule": supported values: "NoExecute", '
                     '"NoSchedule", "None"'):
        assert expected in text, (expected, text)
    missing = rule("no-effect")
    del missing["spec"]["taint"]["effect"]
    with pytest.raises(ApiError, match=r"spec\.taint\.effect: Required value"):
        server.request("POST", PATH, body=missing)
    with pytest.raises(ApiError, match=r'unknown field "spec\.deviceSelector\.deviceClassName"'):
        tombstoned = rule("tombstoned")
        tombstoned["spec"]["deviceSelector"]["deviceClassName"] = "gpu"  # removed in 1.35
        server.request("POST", PATH, body=tombstoned, query={"fieldValidation": "Strict"})


# --- the scheduler's view ----------------------------------------------------------------------------------------


def test_rules_add_their_taint_to_the_devices_they_select() -> None:
    slices = [slice_of(["gpu-0", "gpu-1"])]
    out = apply_taint_rules(slices, [rule("one"), {"metadata": {"name": "no-selector"}, "spec": {"taint": {
        "key": "k", "effect": "NoSchedule"}}}])
    devices = {d["name"]: d.get("taints") for d in out[0]["spec"]["devices"]}
    assert devices == {"gpu-0": [{"key": RULE_KEY, "value": "true", "effect": "NoExecute",
                                  "timeAdded": format_time(T0)}], "gpu-1": None}
    assert out[0]["metadata"]["resourceVersion"] != "7" and slices[0]["spec"]["devices"][0].get("taints") is None
    assert apply_taint_rules(slices, [])[0] is slices[0]
    everything: dict[str, Any] = {"spec": {"deviceSelector": {}}}
    assert rule_selects(everything, "a", "b", "c") and not rule_selects({"spec": {}}, "a", "b", "c")


def test_the_scheduler_keeps_claims_off_tainted_devices_unless_tolerated_and_copies_tolerations() -> None:
    cel = DraCelEnvironment()
    klass = {"apiVersion": "resource.k8s.io/v1", "kind": "DeviceClass", "metadata": {"name": D}, "spec": {}}
    slices = apply_taint_rules([slice_of(["gpu-0"])], [rule("ns", "NoSchedule", device=None)])

    def claim(tolerations: list[dict[str, Any]]) -> dict[str, Any]:
        exactly: dict[str, Any] = {"deviceClassName": D, "count": 1}
        if tolerations:
            exactly["tolerations"] = tolerations
        return {"metadata": {"name": "c", "namespace": "default", "uid": "u"},
                "spec": {"devices": {"requests": [{"name": "r", "exactly": exactly}]}}}

    common: dict[str, Any] = {"nodes": [ready_node("n1", {})], "classes": [klass], "slices": slices,
                              "allocated_claims": [], "namespace_labels": {}, "cel": cel}
    refused = plan_pod({"spec": {}}, [claim([])], **common)
    assert refused.node is None and "1 cannot allocate all claims." in refused.explanation
    assert "tainted" in refused.device_reasons["n1"][1]
    toleration = {"key": RULE_KEY, "operator": "Exists", "effect": "NoSchedule"}
    fits = plan_pod({"spec": {}}, [claim([toleration])], **common)
    assert fits.node == "n1"
    assert fits.allocations["c"]["devices"]["results"][0]["tolerations"] == [toleration]
    none = apply_taint_rules([slice_of(["gpu-0"])], [rule("dry", "None", device=None)])
    assert plan_pod({"spec": {}}, [claim([])], **{**common, "slices": none}).node == "n1"


# --- eviction ------------------------------------------------------------------------------------------------------


def test_eviction_time_from_tolerations_as_upstream_computes_it() -> None:
    devices = newest_devices([slice_of(["gpu-0"])])
    rules = [rule("r")]
    now = T0 + 5
    assert claim_eviction(allocated("bare", "gpu-0"), devices, rules, now).at == T0  # type: ignore[union-attr]
    assert claim_eviction(allocated("forever", "gpu-0", [NO_EXECUTE_TOLERATION]), devices, rules, now) is None
    timed = claim_eviction(allocated("t", "gpu-0", [{**NO_EXECUTE_TOLERATION, "tolerationSeconds": 300},
                                                    {**NO_EXECUTE_TOLERATION, "tolerationSeconds": 60}]),
                           devices, rules, now)
    assert timed is not None and timed.at == T0 + 60  # the smallest tolerationSeconds
    # A toleration without effect does not count against NoExecute (only effect NoExecute ones do).
    no_effect = {"key": RULE_KEY, "operator": "Exists"}
    assert claim_eviction(allocated("e", "gpu-0", [no_effect]), devices, rules, now) is not None
    assert claim_eviction(allocated("other", "gpu-1"), devices, rules, now) is None
    assert claim_eviction(allocated("ns", "gpu-0"), devices, [rule("x", "NoSchedule")], now) is None


def test_slice_taints_of_old_generations_do_not_evict() -> None:
    taint = [{"key": "k", "effect": "NoExecute", "timeAdded": format_time(T0)}]
    old, new = slice_of(["gpu-0"], generation=1, taints=taint), slice_of(["gpu-0"], generation=2)
    assert claim_eviction(allocated("a", "gpu-0"), newest_devices([old, new]), [], T0) is None
    assert claim_eviction(allocated("a", "gpu-0"), newest_devices([old]), [], T0) is not None


def test_a_plan_evicts_due_pods_waits_for_the_others_and_counts_per_rule() -> None:
    claims = [allocated("now", "gpu-0"), allocated("later", "gpu-0", [{**NO_EXECUTE_TOLERATION,
                                                                        "tolerationSeconds": 300}]),
              allocated("other-pod", "gpu-0", pod_uid="someone-else")]
    pods = [pod_of("now"), pod_of("later"), pod_of("other-pod"), {**pod_of("unscheduled"), "spec": {}}]
    result = plan(pods, claims, [slice_of(["gpu-0"])], [rule("r")], T0 + 1)
    assert [p["metadata"]["name"] for p, _ in result.evict] == ["now"]
    assert result.next_at == T0 + 300 and result.pending == {"uid-r": (2, 1)}


def test_rule_condition_messages() -> None:
    r = rule("r")
    assert rule_condition(r, pending_pods=2, pending_namespaces=1, evicted=1) == {
        "type": "EvictionInProgress", "status": "True", "reason": "PodsPendingEviction", "observedGeneration": 1,
        "message": "2 pods need to be evicted in 1 namespace. 1 pod evicted since starting the controller."}
    assert rule_condition(r, pending_pods=0, pending_namespaces=0, evicted=2)["message"] == \
        "2 pods evicted since starting the controller."
    assert rule_condition(r, pending_pods=0, pending_namespaces=0, evicted=0)["reason"] == "NotStarted"
    dry = rule_condition(rule("d", "None"), pending_pods=1, pending_namespaces=1, evicted=0, published_devices=3,
                         allocated_devices=1)
    assert dry["reason"] == "NoEffect" and dry["status"] == "False" and dry["message"] == (
        "3 published devices selected. 1 allocated device selected. 1 pod would be evicted in 1 namespace if the "
        "effect was NoExecute. This information will not be updated again. Recreate the DeviceTaintRule to trigger "
        "an update.")
    assert rule_condition(rule("s", "NoSchedule"), pending_pods=0, pending_namespaces=0, evicted=0)["reason"] == \
        "OtherEffect"


class FakeClock:
    """Wall time moved by the test; waits return at once (the test drives `reconcile` itself)."""

    def __init__(self, now: float) -> None:
        self.now = now

    def monotonic(self) -> float:
        return self.now

    def wall(self) -> float:
        return self.now

    def wait(self, stop: threading.Event, seconds: float) -> bool:
        return stop.is_set()


def test_the_controller_evicts_with_the_condition_and_event_and_keeps_the_rule_status(server: KubeRest) -> None:
    """On the API server: the pod without toleration goes at once (DisruptionTarget condition, Event, DELETE), the
    one tolerating 300 s when the clock passes it; the rule's EvictionInProgress follows."""
    ns = "evict"
    server.request("POST", "/api/v1/namespaces", body={"apiVersion": "v1", "kind": "Namespace",
                                                       "metadata": {"name": ns}})
    server.request("POST", "/apis/resource.k8s.io/v1/resourceslices", body=slice_of(["gpu-0", "gpu-1"]))
    clock = FakeClock(T0)
    uids: dict[str, str] = {}
    for name, tolerations in (("bare", None), ("timed", [{**NO_EXECUTE_TOLERATION, "tolerationSeconds": 300}])):
        created_pod = server.request("POST", f"/api/v1/namespaces/{ns}/pods", body={
            "apiVersion": "v1", "kind": "Pod", "metadata": {"name": name},
            "spec": {"nodeName": "n1", "containers": [{"name": "c", "image": "busybox"}],
                     "resourceClaims": [{"name": "gpu", "resourceClaimName": name}]}})
        uids[name] = created_pod["metadata"]["uid"]
        exactly: dict[str, Any] = {"deviceClassName": D}
        claim = server.request("POST", f"/apis/resource.k8s.io/v1/namespaces/{ns}/resourceclaims", body={
            "apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim", "metadata": {"name": name},
            "spec": {"devices": {"requests": [{"name": "gpu", "exactly": exactly}]}}})
        status = allocated(name, "gpu-0", tolerations, pod_uid=uids[name])["status"]
        server.request("PUT", f"/apis/resource.k8s.io/v1/namespaces/{ns}/resourceclaims/{name}/status",
                       body={**claim, "status": status})
    created = server.request("POST", PATH, body={**rule("evict-gpu-0"), "metadata": {"name": "evict-gpu-0"}})
    clock.now = T0 + 1
    controller = DeviceTaintEvictionController(server, clock=clock, status_period_s=10.0)
    controller._rules_path = PATH  # what start() discovers; the test drives reconcile() itself
    assert controller.reconcile() == pytest.approx(299.0)  # the timed pod's eviction is next

    def pod(name: str) -> dict[str, Any] | None:
        return server.get(f"/api/v1/namespaces/{ns}/pods/{name}")

    bare = pod("bare")  # nodeName set and no kubelet: the pod waits for its grace period, marked deleted
    assert bare is not None and bare["metadata"].get("deletionTimestamp")
    condition = next(c for c in bare["status"]["conditions"] if c["type"] == "DisruptionTarget")
    assert condition["status"] == "True" and condition["reason"] == DISRUPTION_REASON
    events = server.request("GET", f"/api/v1/namespaces/{ns}/events")["items"]
    assert [(e["reason"], e["message"], e["involvedObject"]["name"]) for e in events] == [
        (EVENT_REASON, "Marking for deletion", "bare")]
    status = (server.get(f"{PATH}/evict-gpu-0") or {})["status"]["conditions"][0]
    assert (status["status"], status["reason"], status["message"]) == (
        "True", "PodsPendingEviction", "1 pod needs to be evicted in 1 namespace. 1 pod evicted since starting the "
        "controller.")
    timed = pod("timed")
    assert timed is not None and not timed["metadata"].get("deletionTimestamp")

    clock.now = T0 + 300
    controller.reconcile()
    timed = pod("timed")
    assert timed is not None and timed["metadata"].get("deletionTimestamp")
    clock.now = T0 + 320  # past the status period: the condition catches up
    controller.reconcile()
    status = (server.get(f"{PATH}/evict-gpu-0") or {})["status"]["conditions"][0]
    assert (status["status"], status["reason"], status["message"]) == (
        "False", "Completed", "2 pods evicted since starting the controller.")
    assert status["observedGeneration"] == created["metadata"]["generation"]


def test_the_controller_loop_wakes_on_a_watch_event(server: KubeRest) -> None:
    """No polling: a rule created while the loop sleeps gets its status from the watch event."""
    controller = DeviceTaintEvictionController(server)
    controller.start()
    try:
        body = rule("woken", "NoSchedule")
        body["metadata"] = {"name": "woken"}
        server.request("POST", PATH, body=body)
        found = wait_for(lambda: ((server.get(f"{PATH}/woken") or {}).get("status") or {}).get("conditions"), 10,
                         "the rule's status")
        assert found[0]["reason"] == "OtherEffect"
    finally:
        controller.stop()
