"""The scheduler stand-in as kube-scheduler's default profile: NodeResourcesFit (extended resources no class maps,
cpu/memory, pods), DefaultPreemption's and the DRA plugin's PostFilter words, and the 1.35+ prioritized-list
score across nodes."""

from __future__ import annotations

from typing import Any

from dra_driver.cel.environment import DraCelEnvironment
from dra_driver.defaults import DRIVER_NAME
from dra_sandbox.kubelet.nodestatus import ready_node
from dra_sandbox.noderesources import NodeUsage, fits, pod_requests
from dra_sandbox.scheduler import (
    normalize_scores,
    num_feasible_nodes_to_find,
    parse_version_info,
    plan_pod,
    prioritized_list_score,
)
from tests.sandbox.test_scheduler import CLASS, _claim, _slice

CEL = DraCelEnvironment()
GPU_POD_MESSAGE = (
    "0/2 nodes are available: 2 Insufficient nvidia.com/gpu. no new claims to deallocate, preemption: 0/2 nodes are "
    "available: 2 Preemption is not helpful for scheduling."
)


def _pod(*containers: dict[str, Any], name: str = "p", **spec: Any) -> dict[str, Any]:
    return {"metadata": {"name": name, "namespace": "default", "uid": f"uid-{name}"},
            "spec": {"containers": list(containers), **spec}}


def _bound(name: str, node: str, **resources: str) -> dict[str, Any]:
    pod = _pod({"name": "c", "resources": {"requests": resources}}, name=name)
    pod["spec"]["nodeName"] = node
    pod["status"] = {"phase": "Running"}
    return pod


def _plan(pod: dict[str, Any], nodes: list[dict[str, Any]], claims: list[dict[str, Any]] | None = None,
          **kwargs: Any) -> Any:
    return plan_pod(pod, claims or [], nodes=nodes, classes=kwargs.pop("classes", [CLASS]),
                    slices=kwargs.pop("slices", []), allocated_claims=[], namespace_labels={}, cel=CEL, **kwargs)


def test_an_extended_resource_nobody_offers_keeps_the_pod_pending_with_kube_schedulers_words() -> None:
    nodes = [ready_node("node-a100"), ready_node("node-h100")]
    for field in ("limits", "requests"):
        pod = _pod({"name": "cuda", "resources": {field: {"nvidia.com/gpu": "2"}}})
        plan = _plan(pod, nodes)
        assert plan.node is None
        assert plan.explanation == GPU_POD_MESSAGE


def test_a_device_plugin_node_offering_the_resource_takes_the_pod_and_its_count_is_consumed() -> None:
    plugin = ready_node("node-b")
    plugin["status"]["allocatable"]["nvidia.com/gpu"] = "2"
    nodes = [ready_node("node-a"), plugin]
    pod = _pod({"name": "cuda", "resources": {"limits": {"nvidia.com/gpu": "2"}}})
    assert _plan(pod, nodes).node == "node-b"
    # Both GPUs taken by a running pod: this node is resolvable by preemption, but nobody has a lower priority.
    busy = _plan(pod, nodes, pods=[_bound("holder", "node-b", **{"nvidia.com/gpu": "2"})])
    assert busy.node is None
    assert busy.explanation == (
        "0/2 nodes are available: 2 Insufficient nvidia.com/gpu. no new claims to deallocate, preemption: 0/2 nodes "
        "are available: 1 No preemption victims found for incoming pod, 1 Preemption is not helpful for scheduling."
    )
    # A finished pod holds nothing.
    done = _bound("done", "node-b", **{"nvidia.com/gpu": "2"})
    done["status"]["phase"] = "Succeeded"
    assert _plan(pod, nodes, pods=[done]).node == "node-b"


def test_a_class_mapping_the_name_takes_the_dra_path_on_nodes_without_it() -> None:
    gpu_class = {**CLASS, "spec": {"extendedResourceName": "nvidia.com/gpu"}}
    pod = _pod({"name": "cuda", "resources": {"limits": {"nvidia.com/gpu": "1"}}})
    from dra_sandbox.scheduler import extended_requests

    plan = _plan(pod, [ready_node("n1")], classes=[gpu_class], slices=[_slice("n1", ["gpu-0"])],
                 extended=extended_requests(pod, [gpu_class]))
    assert plan.node == "n1" and plan.extended is not None


