"""The PodScheduled=False message summarises every node as kube-scheduler's FitError does, on published slices of
the e2e nodes (dgx-h100 with whole GPUs and dynamic MIG, dgx-a100 with MIG on: only MIG devices)."""

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
from dra_sandbox.scheduler import NodeFailure, fit_error, plan_pod

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


def _plan(pod_spec: dict[str, Any], *claims: dict[str, Any]) -> str:
    plan = plan_pod({"metadata": {"name": "p", "namespace": "team"}, "spec": pod_spec}, list(claims), nodes=NODES,
                    classes=CLASSES, slices=SLICES, allocated_claims=[], namespace_labels={}, cel=CEL)
    assert plan.node is None
    return plan.explanation


def test_every_node_is_summarised_by_its_leading_reason() -> None:
    message = _plan({}, _claim("nine", DRIVER_NAME, count=9))
    assert message.startswith("0/2 nodes are available: ")
    # The A100 node has MIG devices only: no whole GPU matches the class; the H100 node has eight, not nine.
    assert "1 node(s) cannot satisfy the claim's device requests: request 'gpu': needs 9 devices, 0 available " \
           f"(device class '{DRIVER_NAME}' selector #0 is false" in message
    assert "1 node(s) cannot satisfy the claim's device requests: request 'gpu': needs 9 devices, 8 available" \
        in message
    assert message.endswith(". run `dra-driver explain team/nine` for details")


def test_node_selector_misses_are_counted_like_kube_scheduler() -> None:
    message = _plan({"nodeSelector": {"kind": "a100"}}, _claim("whole", DRIVER_NAME))
    assert message == (
        "0/2 nodes are available: 1 node(s) cannot satisfy the claim's device requests: request 'gpu': needs 1 device, "
        f"0 available (device class '{DRIVER_NAME}' selector #0 is false: device.driver == '{DRIVER_NAME}' && "
        f"device.attributes['{DRIVER_NAME}'].type == 'gpu'), 1 node(s) didn't match Pod's node affinity/selector. "
        "still not schedulable, preemption: 0/2 nodes are available: 2 Preemption is not helpful for scheduling.. "
        "run `dra-driver explain team/whole` for details"
    )


def test_a_cel_runtime_error_is_named_as_such() -> None:
    unguarded = f"device.attributes['{DRIVER_NAME}'].profile == '1g.10gb'"  # whole GPUs have no `profile`
    message = _plan({"nodeSelector": {"kind": "h100"}}, _claim("unguarded", DRIVER_NAME, selector=unguarded))
    assert "1 node(s) cannot satisfy the claim's device requests: CEL runtime error: " in message
    assert "no such key: profile" in message and "(in request 'gpu' selector #0)" in message


def test_several_claims_name_the_failing_one() -> None:
    ok = _claim("fine", f"mig.{DRIVER_NAME}")
    message = _plan({"nodeSelector": {"kind": "h100"}}, ok, _claim("nine", DRIVER_NAME, count=9))
    assert "cannot satisfy the claim's device requests: claim nine: request 'gpu': needs 9 devices" in message
    assert message.endswith("run `dra-driver explain team/nine` for details")


def test_fit_error_groups_identical_reasons_and_sorts() -> None:
    failures = [NodeFailure("n1", ("z reason",), claim="ns/c"), NodeFailure("n2", ("a reason", "b reason")),
                NodeFailure("n3", ("z reason",), claim="ns/c")]
    assert fit_error(4, failures, "post") == (
        "0/4 nodes are available: 1 a reason, 1 b reason, 2 z reason. post. run `dra-driver explain ns/c` for details"
    )
    assert fit_error(0, []) == "0/0 nodes are available:"
