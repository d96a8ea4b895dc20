"""The scheduler stand-in's KEP-5004 decisions (extended resources backed by DRA): which class backs a name,
the special claim it builds for a device-plugin pod, and nodes with device-plugin capacity taking the normal
path."""

from __future__ import annotations

from typing import Any

from dra_driver.cel.environment import DraCelEnvironment
from dra_driver.defaults import DRIVER_NAME
from dra_sandbox.scheduler import (
    EXTENDED_RESOURCE_CLAIM_ANNOTATION,
    ExtendedRequest,
    extended_requests,
    extended_resource_classes,
    plan_pod,
)
from tests.sandbox.test_scheduler import _node, _slice

CEL = DraCelEnvironment()


def _class(name: str, extended: str | None, created: str = "2026-01-01T00:00:00Z") -> dict[str, Any]:
    spec: dict[str, Any] = {"selectors": [{"cel": {"expression": f"device.driver == '{DRIVER_NAME}'"}}]}
    if extended:
        spec["extendedResourceName"] = extended
    return {"apiVersion": "resource.k8s.io/v1", "kind": "DeviceClass",
            "metadata": {"name": name, "creationTimestamp": created}, "spec": spec}


def _pod(*containers: dict[str, Any]) -> dict[str, Any]:
    return {"metadata": {"name": "legacy", "namespace": "default", "uid": "pod-uid"},
            "spec": {"containers": list(containers)}}


def test_the_newest_class_wins_a_name_and_every_class_has_its_implicit_name() -> None:
    classes = [_class("old", "nvidia.com/gpu", "2026-01-01T00:00:00Z"), _class("new", "nvidia.com/gpu",
                                                                           "2026-02-01T00:00:00Z"),
               _class("b-tie", "example.com/x"), _class("a-tie", "example.com/x")]
    names = extended_resource_classes(classes)
    assert names["nvidia.com/gpu"] == "new"
    assert names["example.com/x"] == "a-tie"
    assert names["deviceclass.resource.kubernetes.io/old"] == "old"


def test_one_request_per_container_and_extended_resource() -> None:
    pod = _pod({"name": "a", "resources": {"limits": {"nvidia.com/gpu": "2", "cpu": "1"}}},
               {"name": "b", "resources": {"limits": {"memory": "1Gi"}}},
               {"name": "c", "resources": {"requests": {"nvidia.com/gpu": "1",
                                                        "deviceclass.resource.kubernetes.io/other": "1"}}})
    classes = [_class("gpus", "nvidia.com/gpu"), _class("other", None)]
    assert extended_requests(pod, classes) == [
        ExtendedRequest("a", "nvidia.com/gpu", "container-0-request-0", "gpus", 2),
        ExtendedRequest("c", "deviceclass.resource.kubernetes.io/other", "container-2-request-0", "other", 1),
        ExtendedRequest("c", "nvidia.com/gpu", "container-2-request-1", "gpus", 1),
    ]


def test_device_plugin_pod_gets_a_special_claim_unless_the_node_has_plugin_capacity() -> None:
    pod = _pod({"name": "main", "resources": {"limits": {"nvidia.com/gpu": "1"}}})
    classes = [_class("gpus", "nvidia.com/gpu")]
    requests = extended_requests(pod, classes)
    plugin_node = _node("a-plugin")
    plugin_node["status"]["allocatable"]["nvidia.com/gpu"] = "8"
    dra_node = _node("b-dra")
    plan = plan_pod(pod, [], nodes=[plugin_node, dra_node], classes=classes, slices=[_slice("b-dra", ["gpu-0"])],
                    allocated_claims=[], namespace_labels={}, cel=CEL, extended=requests)
    # The first node serves the name with its device plugin: no claim there.
    assert plan.node == "a-plugin" and plan.extended is None and plan.allocations == {}

    plan = plan_pod(pod, [], nodes=[dra_node], classes=classes, slices=[_slice("b-dra", ["gpu-0"])],
                    allocated_claims=[], namespace_labels={}, cel=CEL, extended=requests)
    assert plan.node == "b-dra" and plan.extended is not None
    meta = plan.extended["metadata"]
    assert meta["generateName"] == "legacy-extended-resources-"
    assert meta["annotations"] == {EXTENDED_RESOURCE_CLAIM_ANNOTATION: "true"}
    assert meta["ownerReferences"][0]["uid"] == "pod-uid" and meta["ownerReferences"][0]["controller"] is True
    assert plan.extended["spec"]["devices"]["requests"] == [{"name": "container-0-request-0", "exactly": {
        "deviceClassName": "gpus", "allocationMode": "ExactCount", "count": 1}}]
    [allocation] = plan.allocations.values()
    assert allocation["devices"]["results"][0]["request"] == "container-0-request-0"
    assert allocation["devices"]["results"][0]["device"] == "gpu-0"

    # Two GPUs asked, one published: not schedulable, explained.
    big = _pod({"name": "main", "resources": {"limits": {"nvidia.com/gpu": "2"}}})
    plan = plan_pod(big, [], nodes=[dra_node], classes=classes, slices=[_slice("b-dra", ["gpu-0"])],
                    allocated_claims=[], namespace_labels={}, cel=CEL, extended=extended_requests(big, classes))
    assert plan.node is None and "cannot allocate all claims" in plan.explanation
    [(held_by, reason)] = plan.device_reasons.values()  # kube-scheduler's words leave the claim out; explain has it
    assert "legacy-extended-resources-" in held_by and "needs 2 devices, 1 available" in reason
