"""The ValidatingAdmissionPolicy that narrows the plugin's `patch nodes` to its own Node's owned keys.

RBAC grants the plugin's service account `patch` on every Node (a role cannot name "the node I run on"); the
policy `<plugin>-own-node` lets it change only the Node its token is bound to, and there only the driver-state
annotation (and, with compute domains, the compute-domain plugin's two labels). The rendered CEL is evaluated as
the API server applies it (tests/chart/test_admission_policy.py's `admit`), for the bodies the product's patches
produce and for the ones an attacker's would.
"""

from __future__ import annotations

from typing import Any

import pytest

from dra_driver.computedomain.names import DOMAIN_LABEL, GPU_CLIQUE_LABEL
from dra_driver.nvidiadriver.state import NODE_ANNOTATION
from dra_sandbox.apiserver.patch import merge_patch
from tests.chart.helm import Helm
from tests.chart.test_admission_policy import NAMESPACE, RELEASE, admit, daemonset_username, named, request

ANNOTATION_DENIED = f"the kubelet plugin may change only the annotation {NODE_ANNOTATION} of its Node"
LABELS_DENIED = f"the kubelet plugin may change only the labels {DOMAIN_LABEL}, {GPU_CLIQUE_LABEL} of its Node"
SPEC_DENIED = (
    "the kubelet plugin may not change its Node's spec (taints, unschedulable, podCIDR, ...), finalizers or owner "
    "references"
)


def node(name: str = "node-1", **meta: Any) -> dict[str, Any]:
    """A Node as the API server holds it: labels and annotations others wrote, and a spec."""
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {
            "name": name,
            "labels": {"kubernetes.io/hostname": name, "node-role.kubernetes.io/gpu": ""},
            "annotations": {"node.alpha.kubernetes.io/ttl": "0"},
            **meta,
        },
        "spec": {"podCIDR": "10.0.1.0/24", "taints": [{"key": "gpu", "value": "true", "effect": "NoSchedule"}]},
    }


def patched(old: dict[str, Any], change: dict[str, Any]) -> dict[str, Any]:
    """`old` after a JSON merge patch (RFC 7386), as the API server hands it to admission."""
    result: dict[str, Any] = merge_patch(old, change)
    return result


@pytest.fixture(scope="module")
def rendered(helm: Helm) -> list[dict[str, Any]]:
    return helm.render(release=RELEASE, namespace=NAMESPACE)


def judge(
    objects: list[dict[str, Any]], obj: dict[str, Any], old: dict[str, Any], caller: str | None = "node-1"
) -> list[str]:
    policy = named(objects, "ValidatingAdmissionPolicy", "-own-node")
    applies, failures = admit(
        policy, request(daemonset_username(objects, NAMESPACE), "UPDATE", caller), obj, old, resource="nodes"
    )
    assert applies
    return failures


def test_binding_denies_through_the_node_policy(rendered: list[dict[str, Any]]) -> None:
    policy = named(rendered, "ValidatingAdmissionPolicy", "-own-node")
    binding = named(rendered, "ValidatingAdmissionPolicyBinding", "-own-node")
    assert binding["spec"]["policyName"] == policy["metadata"]["name"]
    assert binding["spec"]["validationActions"] == ["Deny"] and policy["spec"]["failurePolicy"] == "Fail"
    [rule] = policy["spec"]["matchConstraints"]["resourceRules"]
    assert (rule["apiGroups"], rule["resources"], rule["operations"]) == ([""], ["nodes"], ["UPDATE"])


def test_the_plugins_own_patches_are_admitted(rendered: list[dict[str, Any]]) -> None:
    """The bodies plugin/driverreport.py and computedomain/plugin/domains.py send, applied to the Node."""
    old = node()
    assert judge(rendered, patched(old, {"metadata": {"annotations": {NODE_ANNOTATION: "ready"}}}), old) == []
    annotated = patched(old, {"metadata": {"annotations": {NODE_ANNOTATION: "ready"}}})
    changed = patched(annotated, {"metadata": {"annotations": {NODE_ANNOTATION: "not-ready: driver unloaded"}}})
    assert judge(rendered, changed, annotated) == []
    assert judge(rendered, patched(annotated, {"metadata": {"annotations": {NODE_ANNOTATION: None}}}), annotated) == []
    for label in (DOMAIN_LABEL, GPU_CLIQUE_LABEL):
        labelled = patched(old, {"metadata": {"labels": {label: "0f1e"}, "resourceVersion": "7"}})
        assert judge(rendered, labelled, old) == [], label
        assert judge(rendered, patched(labelled, {"metadata": {"labels": {label: None}}}), labelled) == [], label


