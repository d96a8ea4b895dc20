"""The node lifecycle controller: a kubelet that stops renewing its Lease turns its Node Unknown and unreachable-tainted
after the grace period, the scheduler stand-in then refuses the node, and a kubelet that comes back gets it back."""

from __future__ import annotations

from typing import Any

from dra_sandbox.apiserver import ApiServer
from dra_sandbox.kubelet.nodestatus import EXAMPLE_RESOURCES, NodeStatusConfig, NodeStatusReporter, ready_node
from dra_sandbox.nodelifecycle import (
    NODE_MONITOR_GRACE_PERIOD_S,
    UNKNOWN_MESSAGE,
    UNKNOWN_REASON,
    NodeHealth,
    NodeLifecycleController,
    controller_taints,
    observe,
    plan_node,
    wanted_taints,
)
from tests.polling import wait_for
from tests.sandbox.test_scheduler_fit import _plan, _pod

GRACE = 1.0


def _conditions(node: dict[str, Any]) -> dict[str, tuple[str, str, str]]:
    return {c["type"]: (c["status"], c.get("reason", ""), c.get("message", "")) for c in node["status"]["conditions"]}


def test_the_default_grace_period_is_upstreams() -> None:
    assert NODE_MONITOR_GRACE_PERIOD_S == 50.0  # PR 126287, 1.32+


def test_a_node_past_the_grace_period_turns_unknown_and_unreachable() -> None:
    node = ready_node("n", now=1000.0)
    health = observe(None, node, {"spec": {"renewTime": "2025-01-01T00:00:00.000000Z"}}, now=10.0)
    assert plan_node(node, health, now=10.0 + NODE_MONITOR_GRACE_PERIOD_S, wall=2000.0,
                     grace_s=NODE_MONITOR_GRACE_PERIOD_S).conditions is None  # not past it yet
    update = plan_node(node, health, now=10.0 + NODE_MONITOR_GRACE_PERIOD_S + 0.1, wall=2000.0,
                       grace_s=NODE_MONITOR_GRACE_PERIOD_S)
    assert update.conditions is not None
    changed = {c["type"]: c for c in update.conditions}
    for kind in ("Ready", "MemoryPressure", "DiskPressure", "PIDPressure"):
        assert (changed[kind]["status"], changed[kind]["reason"], changed[kind]["message"]) == (
            "Unknown", UNKNOWN_REASON, UNKNOWN_MESSAGE)
        assert changed[kind]["lastHeartbeatTime"] == "1970-01-01T00:16:40Z"  # kept
        assert changed[kind]["lastTransitionTime"] == "1970-01-01T00:33:20Z"
    assert update.taints == [{"key": "node.kubernetes.io/unreachable", "effect": "NoSchedule"},
                             {"key": "node.kubernetes.io/unreachable", "effect": "NoExecute",
                              "timeAdded": "1970-01-01T00:33:20Z"}]
    # A renewed Lease is a new probe time.
    renewed = observe(health, node, {"spec": {"renewTime": "2025-01-01T00:00:10.000000Z"}}, now=70.0)
    assert renewed.probe == 70.0
    assert observe(renewed, node, {"spec": {"renewTime": "2025-01-01T00:00:10.000000Z"}}, now=80.0) is renewed


def test_taints_follow_conditions_and_cordoning() -> None:
    node = ready_node("n", now=1.0)
    assert wanted_taints(node, 5.0) is None
    node["spec"] = {"unschedulable": True, "taints": [{"key": "mine", "effect": "NoSchedule"}]}
    assert wanted_taints(node, 5.0) == [{"key": "mine", "effect": "NoSchedule"},
                                        {"key": "node.kubernetes.io/unschedulable", "effect": "NoSchedule"}]
    for condition in node["status"]["conditions"]:
        if condition["type"] == "Ready":
            condition["status"] = "False"
    node["spec"] = {"taints": [{"key": "node.kubernetes.io/unreachable", "effect": "NoExecute"}]}
    assert wanted_taints(node, 5.0) == [{"key": "node.kubernetes.io/not-ready", "effect": "NoSchedule"},
                                        {"key": "node.kubernetes.io/not-ready", "effect": "NoExecute",
                                         "timeAdded": "1970-01-01T00:00:05Z"}]
    assert plan_node(node, NodeHealth(probe=0.0), now=1.0, wall=5.0, grace_s=GRACE).conditions is None


def test_a_stopped_kubelet_loses_its_node_and_gets_it_back() -> None:
    with ApiServer(kube_version="1.35.0") as srv:
        options = NodeStatusConfig(resources=EXAMPLE_RESOURCES, lease_renew_s=0.05)
        kubelet = NodeStatusReporter("node-a", srv.api_client(), "cdi-check", options)
        kubelet.start()
        controller = NodeLifecycleController(srv.rest(), grace_period_s=GRACE, monitor_period_s=0.05)
        controller.start()
        rest = srv.rest()
        try:
            node = wait_for(lambda: rest.get("/api/v1/nodes/node-a"), 10.0, "the node registered")
            assert _plan(_pod({"name": "c"}), [node]).node == "node-a"
            kubelet.stop()
            def tainted() -> dict[str, Any] | None:
                found = rest.get("/api/v1/nodes/node-a")
                return found if found is not None and controller_taints(found) else None

            def untainted() -> dict[str, Any] | None:
                found = rest.get("/api/v1/nodes/node-a")
                return found if found is not None and not found["spec"].get("taints") else None

            node = wait_for(tainted, 10.0, "the node tainted unreachable")
            assert _conditions(node)["Ready"] == ("Unknown", UNKNOWN_REASON, UNKNOWN_MESSAGE)
            assert [(t["key"], t["effect"]) for t in node["spec"]["taints"]] == [
                ("node.kubernetes.io/unreachable", "NoSchedule"), ("node.kubernetes.io/unreachable", "NoExecute")]
            plan = _plan(_pod({"name": "c"}), [node])
            assert plan.node is None
            assert plan.explanation.startswith("0/1 nodes are available: 1 node(s) had untolerated taint(s).")
            # The kubelet comes back: it posts Ready, the controller lifts the taints.
            kubelet = NodeStatusReporter("node-a", srv.api_client(), "cdi-check", options)
            kubelet.start()
            node = wait_for(untainted, 10.0, "the taints lifted")
            assert _conditions(node)["Ready"][0] == "True"
            assert _plan(_pod({"name": "c"}), [node]).node == "node-a"
        finally:
            controller.stop()
            kubelet.stop()
