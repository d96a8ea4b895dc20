"""KEP-5007 binding conditions in the sandbox scheduler, as kube-scheduler's DynamicResources plugin applies them:
the pod waits in PreBind until every binding condition is True in the claim's status.devices, and a failure
condition or the binding timeout deallocates the claim for a fresh attempt. Each step calls `reconcile()`; time
moves on the scheduler's injected clock (no sleeps)."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from dra_driver.k8s.client import KubeRest
from dra_sandbox import bindingconditions as bc
from dra_sandbox.apiserver import ApiServer
from dra_sandbox.kubelet.nodestatus import ready_node
from dra_sandbox.scheduler import SandboxScheduler
from tests.clocks import MovableClock

NODE = "node-1"
DRIVER = "attach.example.com"
RESOURCE = "/apis/resource.k8s.io/v1"
READY, FAILED = f"{DRIVER}/attached", f"{DRIVER}/attach-failed"
CLAIM = f"{RESOURCE}/namespaces/default/resourceclaims/c"


@dataclass
class Env:
    rest: KubeRest
    clock: MovableClock
    scheduler: SandboxScheduler

    def claim(self) -> dict[str, Any]:
        obj = self.rest.get(CLAIM)
        assert obj is not None
        return obj

    def node_of_pod(self) -> str:
        pod = self.rest.get("/api/v1/namespaces/default/pods/p") or {}
        return str((pod.get("spec") or {}).get("nodeName") or "")

    def pod_scheduled_message(self) -> str:
        pod = self.rest.get("/api/v1/namespaces/default/pods/p") or {}
        conditions: list[dict[str, Any]] = (pod.get("status") or {}).get("conditions") or []
        cond = next((c for c in conditions if c["type"] == "PodScheduled"), {})
        return str(cond.get("message", ""))

    def events(self) -> list[tuple[str, str]]:
        items = self.rest.request("GET", "/api/v1/namespaces/default/events")["items"]
        return [(e["reason"], e["message"]) for e in items]

    def set_condition(self, kind: str, status: str = "True", reason: str = "Done", message: str = "") -> None:
        """What the device's controller does: a condition in status.devices[] of the allocated device."""
        claim = self.claim()
        result = claim["status"]["allocation"]["devices"]["results"][0]
        entry = {"driver": result["driver"], "pool": result["pool"], "device": result["device"],
                 "conditions": [{"type": kind, "status": status, "reason": reason, "message": message,
                                 "lastTransitionTime": "2026-07-01T12:00:00Z"}]}
        claim["status"]["devices"] = [entry]
        self.rest.request("PUT", f"{CLAIM}/status", body=claim)


def _slice(devices: list[dict[str, Any]]) -> dict[str, Any]:
    return {
        "apiVersion": "resource.k8s.io/v1", "kind": "ResourceSlice",
        "metadata": {"name": "s"},
        "spec": {"driver": DRIVER, "nodeName": NODE, "pool": {"name": NODE, "generation": 1, "resourceSliceCount": 1},
                 "devices": devices},
    }


def _gated(name: str, **extra: Any) -> dict[str, Any]:
    return {"name": name, "bindingConditions": [READY], "bindingFailureConditions": [FAILED], **extra}


def _make_env(version: str, devices: list[dict[str, Any]]) -> Iterator[Env]:
    with ApiServer(kube_version=version) as server:
        rest = server.rest()
        rest.request("POST", "/api/v1/nodes", body=ready_node(NODE))
        rest.request("POST", f"{RESOURCE}/deviceclasses", body={
            "apiVersion": "resource.k8s.io/v1", "kind": "DeviceClass", "metadata": {"name": "attach"},
            "spec": {"selectors": [{"cel": {"expression": f"device.driver == '{DRIVER}'"}}]}})
        rest.request("POST", f"{RESOURCE}/resourceslices", body=_slice(devices))
        rest.request("POST", f"{RESOURCE}/namespaces/default/resourceclaims", body={
            "apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim", "metadata": {"name": "c"},
            "spec": {"devices": {"requests": [{"name": "r", "exactly": {"deviceClassName": "attach"}}]}}})
        rest.request("POST", "/api/v1/namespaces/default/pods", body={
            "apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p"},
            "spec": {"containers": [{"name": "c", "image": "busybox", "resources": {"claims": [{"name": "c"}]}}],
                     "resourceClaims": [{"name": "c", "resourceClaimName": "c"}]}})
        clock = MovableClock()
        yield Env(rest, clock, SandboxScheduler(rest, kubernetes_minor=int(version.split(".")[1]), clock=clock))


@pytest.fixture
def env() -> Iterator[Env]:
    yield from _make_env("1.37.0", [_gated("dev-0", bindsToNode=True)])


