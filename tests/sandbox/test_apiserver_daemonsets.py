"""The sandbox API server's DaemonSet controller (kube-controller-manager's daemon controller, reduced): one pod per
eligible node pinned by `matchFields metadata.name`, node label and taint changes add and remove pods, the status
counters, rolling updates, validation with upstream's messages, and deletion cascading to the pods."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from dra_driver.k8s.client import ApiError, KubeRest
from dra_sandbox.apiserver import ApiServer
from tests.polling import wait_for

NS = "default"
DS_PATH = f"/apis/apps/v1/namespaces/{NS}/daemonsets"


@pytest.fixture()
def rest() -> Iterator[KubeRest]:
    with ApiServer() as srv:
        yield srv.rest()


def node(rest: KubeRest, name: str, labels: dict[str, str] | None = None,
         taints: list[dict[str, str]] | None = None) -> None:
    body: dict[str, Any] = {"apiVersion": "v1", "kind": "Node", "metadata": {"name": name, "labels": labels or {}}}
    if taints:
        body["spec"] = {"taints": taints}
    rest.request("POST", "/api/v1/nodes", body=body)


def patch_node(rest: KubeRest, name: str, patch: dict[str, Any]) -> None:
    rest.request("PATCH", f"/api/v1/nodes/{name}", body=patch, content_type="application/merge-patch+json")


def daemon_set(name: str = "agent", node_selector: dict[str, str] | None = None, **spec: Any) -> dict[str, Any]:
    pod_spec: dict[str, Any] = {"containers": [{"name": "c", "image": "busybox"}]}
    if node_selector:
        pod_spec["nodeSelector"] = node_selector
    return {"apiVersion": "apps/v1", "kind": "DaemonSet", "metadata": {"name": name, "namespace": NS},
            "spec": {"selector": {"matchLabels": {"app": name}},
                     "template": {"metadata": {"labels": {"app": name}}, "spec": pod_spec}, **spec}}


def pods(rest: KubeRest, live: bool = True) -> list[dict[str, Any]]:
    items = rest.request("GET", f"/api/v1/namespaces/{NS}/pods")["items"]
    return [p for p in items if not (live and p["metadata"].get("deletionTimestamp"))]


def pinned_node(pod: dict[str, Any]) -> str:
    terms = pod["spec"]["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
    (term,) = terms["nodeSelectorTerms"]
    assert set(term) == {"matchFields"}
    (req,) = term["matchFields"]
    assert (req["key"], req["operator"]) == ("metadata.name", "In")
    (value,) = req["values"]
    return str(value)


def nodes_with_pods(rest: KubeRest) -> list[str]:
    return sorted(pinned_node(p) for p in pods(rest))


def status(rest: KubeRest, name: str = "agent") -> dict[str, Any]:
    return dict(rest.request("GET", f"{DS_PATH}/{name}").get("status") or {})


def set_ready(rest: KubeRest, pod: dict[str, Any], ready: bool) -> None:
    cond = {"type": "Ready", "status": "True" if ready else "False", "lastTransitionTime": "2026-01-01T00:00:00Z"}
    rest.request("PATCH", f"/api/v1/namespaces/{NS}/pods/{pod['metadata']['name']}/status",
                 body={"status": {"phase": "Running", "conditions": [cond]}},
                 content_type="application/merge-patch+json")


def test_one_pod_per_selected_node_follows_label_changes(rest: KubeRest) -> None:
    node(rest, "a", {"role": "gpu"})
    node(rest, "b", {"role": "gpu"})
    node(rest, "c", {"role": "cpu"})
    rest.request("POST", DS_PATH, body=daemon_set(node_selector={"role": "gpu"}))
    wait_for(lambda: nodes_with_pods(rest) == ["a", "b"], what="pods on a and b")
    pod = pods(rest)[0]
    labels = pod["metadata"]["labels"]
    assert labels["app"] == "agent" and labels["pod-template-generation"] == "1" and labels["controller-revision-hash"]
    ref = pod["metadata"]["ownerReferences"][0]
    assert (ref["kind"], ref["name"], ref["controller"], ref["blockOwnerDeletion"]) == ("DaemonSet", "agent", True, True)
    assert pod["metadata"]["name"].startswith("agent-")
    tolerated = {(t["key"], t["effect"]) for t in pod["spec"]["tolerations"]}
    assert ("node.kubernetes.io/unschedulable", "NoSchedule") in tolerated
    assert ("node.kubernetes.io/not-ready", "NoExecute") in tolerated
    assert "nodeName" not in pod["spec"]  # the scheduler binds it (matchFields pins the node)
    wait_for(lambda: status(rest).get("desiredNumberScheduled") == 2, what="status")
    st = status(rest)
    assert (st["currentNumberScheduled"], st["numberMisscheduled"], st["numberReady"]) == (2, 0, 0)
    assert st["updatedNumberScheduled"] == 2 and st["numberUnavailable"] == 2 and st["observedGeneration"] == 1
    # A node gains the label: a pod for it. A node loses it: its pod goes.
    patch_node(rest, "c", {"metadata": {"labels": {"role": "gpu"}}})
    wait_for(lambda: nodes_with_pods(rest) == ["a", "b", "c"], what="pod on c")
    patch_node(rest, "a", {"metadata": {"labels": {"role": None}}})
    wait_for(lambda: nodes_with_pods(rest) == ["b", "c"], what="pod on a deleted")
    wait_for(lambda: status(rest).get("desiredNumberScheduled") == 2 and status(rest)["currentNumberScheduled"] == 2,
             what="counters after churn")


def test_ready_and_available_counts_and_cascade(rest: KubeRest) -> None:
    node(rest, "a")
    node(rest, "b")
    rest.request("POST", DS_PATH, body=daemon_set())
    wait_for(lambda: len(pods(rest)) == 2, what="two pods")
    set_ready(rest, pods(rest)[0], True)
    wait_for(lambda: status(rest).get("numberReady") == 1, what="one ready")
    st = status(rest)
    assert (st["numberAvailable"], st["numberUnavailable"]) == (1, 1)
    rest.request("DELETE", f"{DS_PATH}/agent")
    wait_for(lambda: not pods(rest, live=False), what="pods deleted with the DaemonSet")


def test_taints_and_tolerations_decide_as_upstream(rest: KubeRest) -> None:
    node(rest, "free")
    node(rest, "nosched", taints=[{"key": "k", "value": "v", "effect": "NoSchedule"}])
    node(rest, "cordoned")
    patch_node(rest, "cordoned", {"spec": {"unschedulable": True}})
    rest.request("POST", DS_PATH, body=daemon_set())
    # The unschedulable taint is tolerated by every daemon pod; the untolerated NoSchedule taint keeps one off.
    wait_for(lambda: nodes_with_pods(rest) == ["cordoned", "free"], what="pods on free and cordoned")
    # A NoSchedule taint added later leaves the running pod alone (shouldContinueRunning)...
    patch_node(rest, "free", {"spec": {"taints": [{"key": "k", "value": "v", "effect": "NoSchedule"}]}})
    wait_for(lambda: status(rest).get("desiredNumberScheduled") == 1, what="free no longer desired")
    assert nodes_with_pods(rest) == ["cordoned", "free"]
    assert status(rest)["numberMisscheduled"] == 1
    # ...an untolerated NoExecute taint evicts it.
    patch_node(rest, "free", {"spec": {"taints": [{"key": "k", "value": "v", "effect": "NoExecute"}]}})
    wait_for(lambda: nodes_with_pods(rest) == ["cordoned"], what="NoExecute removes the pod")
    # A toleration in the template lets the pod onto the tainted nodes.
    ds = rest.request("GET", f"{DS_PATH}/agent")
    ds["spec"]["template"]["spec"]["tolerations"] = [{"key": "k", "operator": "Exists"}]
    rest.request("PUT", f"{DS_PATH}/agent", body=ds)
    wait_for(lambda: nodes_with_pods(rest) == ["cordoned", "free", "nosched"], what="tolerating pods")


def test_failed_pod_is_replaced_and_duplicates_keep_the_oldest(rest: KubeRest) -> None:
    node(rest, "a")
    rest.request("POST", DS_PATH, body=daemon_set())
    first = wait_for(lambda: p[0] if len(p := pods(rest)) == 1 else None, what="a pod")
    rest.request("PATCH", f"/api/v1/namespaces/{NS}/pods/{first['metadata']['name']}/status",
                 body={"status": {"phase": "Failed"}}, content_type="application/merge-patch+json")
    wait_for(lambda: [p["metadata"]["name"] for p in pods(rest)] not in ([], [first["metadata"]["name"]]),
             what="a replacement")
    assert all(p["metadata"]["name"] != first["metadata"]["name"] for p in pods(rest))


def test_rolling_update_replaces_pods_of_the_old_template(rest: KubeRest) -> None:
    node(rest, "a")
    node(rest, "b")
    rest.request("POST", DS_PATH, body=daemon_set())
    wait_for(lambda: len(pods(rest)) == 2, what="two pods")
    for pod in pods(rest):
        set_ready(rest, pod, True)
    old = {p["metadata"]["name"] for p in pods(rest)}
    ds = rest.request("GET", f"{DS_PATH}/agent")
    ds["spec"]["template"]["spec"]["containers"][0]["image"] = "busybox:2"
    rest.request("PUT", f"{DS_PATH}/agent", body=ds)
    # maxUnavailable 1: one old pod goes; its replacement must become ready before the second is replaced.
    wait_for(lambda: len(old & {p["metadata"]["name"] for p in pods(rest)}) == 1, what="one old pod replaced")
    new = [p for p in pods(rest) if p["metadata"]["name"] not in old]
    assert len(new) == 1 and new[0]["spec"]["containers"][0]["image"] == "busybox:2"
    assert len(old & {p["metadata"]["name"] for p in pods(rest)}) == 1
    set_ready(rest, new[0], True)
    wait_for(lambda: not old & {p["metadata"]["name"] for p in pods(rest)}, what="second old pod replaced")
    wait_for(lambda: status(rest).get("observedGeneration") == 2 and status(rest).get("updatedNumberScheduled") == 2,
             what="updated counters")


@pytest.mark.parametrize(("change", "message"), [
    ({"selector": {"matchLabels": {"app": "other"}}}, "spec.template.metadata.labels: Invalid value: "),
    ({"selector": {}}, "spec.selector: Invalid value: {}: empty selector is invalid for daemonset"),
    ({"updateStrategy": {"type": "Surge"}},
     'spec.updateStrategy: Unsupported value: {"type": "Surge"}: supported values: "RollingUpdate", "OnDelete"'),
    ({"updateStrategy": {"type": "RollingUpdate", "rollingUpdate": {"maxUnavailable": 0, "maxSurge": 0}}},
     "spec.updateStrategy.rollingUpdate.maxUnavailable: Required value: cannot be 0 when maxSurge is 0"),
    ({"minReadySeconds": -1}, "spec.minReadySeconds: Invalid value: -1: must be greater than or equal to 0"),
])
def test_validation_refuses_as_upstream(rest: KubeRest, change: dict[str, Any], message: str) -> None:
    body = daemon_set()
    body["spec"].update(change)
    with pytest.raises(ApiError) as info:
        rest.request("POST", DS_PATH, body=body)
    assert info.value.status == 422 and message in str(info.value)


def test_restart_policy_must_be_always_and_selector_is_immutable(rest: KubeRest) -> None:
    body = daemon_set()
    body["spec"]["template"]["spec"]["restartPolicy"] = "Never"
    with pytest.raises(ApiError) as info:
        rest.request("POST", DS_PATH, body=body)
    assert 'spec.template.spec.restartPolicy: Unsupported value: "Never": supported values: "Always"' in str(info.value)
    rest.request("POST", DS_PATH, body=daemon_set())
    ds = rest.request("GET", f"{DS_PATH}/agent")
    assert ds["spec"]["updateStrategy"] == {"type": "RollingUpdate",
                                            "rollingUpdate": {"maxUnavailable": 1, "maxSurge": 0}}
    assert ds["spec"]["revisionHistoryLimit"] == 10
    ds["spec"]["selector"] = {"matchLabels": {"app": "agent", "x": "y"}}
    ds["spec"]["template"]["metadata"]["labels"]["x"] = "y"
    with pytest.raises(ApiError) as info:
        rest.request("PUT", f"{DS_PATH}/agent", body=ds)
    assert "spec.selector: Invalid value: " in str(info.value) and "field is immutable" in str(info.value)
