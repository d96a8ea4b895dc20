"""The ValidatingAdmissionPolicy guards exactly the service account the DaemonSet runs as.

NVIDIA's chart names one account in its policy and runs the plugin as another, so its policy never
matches. Here the rendered CEL is parsed AND evaluated (with cel-python, emulating how the API server
applies matchConditions, variables and validations) for a non-default release name and namespace.
"""

from __future__ import annotations

import re
from typing import Any

import celpy
import pytest

from tests.chart.helm import VALUE_SETS, Helm, one

NODE_KEY = "authentication.kubernetes.io/node-name"
RELEASE, NAMESPACE = "accel-gpus", "gpu-operators"


def evaluate(expression: str, activation: dict[str, Any]) -> Any:
    env = celpy.Environment()
    program = env.program(env.compile(expression))
    result = program.evaluate({name: celpy.json_to_cel(value) for name, value in activation.items()})
    if isinstance(result, celpy.CELEvalError):
        raise AssertionError(f"CEL error in {expression!r}: {result}")
    return result


def holds(expression: str, activation: dict[str, Any]) -> bool:
    """A condition or validation: must evaluate to a CEL bool (the API server rejects anything else)."""
    result = evaluate(expression, activation)
    assert isinstance(result, celpy.celtypes.BoolType), f"{expression!r} gave {result!r}, not a bool"
    return bool(result)


def admit(policy: dict[str, Any], request: dict[str, Any], obj: Any, old: Any) -> tuple[bool, list[str]]:
    """(policy applies, messages of failed validations) - the API server's order: match, variables, validate."""
    base = {"request": request, "object": obj, "oldObject": old}
    spec = policy["spec"]
    rules = spec["matchConstraints"]["resourceRules"]
    if not any(request["operation"] in r["operations"] and "resourceslices" in r["resources"] for r in rules):
        return False, []
    if not all(holds(c["expression"], base) for c in spec.get("matchConditions", [])):
        return False, []
    variables: dict[str, Any] = {}
    for variable in spec.get("variables", []):
        value = evaluate(variable["expression"], {**base, "variables": variables})
        variables[variable["name"]] = value
    failures = []
    for validation in spec["validations"]:
        activation = {**base, "variables": variables}
        if not holds(validation["expression"], activation):
            if "messageExpression" in validation:
                failures.append(str(evaluate(validation["messageExpression"], activation)))
            else:
                failures.append(validation["message"])
    return True, failures


def request(username: str, operation: str, node: str | None) -> dict[str, Any]:
    extra = {NODE_KEY: [node]} if node is not None else {}
    return {"operation": operation, "userInfo": {"username": username, "extra": extra}}


def slice_on(node: str, driver: str = "gpu.dra.dev") -> dict[str, Any]:
    return {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceSlice", "spec": {"nodeName": node, "driver": driver}}


@pytest.fixture(scope="module")
def rendered(helm: Helm) -> list[dict[str, Any]]:
    return helm.render(release=RELEASE, namespace=NAMESPACE)


def daemonset_username(objects: list[dict[str, Any]], namespace: str) -> str:
    account = one(objects, "DaemonSet")["spec"]["template"]["spec"]["serviceAccountName"]
    return f"system:serviceaccount:{namespace}:{account}"


@pytest.mark.parametrize(
    ("sets", "release", "namespace"),
    [
        ((), RELEASE, NAMESPACE),
        ((), "dra", "kube-system"),
        (("fullnameOverride=gpu",), "x", "gpu"),
        (VALUE_SETS["existing-service-account"], RELEASE, NAMESPACE),
    ],
)
def test_match_condition_names_the_daemonset_service_account(
    helm: Helm, sets: tuple[str, ...], release: str, namespace: str
) -> None:
    objects = helm.render(sets, release=release, namespace=namespace)
    policy = one(objects, "ValidatingAdmissionPolicy")
    [condition] = policy["spec"]["matchConditions"]
    parsed = re.fullmatch(r"request\.userInfo\.username == '([^']+)'", condition["expression"].strip())
    assert parsed, condition["expression"]
    assert parsed.group(1) == daemonset_username(objects, namespace)
    accounts = [o for o in objects if o["kind"] == "ServiceAccount"]
    if "serviceAccount.create=false" not in sets:  # the account the chart creates is the one both name
        assert [(a["metadata"]["namespace"], a["metadata"]["name"]) for a in accounts] == [
            tuple(parsed.group(1).split(":")[2:])
        ]


def test_binding_denies_through_this_policy(rendered: list[dict[str, Any]]) -> None:
    policy = one(rendered, "ValidatingAdmissionPolicy")
    binding = one(rendered, "ValidatingAdmissionPolicyBinding")
    assert binding["spec"]["policyName"] == policy["metadata"]["name"]
    assert binding["spec"]["validationActions"] == ["Deny"]
    assert policy["spec"]["failurePolicy"] == "Fail"
    assert policy["apiVersion"] == binding["apiVersion"] == "admissionregistration.k8s.io/v1"
    [rule] = policy["spec"]["matchConstraints"]["resourceRules"]
    assert sorted(rule["operations"]) == ["CREATE", "DELETE", "UPDATE"]


def test_plugin_may_write_its_own_nodes_slices(rendered: list[dict[str, Any]]) -> None:
    policy = one(rendered, "ValidatingAdmissionPolicy")
    user = daemonset_username(rendered, NAMESPACE)
    for operation in ("CREATE", "UPDATE"):
        old = slice_on("node-1") if operation == "UPDATE" else None
        assert admit(policy, request(user, operation, "node-1"), slice_on("node-1"), old) == (True, [])
    assert admit(policy, request(user, "DELETE", "node-1"), None, slice_on("node-1")) == (True, [])


@pytest.mark.parametrize("operation", ["CREATE", "UPDATE", "DELETE"])
def test_plugin_may_not_write_another_nodes_slices(rendered: list[dict[str, Any]], operation: str) -> None:
    policy = one(rendered, "ValidatingAdmissionPolicy")
    user = daemonset_username(rendered, NAMESPACE)
    other = slice_on("node-2")
    obj, old = (None, other) if operation == "DELETE" else (other, other if operation == "UPDATE" else None)
    applies, failures = admit(policy, request(user, operation, "node-1"), obj, old)
    assert applies
    assert failures == ["the kubelet plugin on node node-1 may only write ResourceSlices whose spec.nodeName is node-1"]


def test_token_without_node_and_foreign_driver_are_denied(rendered: list[dict[str, Any]]) -> None:
    policy = one(rendered, "ValidatingAdmissionPolicy")
    user = daemonset_username(rendered, NAMESPACE)
    applies, failures = admit(policy, request(user, "CREATE", None), slice_on("node-1"), None)
    assert applies and len(failures) == 2 and "not bound to a node" in failures[0]
    applies, failures = admit(policy, request(user, "CREATE", "node-1"), slice_on("node-1", "other.example.com"), None)
    assert applies and failures == [
        "the kubelet plugin may only write ResourceSlices of its own driver gpu.dra.dev, not other.example.com"
    ]


def test_other_users_are_not_affected(rendered: list[dict[str, Any]]) -> None:
    policy = one(rendered, "ValidatingAdmissionPolicy")
    for user in (
        "system:serviceaccount:gpu-operators:accel-gpus-dra-driver-service-account",  # NVIDIA's mismatch
        f"system:serviceaccount:default:{one(rendered, 'ServiceAccount')['metadata']['name']}",  # other namespace
        "system:admin",
        "system:kube-scheduler",
    ):
        assert admit(policy, request(user, "CREATE", None), slice_on("node-9"), None) == (False, []), user
