"""The scheduler stand-in's node filters in kube-scheduler's order (NodeUnschedulable, TaintToleration, NodeAffinity,
NodeResourcesFit, DynamicResources), their reasons in the FitError, and all claims of a pod in one search."""

from __future__ import annotations

from typing import Any

import pytest

from dra_driver.allocation.model import parse_node
from dra_driver.allocation.nodes import node_selector_matches
from dra_sandbox.kubelet.nodestatus import ready_node
from dra_sandbox.nodefilters import node_affinity_prefilter, tolerates
from tests.sandbox.test_scheduler import _claim, _slice
from tests.sandbox.test_scheduler_fit import _plan, _pod

NOT_HELPFUL_2 = "no new claims to deallocate, preemption: 0/2 nodes are available: 2 Preemption is not helpful for " \
                "scheduling."


def _node(name: str, *, labels: dict[str, str] | None = None, **spec: Any) -> dict[str, Any]:
    node = ready_node(name, labels=labels)
    node["spec"] = {**node.get("spec", {}), **spec}
    return node


def _with(pod: dict[str, Any], **spec: Any) -> dict[str, Any]:
    return {**pod, "spec": {**pod["spec"], **spec}}


POD = _pod({"name": "c"})
NO_SCHEDULE = {"key": "dedicated", "value": "gpu", "effect": "NoSchedule"}


def test_a_cordoned_node_is_skipped_unless_the_pod_tolerates_unschedulable() -> None:
    nodes = [_node("a", unschedulable=True), _node("b", unschedulable=True)]
    plan = _plan(POD, nodes)
    assert plan.node is None
    assert plan.explanation == f"0/2 nodes are available: 2 node(s) were unschedulable. {NOT_HELPFUL_2}"
    tolerant = _with(POD, tolerations=[{"key": "node.kubernetes.io/unschedulable", "operator": "Exists",
                                         "effect": "NoSchedule"}])
    assert _plan(tolerant, nodes).node == "a"
    # A NoExecute-only toleration does not cover the NoSchedule taint cordoning stands for.
    wrong = _with(POD, tolerations=[{"key": "node.kubernetes.io/unschedulable", "operator": "Exists",
                                      "effect": "NoExecute"}])
    assert _plan(wrong, nodes).node is None


def test_untolerated_taints_keep_the_pod_off_the_node() -> None:
    nodes = [_node("a", taints=[NO_SCHEDULE]), _node("b")]
    assert _plan(POD, nodes).node == "b"
    both = [_node("a", taints=[NO_SCHEDULE]), _node("b", taints=[{"key": "x", "effect": "NoExecute"}])]
    plan = _plan(POD, both)
    assert plan.node is None
    assert plan.explanation == f"0/2 nodes are available: 2 node(s) had untolerated taint(s). {NOT_HELPFUL_2}"
    # PreferNoSchedule only scores; it never filters.
    assert _plan(POD, [_node("a", taints=[{"key": "k", "effect": "PreferNoSchedule"}])]).node == "a"


@pytest.mark.parametrize(("toleration", "expected"), [
    ({"key": "dedicated", "operator": "Equal", "value": "gpu", "effect": "NoSchedule"}, True),
    ({"key": "dedicated", "value": "gpu"}, True),  # empty operator is Equal, empty effect matches all
    ({"key": "dedicated", "operator": "Equal", "value": "cpu"}, False),
    ({"key": "dedicated", "operator": "Exists"}, True),
    ({"operator": "Exists"}, True),  # empty key with Exists tolerates everything
    ({"key": "dedicated", "operator": "Exists", "effect": "NoExecute"}, False),
    ({"key": "other", "operator": "Exists"}, False),
    ({"key": "dedicated", "operator": "Gt", "value": "1"}, False),  # alpha operators are off
])
def test_toleration_matching_follows_core_v1(toleration: dict[str, str], expected: bool) -> None:
    assert tolerates(toleration, NO_SCHEDULE) is expected
    assert (_plan(_with(POD, tolerations=[toleration]), [_node("a", taints=[NO_SCHEDULE])]).node == "a") is expected


