"""NVIDIA's quickstart gpu-test6 (demo/specs/quickstart/gpu-test6.yaml), renamed only, allocates in `explain` and in
the scheduler stand-in: its selector needs the strings extension (`lowerAscii`), which Kubernetes' DRA CEL
environment has and kube-scheduler allocates."""

from __future__ import annotations

from typing import Any

from dra_driver.cel.environment import DraCelEnvironment
from dra_driver.commands.explain import explain_claim
from dra_driver.defaults import DRIVER_NAME
from dra_driver.inventory.catalog import MigOffering, catalog
from dra_driver.inventory.discover import discover
from dra_driver.nvml.factory import open_backend
from dra_driver.slices.builder import SliceSettings, build_slices
from dra_sandbox.deviceclasses import device_classes
from dra_sandbox.kubelet.nodestatus import ready_node
from dra_sandbox.scheduler import plan_pod

SELECTOR = f"device.attributes[\"{DRIVER_NAME}\"].productName.lowerAscii().matches('^.*a100.*$')\n"
CLASSES = device_classes(DRIVER_NAME)


def _slices(node: str, spec: str) -> list[dict[str, Any]]:
    backend = open_backend(f"fake:{spec}")
    backend.init()
    inv = discover(backend)
    return build_slices(inv.system, catalog(inv, MigOffering.DYNAMIC), SliceSettings(DRIVER_NAME, node), 1)


# Nodes as their kubelets register them (with allocatable pods, cpu, memory), since NodeResourcesFit runs first.
NODES = [ready_node(n) for n in ("node-a100-whole", "node-h100")]
SLICES = [*_slices("node-h100", "dgx-h100"), *_slices("node-a100-whole", "dgx-a100,mig=off")]
CLAIM = {
    "apiVersion": "resource.k8s.io/v1",
    "kind": "ResourceClaim",
    "metadata": {"name": "pod-gpu", "namespace": "gpu-test6", "uid": "uid-1"},
    "spec": {"devices": {"requests": [{"name": "gpu", "exactly": {
        "deviceClassName": DRIVER_NAME, "selectors": [{"cel": {"expression": SELECTOR}}]}}]}},
}


def test_scheduler_stand_in_places_it_on_the_a100_node() -> None:
    for minor in (34, 35, 36, 37):
        plan = plan_pod({"metadata": {"name": "pod", "namespace": "gpu-test6"}, "spec": {}}, [CLAIM], nodes=NODES,
                        classes=CLASSES, slices=SLICES, allocated_claims=[], namespace_labels={},
                        cel=DraCelEnvironment(kubernetes_minor=minor))
        assert plan.node == "node-a100-whole", plan.explanation
        [allocation] = plan.allocations.values()
        [result] = allocation["devices"]["results"]
        assert result["pool"] == "node-a100-whole" and result["request"] == "gpu"


def test_explain_says_it_fits_on_the_a100_node() -> None:
    fits, text = explain_claim(CLAIM, nodes=NODES, classes=CLASSES, slices=SLICES, claims=[], namespace_labels={})
    assert fits == ["node-a100-whole"], text
    assert "undeclared reference" not in text


def test_the_api_server_accepts_it_as_a_new_selector() -> None:
    for minor in (34, 35, 36, 37):
        env = DraCelEnvironment(kubernetes_minor=minor, new_expressions=True)
        assert env.check_new_expression(SELECTOR) is None
