"""The PodScheduled=False message is kube-scheduler 1.37's FitError (DynamicResources' "cannot allocate all claims",
its PreFilter's "device class ... does not exist"), on published slices of the e2e nodes (dgx-h100 with whole GPUs and dynamic MIG, dgx-a100 with MIG on: only MIG devices)."""

from __future__ import annotations

from typing import Any

from dra_driver.cel.environment import DraCelEnvironment
from dra_driver.defaults import DRIVER_NAME
from dra_driver.inventory.catalog import MigOffering, catalog
from dra_driver.inventory.discover import discover
from dra_driver.nvml.factory import open_backend
from dra_driver.slices.builder import SliceSettings, build_slices
from dra_sandbox.deviceclasses import device_classes
from dra_sandbox.kubelet.nodestatus import ready_node
from dra_sandbox.scheduler import NodeFailure, PodPlan, fit_error, plan_pod

CEL = DraCelEnvironment()
CLASSES = device_classes(DRIVER_NAME)


def _slices(node: str, preset: str) -> list[dict[str, Any]]:
    backend = open_backend(f"fake:{preset}")
    backend.init()
    inv = discover(backend)
    return build_slices(inv.system, catalog(inv, MigOffering.DYNAMIC), SliceSettings(DRIVER_NAME, node), 1)


NODES = [ready_node("node-a100", {"kind": "a100"}), ready_node("node-h100", {"kind": "h100"})]
SLICES = [*_slices("node-h100", "dgx-h100"), *_slices("node-a100", "dgx-a100")]


def _claim(name: str, cls: str, count: int = 1, selector: str | None = None) -> dict[str, Any]:
    exactly: dict[str, Any] = {"deviceClassName": cls, "count": count}
    if selector:
        exactly["selectors"] = [{"cel": {"expression": selector}}]
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": name, "namespace": "team", "uid": f"uid-{name}"},
        "spec": {"devices": {"requests": [{"name": "gpu", "exactly": exactly}]}},
    }


def _plan_of(pod_spec: dict[str, Any], *claims: dict[str, Any]) -> PodPlan:
    plan = plan_pod({"metadata": {"name": "p", "namespace": "team"}, "spec": pod_spec}, list(claims), nodes=NODES,
                    classes=CLASSES, slices=SLICES, allocated_claims=[], namespace_labels={}, cel=CEL)
    assert plan.node is None
    return plan


def _plan(pod_spec: dict[str, Any], *claims: dict[str, Any]) -> str:
    return _plan_of(pod_spec, *claims).explanation


NOT_HELPFUL = "still not schedulable, preemption: 0/2 nodes are available: 2 Preemption is not helpful for scheduling."


def test_every_node_is_counted_with_kube_schedulers_words_and_the_reasons_stay_for_explain() -> None:
    plan = _plan_of({}, _claim("nine", DRIVER_NAME, count=9))
    # kube-scheduler 1.37 names no device reason: DynamicResources' Filter says "cannot allocate all claims".
    assert plan.explanation == f"0/2 nodes are available: 2 cannot allocate all claims. {NOT_HELPFUL}"
    # The A100 node has MIG devices only: no whole GPU matches the class; the H100 node has eight, not nine.
    assert plan.device_reasons["node-a100"] == (
        "team/nine", "request 'gpu': needs 9 devices, 0 available "
        f"(device class '{DRIVER_NAME}' selector #0 is false: device.driver == '{DRIVER_NAME}' && "
        f"device.attributes['{DRIVER_NAME}'].type == 'gpu')")
    assert plan.device_reasons["node-h100"][1].startswith("request 'gpu': needs 9 devices, 8 available")


def test_node_selector_misses_are_counted_like_kube_scheduler() -> None:
    message = _plan({"nodeSelector": {"kind": "a100"}}, _claim("whole", DRIVER_NAME))
    assert message == (
        "0/2 nodes are available: 1 cannot allocate all claims, 1 node(s) didn't match Pod's node affinity/selector. "
        f"{NOT_HELPFUL}"
    )