def _affinity(*terms: dict[str, Any]) -> dict[str, Any]:
    return {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": list(terms)}}}


def test_required_node_affinity_matches_expressions() -> None:
    nodes = [_node("a", labels={"gpu": "h100", "rank": "5"}), _node("b", labels={"gpu": "l4", "rank": "12"})]
    cases: list[tuple[dict[str, Any], str | None]] = [
        ({"matchExpressions": [{"key": "gpu", "operator": "In", "values": ["l4"]}]}, "b"),
        ({"matchExpressions": [{"key": "gpu", "operator": "NotIn", "values": ["h100"]}]}, "b"),
        ({"matchExpressions": [{"key": "gpu", "operator": "Exists"}]}, "a"),
        ({"matchExpressions": [{"key": "gpu", "operator": "DoesNotExist"}]}, None),
        ({"matchExpressions": [{"key": "rank", "operator": "Gt", "values": ["10"]}]}, "b"),
        ({"matchExpressions": [{"key": "rank", "operator": "Lt", "values": ["10"]}]}, "a"),
        ({"matchExpressions": [{"key": "gpu", "operator": "In", "values": []}]}, None),  # does not parse
        ({}, None),  # an empty term matches nothing
    ]
    for term, expected in cases:
        plan = _plan(_with(POD, affinity=_affinity(term)), nodes)
        assert plan.node == expected, term
        if expected is None:
            assert plan.explanation.startswith("0/2 nodes are available: 2 node(s) didn't match Pod's node "
                                               "affinity/selector."), term
    # Terms are ORed.
    either = _affinity({"matchExpressions": [{"key": "gpu", "operator": "In", "values": ["none"]}]},
                       {"matchExpressions": [{"key": "gpu", "operator": "In", "values": ["l4"]}]})
    assert _plan(_with(POD, affinity=either), nodes).node == "b"
    # nodeSelector and affinity must both hold.
    both = _with(POD, nodeSelector={"gpu": "h100"}, affinity=_affinity(
        {"matchExpressions": [{"key": "rank", "operator": "Gt", "values": ["10"]}]}))
    assert _plan(both, nodes).node is None


def test_gt_and_lt_take_only_base_10_int64_labels() -> None:
    node = parse_node(_node("a", labels={"rank": "1_0"}))
    gt = {"nodeSelectorTerms": [{"matchExpressions": [{"key": "rank", "operator": "Gt", "values": ["1"]}]}]}
    assert not node_selector_matches(gt, node)  # strconv.ParseInt refuses '_' where Python's int() takes it
    assert node_selector_matches(gt, parse_node(_node("a", labels={"rank": "+5"})))


def test_match_fields_metadata_name_narrows_the_nodes_as_the_prefilter_does() -> None:
    nodes = [_node("a"), _node("b", taints=[NO_SCHEDULE])]
    pinned = _with(POD, affinity=_affinity({"matchFields": [{"key": "metadata.name", "operator": "In",
                                                             "values": ["b"]}]}))
    plan = _plan(pinned, nodes)
    assert plan.node is None
    assert plan.explanation == ("0/2 nodes are available: 1 node(s) didn't satisfy plugin(s) [NodeAffinity], 1 node(s) "
                                f"had untolerated taint(s). {NOT_HELPFUL_2}")
    assert _plan(_with(pinned, tolerations=[{"operator": "Exists"}]), nodes).node == "b"
    not_in = _with(POD, affinity=_affinity({"matchFields": [{"key": "metadata.name", "operator": "NotIn",
                                                             "values": ["a"]}]}))
    assert _plan(not_in, [_node("a"), _node("b")]).node == "b"


def test_conflicting_name_terms_fail_in_the_prefilter() -> None:
    term = {"matchFields": [{"key": "metadata.name", "operator": "In", "values": ["a"]},
                            {"key": "metadata.name", "operator": "In", "values": ["b"]}]}
    pod = _with(POD, affinity=_affinity(term))
    assert node_affinity_prefilter(pod).conflict
    plan = _plan(pod, [_node("a"), _node("b")])
    assert plan.node is None
    assert plan.explanation == f"0/2 nodes are available: pod affinity terms conflict. {NOT_HELPFUL_2}"


def test_filters_run_in_kube_schedulers_order() -> None:
    # A cordoned, tainted node that also misses the selector reports only NodeUnschedulable's reason.
    nodes = [_node("a", unschedulable=True, taints=[NO_SCHEDULE]), _node("b", taints=[NO_SCHEDULE])]
    plan = _plan(_with(POD, nodeSelector={"x": "y"}), nodes)
    assert plan.explanation == ("0/2 nodes are available: 1 node(s) had untolerated taint(s), 1 node(s) were "
                                f"unschedulable. {NOT_HELPFUL_2}")


def test_a_pods_claims_are_allocated_together_with_backtracking() -> None:
    # claim-a takes any device, claim-b only gpu-0: claim after claim, claim-a would take gpu-0 and claim-b fail;
    # as upstream's allocator, the search moves claim-a to gpu-1.
    picky = _claim("claim-b")
    picky["spec"]["devices"]["requests"][0]["exactly"]["selectors"] = [
        {"cel": {"expression": 'device.attributes["gpu.dra.dev"].type == "gpu" && device.attributes["gpu.dra.dev"]'
                               '.index == 0'}}]
    slice_ = _slice("n1", ["gpu-0", "gpu-1"])
    for i, dev in enumerate(slice_["spec"]["devices"]):
        dev["attributes"]["index"] = {"int": i}
    plan = _plan(_pod({"name": "c"}), [_node("n1")], [_claim("claim-a"), picky], slices=[slice_])
    assert plan.node == "n1"
    devices = {name: [r["device"] for r in alloc["devices"]["results"]] for name, alloc in plan.allocations.items()}
    assert devices == {"claim-a": ["gpu-1"], "claim-b": ["gpu-0"]}
    # Three claims for two devices: the claim that cannot be served is named.
    plan = _plan(_pod({"name": "c"}), [_node("n1")], [_claim("claim-a"), _claim("claim-b"), _claim("claim-c")],
                 slices=[slice_])
    assert plan.node is None
    assert plan.explanation.startswith("0/1 nodes are available: 1 cannot allocate all claims.")
    claim, reason = plan.device_reasons["n1"]
    assert claim == "default/claim-c" and reason.startswith("claim claim-c: ")