def test_cpu_memory_and_pod_count_as_node_resources_fit() -> None:
    nodes = [ready_node("n1"), ready_node("n2")]  # 16 cpu, 64Gi - 100Mi memory, 110 pods
    huge = _pod({"name": "c", "resources": {"requests": {"cpu": "17", "memory": "1Gi"}}})
    assert _plan(huge, nodes).explanation == (
        "0/2 nodes are available: 2 Insufficient cpu. no new claims to deallocate, preemption: 0/2 nodes are "
        "available: 2 Preemption is not helpful for scheduling."
    )
    half = _pod({"name": "c", "resources": {"requests": {"cpu": "9"}}})
    assert _plan(half, nodes, pods=[_bound("x", "n1", cpu="8")]).node == "n2"
    never = _pod({"name": "c", "resources": {"requests": {"memory": "100Gi"}}}, preemptionPolicy="Never")
    assert _plan(never, nodes).explanation.endswith(
        "2 Insufficient memory. no new claims to deallocate, preemption: not eligible due to preemptionPolicy=Never.")
    full = [_bound(f"p{i}", "n1") for i in range(110)]
    assert _plan(_pod({"name": "c"}), [ready_node("n1")], pods=full).explanation.startswith(
        "0/1 nodes are available: 1 Too many pods.")


def test_pod_requests_follow_init_containers_sidecars_and_limits() -> None:
    pod = _pod({"name": "a", "resources": {"requests": {"cpu": "500m"}}},
               {"name": "b", "resources": {"limits": {"cpu": "250m", "memory": "1Gi"}}},
               initContainers=[{"name": "i", "resources": {"requests": {"cpu": "2"}}},
                               {"name": "s", "restartPolicy": "Always", "resources": {"requests": {"cpu": "100m"}}}],
               overhead={"cpu": "10m"})
    # containers 750m + sidecar 100m = 850m; the init container alone needs 2000m; then the overhead.
    assert pod_requests(pod) == {"cpu": 2010, "memory": 1024**3}
    result = fits({"cpu": 100}, ready_node("n"), NodeUsage(pods=1, requested={"cpu": 15950}))
    assert result.reasons == ("Insufficient cpu",) and not result.unresolvable


def test_prioritized_list_score_prefers_the_node_of_the_first_subrequest() -> None:
    claim = _claim("c")
    claim["spec"]["devices"]["requests"] = [{"name": "gpu", "firstAvailable": [
        {"name": "l4", "deviceClassName": DRIVER_NAME, "selectors": [{"cel": {"expression": "device.attributes['"
                                                                              f"{DRIVER_NAME}'].model == 'L4'"}}]},
        {"name": "h100", "deviceClassName": DRIVER_NAME, "selectors": [{"cel": {"expression": "device.attributes['"
                                                                                f"{DRIVER_NAME}'].model == 'H100'"}}]},
    ]}]

    def slice_of(node: str, model: str) -> dict[str, Any]:
        body = _slice(node, ["gpu-0"])
        body["spec"]["devices"][0]["attributes"] = {"model": {"string": model}}
        return body

    nodes = [ready_node("a-h100"), ready_node("b-l4")]
    slices = [slice_of("a-h100", "H100"), slice_of("b-l4", "L4")]
    plan = _plan(_pod(), nodes, [claim], slices=slices)
    assert plan.node == "b-l4"
    assert plan.allocations["c"]["devices"]["results"][0]["request"] == "gpu/l4"
    # 1.34 has no DRA score: the first feasible node by name wins, with the lower-ranked subrequest.
    old = _plan(_pod(), nodes, [claim], slices=slices, kube_version=(1, 34))
    assert old.node == "a-h100"
    assert old.allocations["c"]["devices"]["results"][0]["request"] == "gpu/h100"
    # Only where nothing better fits anywhere is the H100 taken.
    assert _plan(_pod(), nodes, [claim], slices=[slice_of("a-h100", "H100")]).node == "a-h100"
    assert prioritized_list_score([claim], {"c": {"devices": {"results": [{"request": "gpu/h100"}]}}}) == 7


def test_scoring_helpers_match_upstream_numbers() -> None:
    assert normalize_scores([8, 7, 0]) == [100, 87, 0]
    assert normalize_scores([0, 0]) == [0, 0]
    assert num_feasible_nodes_to_find(99) == 99
    assert num_feasible_nodes_to_find(1000) == 420  # 50 - 1000/125 = 42 %
    assert num_feasible_nodes_to_find(5000) == 500  # 10 %, at least 100
    assert parse_version_info({"major": "1", "minor": "36+"}) == (1, 36)


def test_no_nodes_at_all() -> None:
    assert _plan(_pod(), []).explanation == "no nodes available to schedule pods"