def test_a_class_for_a_driver_nobody_runs_is_no_holder_of_other_devices() -> None:
    # Issue 32 (2): a class no device matches is "cannot allocate all claims" on every node, as kube-scheduler
    # says, not "allocated to claim ..." of some other claim's devices.
    klass = {"apiVersion": "resource.k8s.io/v1", "kind": "DeviceClass", "metadata": {"name": "nobody.example.com"},
             "spec": {"selectors": [{"cel": {"expression": "device.driver == 'nobody.example.com'"}}]}}
    plan = plan_pod({"metadata": {"name": "p", "namespace": "team"}, "spec": {}},
                    [_claim("nobody", "nobody.example.com")], nodes=NODES, classes=[*CLASSES, klass], slices=SLICES,
                    allocated_claims=[], namespace_labels={}, cel=CEL)
    assert plan.explanation == f"0/2 nodes are available: 2 cannot allocate all claims. {NOT_HELPFUL}"


def test_a_missing_device_class_fails_in_the_prefilter() -> None:
    # DynamicResources' PreFilter (validateDeviceClass) fails before it records the claims: its PostFilter has none.
    message = _plan({}, _claim("ghost", "no-such-class"))
    assert message == (
        "0/2 nodes are available: request gpu: device class no-such-class does not exist. no new claims to "
        "deallocate, preemption: 0/2 nodes are available: 2 Preemption is not helpful for scheduling."
    )
    sub = _claim("ghost-sub", DRIVER_NAME)
    sub["spec"]["devices"]["requests"] = [{"name": "gpu", "firstAvailable": [
        {"name": "big", "deviceClassName": DRIVER_NAME}, {"name": "small", "deviceClassName": "gone"}]}]
    assert "request gpu/small: device class gone does not exist." in _plan({}, sub)


def test_a_claim_allocated_elsewhere_is_not_available_on_the_node() -> None:
    elsewhere = _claim("placed", DRIVER_NAME)
    elsewhere["status"] = {"allocation": {"devices": {"results": []}, "nodeSelector": {"nodeSelectorTerms": [
        {"matchFields": [{"key": "metadata.name", "operator": "In", "values": ["node-h100"]}]}]}}}
    message = _plan({"nodeSelector": {"kind": "a100"}}, elsewhere)
    assert message.startswith("0/2 nodes are available: 1 node(s) didn't match Pod's node affinity/selector, "
                              "1 resourceclaim not available on the node.")


def test_a_cel_runtime_error_is_kept_for_explain() -> None:
    unguarded = f"device.attributes['{DRIVER_NAME}'].profile == '1g.10gb'"  # whole GPUs have no `profile`
    plan = _plan_of({"nodeSelector": {"kind": "h100"}}, _claim("unguarded", DRIVER_NAME, selector=unguarded))
    assert "1 cannot allocate all claims" in plan.explanation
    reason = plan.device_reasons["node-h100"][1]
    assert reason.startswith("CEL runtime error: ")
    assert "no such key: profile" in reason and "(in request 'gpu' selector #0)" in reason


def test_several_claims_name_the_failing_one_for_explain() -> None:
    ok = _claim("fine", f"mig.{DRIVER_NAME}")
    plan = _plan_of({"nodeSelector": {"kind": "h100"}}, ok, _claim("nine", DRIVER_NAME, count=9))
    assert plan.explanation.startswith("0/2 nodes are available: 1 cannot allocate all claims, ")
    claim, reason = plan.device_reasons["node-h100"]
    assert claim == "team/nine" and reason.startswith("claim nine: request 'gpu': needs 9 devices")


def test_fit_error_groups_identical_reasons_and_sorts() -> None:
    failures = [NodeFailure("n1", ("z reason",), claim="ns/c"), NodeFailure("n2", ("a reason", "b reason")),
                NodeFailure("n3", ("z reason",), claim="ns/c")]
    assert fit_error(4, failures, "post.") == "0/4 nodes are available: 1 a reason, 1 b reason, 2 z reason. post."
    assert fit_error(0, []) == "0/0 nodes are available:"
