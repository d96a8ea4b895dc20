"""The kubelet's pod admission (`pkg/kubelet/lifecycle/predicate.go`): a pod placed on a node by hand that does not
fit is rejected with upstream's reason and message; the checks are the scheduler stand-in's filters."""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from typing import Any

import pytest
from kubernetes import client as k8s

from dra_sandbox.kubelet.admission import ADMITTED, admit, rejected_status, without_missing_extended_resources
from tests.polling import wait_for
from tests.sandbox.test_kubelet_fakeplugin import short_tmpdir
from tests.sandbox.test_kubelet_pods import Cluster

MERGE = "application/merge-patch+json"


def _node(allocatable: dict[str, str] | None = None, taints: list[dict[str, str]] | None = None,
          labels: dict[str, str] | None = None) -> dict[str, Any]:
    return {
        "metadata": {"name": "n1", "labels": {"kubernetes.io/os": "linux", **(labels or {})}},
        "spec": {"taints": taints or []},
        "status": {"allocatable": allocatable or {"cpu": "2", "memory": "4Gi", "pods": "110"}},
    }


def _pod(requests: dict[str, str] | None = None, **spec: Any) -> dict[str, Any]:
    container: dict[str, Any] = {"name": "main", "image": "probe"}
    if requests:
        container["resources"] = {"requests": requests, "limits": dict(requests)}
    return {"metadata": {"name": "p", "namespace": "default"},
            "spec": {"nodeName": "n1", "containers": [container], **spec}}


def test_a_pod_that_fits_is_admitted() -> None:
    assert admit(_pod({"cpu": "1", "memory": "1Gi"}), _node(), []) == ADMITTED


def test_too_much_cpu_is_out_of_cpu_with_the_kubelets_numbers() -> None:
    verdict = admit(_pod({"cpu": "1500m"}), _node(), [_pod({"cpu": "1"})])
    assert (verdict.admit, verdict.reason) == (False, "OutOfcpu")
    assert verdict.message == "Node didn't have enough resource: cpu, requested: 1500, used: 1000, capacity: 2000"
    assert rejected_status(verdict) == {
        "phase": "Failed", "reason": "OutOfcpu",
        "message": "Pod was rejected: Node didn't have enough resource: cpu, requested: 1500, used: 1000, "
                   "capacity: 2000",
    }


def test_an_offered_extended_resource_is_checked_and_one_the_node_lacks_is_not() -> None:
    node = _node({"cpu": "2", "memory": "4Gi", "pods": "110", "nvidia.com/gpu": "1"})
    verdict = admit(_pod({"nvidia.com/gpu": "2"}), node, [])
    assert (verdict.reason, verdict.message) == (
        "OutOfnvidia.com/gpu", "Node didn't have enough resource: nvidia.com/gpu, requested: 2, used: 0, capacity: 1")
    # removeMissingExtendedResources: upstream's own caveat, a name the node does not list passes admission.
    assert admit(_pod({"example.com/fpga": "3"}), node, []) == ADMITTED
    stripped = without_missing_extended_resources(_pod({"example.com/fpga": "3", "cpu": "1"}), node)
    assert stripped["spec"]["containers"][0]["resources"]["requests"] == {"cpu": "1"}


def test_the_pod_count_is_out_of_pods() -> None:
    node = _node({"cpu": "2", "memory": "4Gi", "pods": "1"})
    verdict = admit(_pod(), node, [_pod()])
    assert (verdict.reason, verdict.message) == (
        "OutOfpods", "Node didn't have enough resource: pods, requested: 1, used: 1, capacity: 1")


def test_resources_come_before_affinity_and_only_the_first_failure_is_reported() -> None:
    verdict = admit(_pod({"memory": "8Gi"}, nodeSelector={"gpu": "h100"}), _node(), [])
    assert verdict.reason == "OutOfmemory"
    verdict = admit(_pod(nodeSelector={"gpu": "h100"}), _node(), [])
    assert (verdict.reason, verdict.message) == (
        "NodeAffinity", "Predicate NodeAffinity failed: node(s) didn't match Pod's node affinity/selector")
    assert admit(_pod(nodeSelector={"gpu": "h100"}), _node(labels={"gpu": "h100"}), []) == ADMITTED


def test_required_node_affinity_is_checked() -> None:
    affinity = {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
        {"matchExpressions": [{"key": "zone", "operator": "In", "values": ["a"]}]}]}}}
    assert admit(_pod(affinity=affinity), _node(labels={"zone": "b"}), []).reason == "NodeAffinity"
    assert admit(_pod(affinity=affinity), _node(labels={"zone": "a"}), []) == ADMITTED


def test_only_an_untolerated_no_execute_taint_rejects() -> None:
    no_execute = {"key": "gpu", "value": "broken", "effect": "NoExecute"}
    verdict = admit(_pod(), _node(taints=[no_execute]), [])
    assert (verdict.reason, verdict.message) == (
        "TaintToleration", "Predicate TaintToleration failed: node(s) had taints that the pod didn't tolerate")
    # NoSchedule only keeps the scheduler away; a hand-placed pod runs.
    assert admit(_pod(), _node(taints=[{"key": "gpu", "effect": "NoSchedule"}]), []) == ADMITTED
    tolerated = _pod(tolerations=[{"key": "gpu", "operator": "Exists", "effect": "NoExecute"}])
    assert admit(tolerated, _node(taints=[no_execute]), []) == ADMITTED


