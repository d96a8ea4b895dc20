"""The scheduler stand-in's pure decisions: claim names of a pod, node choice, releasing reservations."""

from __future__ import annotations

from typing import Any

from dra_driver.cel.environment import DraCelEnvironment
from dra_driver.defaults import DRIVER_NAME
from dra_sandbox.kubelet.nodestatus import ready_node
from dra_sandbox.scheduler import plan_pod, pod_claim_names, release_plan

CEL = DraCelEnvironment()


def _node(name: str, **labels: str) -> dict[str, Any]:
    return ready_node(name, labels)


def _slice(node: str, devices: list[str]) -> dict[str, Any]:
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceSlice",
        "metadata": {"name": f"{node}-s"},
        "spec": {
            "driver": DRIVER_NAME,
            "nodeName": node,
            "pool": {"name": node, "generation": 1, "resourceSliceCount": 1},
            "devices": [{"name": d, "attributes": {"type": {"string": "gpu"}}} for d in devices],
        },
    }


CLASS = {"apiVersion": "resource.k8s.io/v1", "kind": "DeviceClass", "metadata": {"name": DRIVER_NAME}, "spec": {}}


def _claim(name: str, count: int = 1) -> dict[str, Any]:
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": name, "namespace": "default", "uid": f"uid-{name}"},
        "spec": {"devices": {"requests": [{"name": "r", "exactly": {"deviceClassName": DRIVER_NAME, "count": count}}]}},
    }


def test_pod_claim_names_resolve_templates_through_status() -> None:
    pod = {
        "spec": {"resourceClaims": [{"name": "a", "resourceClaimName": "shared"}, {"name": "b", "resourceClaimTemplateName": "t"}, {"name": "c", "resourceClaimTemplateName": "t"}]},
        "status": {"resourceClaimStatuses": [{"name": "b", "resourceClaimName": "pod-b-x1"}]},
    }
    assert pod_claim_names(pod) == (["shared", "pod-b-x1"], ["c"])


def test_first_node_where_every_claim_fits_wins() -> None:
    nodes = [_node("a-small"), _node("b-big")]
    slices = [_slice("a-small", ["gpu-0"]), _slice("b-big", ["gpu-0", "gpu-1"])]
    plan = plan_pod({"spec": {}}, [_claim("one"), _claim("two")], nodes=nodes, classes=[CLASS], slices=slices, allocated_claims=[], namespace_labels={}, cel=CEL)
    assert plan.node == "b-big"  # a-small fits one claim but not both
    devices = {n: a["devices"]["results"][0]["device"] for n, a in plan.allocations.items()}
    assert sorted(devices.values()) == ["gpu-0", "gpu-1"]


def test_node_selector_and_unsatisfiable_explanation() -> None:
    nodes = [_node("n1", zone="a"), _node("n2", zone="b")]
    slices = [_slice("n1", ["gpu-0"]), _slice("n2", ["gpu-0"])]
    plan = plan_pod({"spec": {"nodeSelector": {"zone": "b"}}}, [_claim("c")], nodes=nodes, classes=[CLASS], slices=slices, allocated_claims=[], namespace_labels={}, cel=CEL)
    assert plan.node == "n2"
    too_many = plan_pod({"spec": {}}, [_claim("c", count=3)], nodes=nodes, classes=[CLASS], slices=slices, allocated_claims=[], namespace_labels={}, cel=CEL)
    assert too_many.node is None
    # kube-scheduler's words (DynamicResources' Filter, FitError, DefaultPreemption); the allocator's reason stays
    # with the plan for `dra-driver explain`.
    assert too_many.explanation == (
        "0/2 nodes are available: 2 cannot allocate all claims. still not schedulable, preemption: 0/2 nodes are "
        "available: 2 Preemption is not helpful for scheduling."
    )
    assert too_many.device_reasons == {n: ("default/c", "request 'r': needs 3 devices, 1 available")
                                       for n in ("n1", "n2")}
    nowhere = plan_pod({"spec": {"nodeSelector": {"zone": "c"}}}, [_claim("c")], nodes=nodes, classes=[CLASS], slices=slices, allocated_claims=[], namespace_labels={}, cel=CEL)
    assert nowhere.explanation == (
        "0/2 nodes are available: 2 node(s) didn't match Pod's node affinity/selector. still not schedulable, "
        "preemption: 0/2 nodes are available: 2 Preemption is not helpful for scheduling."
    )


def test_an_allocated_claim_pins_the_pod_to_its_node() -> None:
    shared = _claim("shared")
    shared["status"] = {"allocation": {"nodeSelector": {"nodeSelectorTerms": [{"matchFields": [{"key": "metadata.name", "operator": "In", "values": ["n2"]}]}]}}}
    nodes = [_node("n1"), _node("n2")]
    plan = plan_pod({"spec": {}}, [shared], nodes=nodes, classes=[CLASS], slices=[], allocated_claims=[shared], namespace_labels={}, cel=CEL)
    assert plan.node == "n2" and plan.allocations == {}


def test_release_drops_gone_pods_and_deallocates_after_the_last() -> None:
    def claim(name: str, reserved: list[str]) -> dict[str, Any]:
        return {
            "metadata": {"name": name, "namespace": "default"},
            "status": {"allocation": {"devices": {}}, "reservedFor": [{"resource": "pods", "name": p, "uid": p} for p in reserved]},
        }

    both, last, unreserved = claim("both", ["p1", "p2"]), claim("last", ["p3"]), claim("never", [])
    changes = dict((c["metadata"]["name"], status) for c, status in release_plan([both, last, unreserved], live_pods={"p2"}))
    assert changes["both"]["reservedFor"] == [{"resource": "pods", "name": "p2", "uid": "p2"}]
    assert "allocation" in changes["both"]
    assert changes["last"] == {}  # deallocated: the last consumer is gone
    assert "never" not in changes  # allocated but never reserved: left alone