def test_the_pod_waits_in_prebind_until_the_binding_condition_is_true(env: Env) -> None:
    env.scheduler.reconcile()
    claim = env.claim()
    allocation = claim["status"]["allocation"]
    (result,) = allocation["devices"]["results"]
    assert result["bindingConditions"] == [READY] and result["bindingFailureConditions"] == [FAILED]
    assert allocation["allocationTimestamp"] == "2026-07-01T12:00:00Z"
    # bindsToNode: the allocation is pinned to the chosen node.
    assert allocation["nodeSelector"]["nodeSelectorTerms"][0]["matchFields"][0]["values"] == [NODE]
    assert [r["name"] for r in claim["status"]["reservedFor"]] == ["p"]
    assert env.node_of_pod() == ""  # held in PreBind
    assert (bc.BINDING_CONDITIONS_PENDING, f"waiting for binding conditions for device on node {NODE}") in env.events()

    env.clock.now += timedelta(seconds=30)
    env.scheduler.reconcile()
    assert env.node_of_pod() == ""
    assert sum(1 for r, _ in env.events() if r == bc.BINDING_CONDITIONS_PENDING) == 1  # recorded once
    env.set_condition(READY, status="False")
    env.scheduler.reconcile()
    assert env.node_of_pod() == ""  # False is not True
    env.set_condition(READY)
    env.scheduler.reconcile()
    assert env.node_of_pod() == NODE
    assert env.claim()["status"]["allocation"]["allocationTimestamp"] == "2026-07-01T12:00:00Z"  # set once


def test_a_failure_condition_deallocates_the_claim_and_the_next_pass_allocates_afresh(env: Env) -> None:
    env.scheduler.reconcile()
    env.set_condition(FAILED, reason="NoPath", message="fabric port down")
    env.clock.now += timedelta(seconds=5)
    env.scheduler.reconcile()
    claim = env.claim()
    assert "allocation" not in claim["status"] and not claim["status"].get("reservedFor")
    assert env.node_of_pod() == ""
    expected = 'claim c binding failed: reason=NoPath, message="fabric port down"'
    assert env.pod_scheduled_message() == f"{expected}; {bc.DEALLOCATED}"
    assert ("FailedScheduling", f'running PreBind plugin "DynamicResources": {expected}') in env.events()
    env.scheduler.reconcile()
    again = env.claim()["status"]["allocation"]
    assert again["allocationTimestamp"] == "2026-07-01T12:00:05Z"  # a new attempt, a new timer
    assert env.node_of_pod() == ""


def test_the_binding_timeout_deallocates(env: Env) -> None:
    env.scheduler.reconcile()
    env.clock.now += timedelta(seconds=600)
    env.scheduler.reconcile()
    assert env.claim()["status"].get("allocation")  # 600 s is not past the timeout yet
    env.clock.now += timedelta(seconds=1)
    env.scheduler.reconcile()
    assert "allocation" not in env.claim()["status"]
    assert env.pod_scheduled_message() == f"claim c binding timeout; {bc.DEALLOCATED}"


def test_before_136_devices_with_binding_conditions_are_not_allocated() -> None:
    """DRADeviceBindingConditions is alpha (off) in 1.34 and 1.35: such a device is never selectable."""
    for env in _make_env("1.35.0", [_gated("dev-0"), {"name": "dev-1"}]):
        env.scheduler.reconcile()
        (result,) = env.claim()["status"]["allocation"]["devices"]["results"]
        assert result["device"] == "dev-1" and "bindingConditions" not in result
        assert "allocationTimestamp" not in env.claim()["status"]["allocation"]
        assert env.node_of_pod() == NODE
    for env in _make_env("1.35.0", [_gated("dev-0")]):
        env.scheduler.reconcile()
        assert not env.claim().get("status", {}).get("allocation")
        assert env.node_of_pod() == ""


def test_binding_timeout_must_be_at_least_one_second() -> None:
    with ApiServer() as server, pytest.raises(ValueError, match="at least 1 s"):
        SandboxScheduler(server.rest(), binding_timeout_s=0.5)


@pytest.mark.parametrize(
    ("devices_status", "readiness"),
    [
        ([], bc.Readiness.WAITING),  # no status entry yet
        ([{"type": READY, "status": "True"}], bc.Readiness.READY),
        ([{"type": READY, "status": "True"}, {"type": FAILED, "status": "True", "reason": "r", "message": "m"}],
         bc.Readiness.FAILED),  # a failure wins even when the condition is also True
        ([{"type": FAILED, "status": "False"}], bc.Readiness.WAITING),
    ],
)
def test_claim_readiness(devices_status: list[dict[str, Any]], readiness: bc.Readiness) -> None:
    result = {"driver": DRIVER, "pool": NODE, "device": "d", "bindingConditions": [READY],
              "bindingFailureConditions": [FAILED]}
    status: dict[str, Any] = {"allocation": {"devices": {"results": [result]},
                                             "allocationTimestamp": "2026-07-01T12:00:00Z"}}
    if devices_status:
        status["devices"] = [{"driver": DRIVER, "pool": NODE, "device": "d", "conditions": devices_status}]
    claim = {"metadata": {"name": "c"}, "status": status}
    now = datetime(2026, 7, 1, 12, 5, tzinfo=UTC)
    assert bc.claim_readiness(claim, now, 600).readiness is readiness


def test_deallocation_keeps_a_claim_another_pod_holds() -> None:
    status = {"allocation": {"devices": {}}, "reservedFor": [{"uid": "a"}, {"uid": "b"}]}
    assert bc.deallocated_status(status, "a") == {"allocation": {"devices": {}}, "reservedFor": [{"uid": "b"}]}
    assert bc.deallocated_status({"allocation": {}, "reservedFor": [{"uid": "a"}]}, "a") == {}