def test_host_ports_taken_by_an_admitted_pod() -> None:
    def with_port(port: int, ip: str = "") -> dict[str, Any]:
        pod = _pod()
        pod["spec"]["containers"][0]["ports"] = [{"containerPort": 80, "hostPort": port, "hostIP": ip}]
        return pod

    verdict = admit(with_port(8080), _node(), [with_port(8080, "10.0.0.1")])
    assert (verdict.reason, verdict.message) == (
        "NodePorts", "Predicate NodePorts failed: node(s) didn't have free ports for the requested pod ports")
    assert admit(with_port(8081), _node(), [with_port(8080)]) == ADMITTED
    assert admit(with_port(8080, "10.0.0.2"), _node(), [with_port(8080, "10.0.0.1")]) == ADMITTED


def test_os_checks_come_first() -> None:
    pod = _pod({"cpu": "100"})
    pod["metadata"]["labels"] = {"kubernetes.io/os": "windows"}
    assert admit(pod, _node(), []).reason == "PodOSSelectorNodeLabelDoesNotMatch"
    assert admit(_pod(os={"name": "windows"}), _node(), []).reason == "PodOSNotSupported"


@pytest.fixture
def node_cluster(api: k8s.ApiClient) -> Iterator[Cluster]:
    base = short_tmpdir()
    c = Cluster(api, base)
    c.kubelet.start()
    yield c
    c.kubelet.stop()
    c.plugin.stop()
    shutil.rmtree(base, ignore_errors=True)


def _create(c: Cluster, name: str, containers: list[dict[str, Any]], **spec: Any) -> None:
    c.core.create_namespaced_pod(c.ns, k8s.V1Pod.model_validate({
        "apiVersion": "v1", "kind": "Pod", "metadata": {"name": name},
        "spec": {"nodeName": c.node, "restartPolicy": "Never", "containers": containers, **spec}}))


def test_the_kubelet_rejects_a_hand_placed_pod_that_does_not_fit(node_cluster: Cluster) -> None:
    c = node_cluster
    big, fine = c.name("big"), c.name("fine")
    _create(c, big, [{"name": "main", "image": "probe", "resources": {"requests": {"cpu": "100000"}}}])
    _create(c, fine, [{"name": "main", "image": "probe",
                       "resources": {"limits": {"example.com/fpga": "1"}}}])  # not offered: not checked
    wait_for(lambda: c.phase(big) == "Failed", what="the oversized pod rejected")
    status = c.read_pod(big).status
    assert status.reason == "OutOfcpu"
    assert status.message.startswith(
        "Pod was rejected: Node didn't have enough resource: cpu, requested: 100000000, used: 0, capacity: ")
    events = [e for e in c.core.list_namespaced_event(c.ns).items if e.involved_object.name == big]
    assert events and events[0].reason == "OutOfcpu" and events[0].type == "Warning"
    wait_for(lambda: c.phase(fine) == "Succeeded", what="the pod asking for an unlisted resource runs")


def test_the_kubelet_rejects_a_pod_that_does_not_tolerate_a_no_execute_taint(node_cluster: Cluster) -> None:
    c = node_cluster
    c.core.patch_node(c.node, {"spec": {"taints": [{"key": "gpu", "value": "broken", "effect": "NoExecute"}]}},
                      _content_type=MERGE)
    name = c.name("tainted")
    _create(c, name, [{"name": "main", "image": "probe"}])
    wait_for(lambda: c.phase(name) == "Failed", what="the pod rejected")
    status = c.read_pod(name).status
    assert (status.reason, status.message) == (
        "TaintToleration",
        "Pod was rejected: Predicate TaintToleration failed: node(s) had taints that the pod didn't tolerate")


def test_new_pods_get_the_default_toleration_seconds(node_cluster: Cluster) -> None:
    """DefaultTolerationSeconds: so the kubelet admits pods on a node the lifecycle controller tainted."""
    c = node_cluster
    plain, own = c.name("plain"), c.name("own")
    _create(c, plain, [{"name": "main", "image": "probe"}])
    _create(c, own, [{"name": "main", "image": "probe"}],
            tolerations=[{"key": "node.kubernetes.io/unreachable", "operator": "Exists", "effect": "NoExecute",
                          "tolerationSeconds": 5}])
    got = [(t.key, t.effect, t.toleration_seconds) for t in c.read_pod(plain).spec.tolerations]
    assert got == [("node.kubernetes.io/not-ready", "NoExecute", 300), ("node.kubernetes.io/unreachable", "NoExecute",
                                                                        300)]
    mine = [(t.key, t.toleration_seconds) for t in c.read_pod(own).spec.tolerations]
    assert mine == [("node.kubernetes.io/unreachable", 5), ("node.kubernetes.io/not-ready", 300)]