def test_a_node_without_labels_or_annotations_can_get_its_own(rendered: list[dict[str, Any]]) -> None:
    bare = {"apiVersion": "v1", "kind": "Node", "metadata": {"name": "node-1"}, "spec": {}}
    assert judge(rendered, patched(bare, {"metadata": {"annotations": {NODE_ANNOTATION: "ready"}}}), bare) == []
    assert judge(rendered, patched(bare, {"metadata": {"labels": {DOMAIN_LABEL: "u"}}}), bare) == []
    assert judge(rendered, patched(bare, {"metadata": {"labels": {"evil": "1"}}}), bare) == [
        "the kubelet plugin may change only the labels "
        f"{DOMAIN_LABEL}, {GPU_CLIQUE_LABEL} of its Node"
    ]


def test_another_nodes_node_is_refused(rendered: list[dict[str, Any]]) -> None:
    old = node("node-2")
    new = patched(old, {"metadata": {"annotations": {NODE_ANNOTATION: "ready"}}})
    assert judge(rendered, new, old) == ["the kubelet plugin on node node-1 may only change its own Node, not node-2"]


def test_a_token_without_a_node_is_refused(rendered: list[dict[str, Any]]) -> None:
    old = node()
    new = patched(old, {"metadata": {"annotations": {NODE_ANNOTATION: "ready"}}})
    failures = judge(rendered, new, old, caller=None)
    assert len(failures) == 2 and "not bound to a node" in failures[0]
    assert failures[1] == "the kubelet plugin on node  may only change its own Node, not node-1"


@pytest.mark.parametrize(
    ("change", "expected"),
    [
        ({"metadata": {"labels": {"node-role.kubernetes.io/gpu": None}}}, LABELS_DENIED),  # removed
        ({"metadata": {"labels": {"kubernetes.io/hostname": "node-9"}}}, LABELS_DENIED),  # changed
        ({"metadata": {"labels": {"nvidia.com/gpu.present": "true"}}}, LABELS_DENIED),  # added
        ({"metadata": {"annotations": {"node.alpha.kubernetes.io/ttl": None}}}, ANNOTATION_DENIED),
        ({"metadata": {"annotations": {"gpu.dra.dev/other": "x"}}}, ANNOTATION_DENIED),
        ({"spec": {"taints": None}}, SPEC_DENIED),  # un-tainting the node
        ({"spec": {"unschedulable": True}}, SPEC_DENIED),
        ({"metadata": {"finalizers": ["example.com/hold"]}}, SPEC_DENIED),
        ({"metadata": {"ownerReferences": [{"apiVersion": "v1", "kind": "Pod", "name": "p", "uid": "u"}]}}, SPEC_DENIED),
    ],
)
def test_anything_else_on_its_own_node_is_refused(
    rendered: list[dict[str, Any]], change: dict[str, Any], expected: str
) -> None:
    old = node()
    # Sent together with a legitimate change, as an attacker would hide it.
    body = patched(change, {"metadata": {"annotations": {NODE_ANNOTATION: "ready"}}})
    assert judge(rendered, patched(old, body), old) == [expected]


def test_without_compute_domains_no_label_may_change(helm: Helm) -> None:
    off = helm.render(["computeDomains.enabled=false"], release=RELEASE, namespace=NAMESPACE)
    old = node()
    assert judge(off, patched(old, {"metadata": {"labels": {DOMAIN_LABEL: "u"}}}), old) == [
        "the kubelet plugin may not change the labels of its Node"
    ]
    assert judge(off, patched(old, {"metadata": {"annotations": {NODE_ANNOTATION: "ready"}}}), old) == []


def test_other_users_are_not_affected(rendered: list[dict[str, Any]]) -> None:
    policy = named(rendered, "ValidatingAdmissionPolicy", "-own-node")
    old = node("node-2")
    new = patched(old, {"spec": {"taints": None}, "metadata": {"labels": {"x": "y"}}})
    for user in ("system:node:node-2", "system:admin", f"system:serviceaccount:{NAMESPACE}:other"):
        assert admit(policy, request(user, "UPDATE", None), new, old, resource="nodes") == (False, []), user
