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
from celpy.adapter import json_to_cel
from celpy.evaluation import CELEvalError

from dra_driver.defaults import DRIVER_NAME
from tests.chart.helm import VALUE_SETS, Helm, of_component, one

NODE_KEY = "authentication.kubernetes.io/node-name"
RELEASE, NAMESPACE = "accel-gpus", "gpu-operators"


def evaluate(expression: str, activation: dict[str, Any]) -> Any:
    env = celpy.Environment()
    program = env.program(env.compile(expression))
    # `variables` holds values CEL already computed: converting them again would turn a BoolType into an IntType.
    result = program.evaluate({
        name: celpy.celtypes.MapType({celpy.celtypes.StringType(k): v for k, v in value.items()})
        if name == "variables" else json_to_cel(value)
        for name, value in activation.items()
    })
    if isinstance(result, CELEvalError):
        raise AssertionError(f"CEL error in {expression!r}: {result}")
    return result


def holds(expression: str, activation: dict[str, Any]) -> bool:
    """A condition or validation: must evaluate to a CEL bool (the API server rejects anything else)."""
    result = evaluate(expression, activation)
    assert isinstance(result, celpy.celtypes.BoolType), f"{expression!r} gave {result!r}, not a bool"
    return bool(result)


def admit(
    policy: dict[str, Any], request: dict[str, Any], obj: Any, old: Any, resource: str = "resourceslices"
) -> tuple[bool, list[str]]:
    """(policy applies, messages of failed validations) - the API server's order: match, variables, validate."""
    base = {"request": request, "object": obj, "oldObject": old}
    spec = policy["spec"]
    rules = spec["matchConstraints"]["resourceRules"]
    if not any(request["operation"] in r["operations"] and resource in r["resources"] for r in rules):
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


def slice_on(node: str, driver: str = DRIVER_NAME, *, pool: str | None = None, name: str = "") -> dict[str, Any]:
    """A slice of `node`; its pool is named after the node (as the plugin does) unless `pool` says otherwise."""
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceSlice",
        "metadata": {"name": name or f"{node}-gpu-dra-dev-x7k2p"},
        "spec": {
            "nodeName": node,
            "driver": driver,
            "pool": {"name": pool if pool is not None else node, "generation": 1, "resourceSliceCount": 1},
        },
    }


def named(objects: list[dict[str, Any]], kind: str, suffix: str) -> dict[str, Any]:
    """The one object of `kind` whose name ends in `suffix` (the chart has a policy for slices and one for Nodes)."""
    [found] = [o for o in objects if o["kind"] == kind and o["metadata"]["name"].endswith(suffix)]
    return found


def slices_policy(objects: list[dict[str, Any]]) -> dict[str, Any]:
    return named(objects, "ValidatingAdmissionPolicy", "-own-node-slices")


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
    policy = slices_policy(objects)
    [condition] = policy["spec"]["matchConditions"]
    parsed = re.fullmatch(r"request\.userInfo\.username == '([^']+)'", condition["expression"].strip())
    assert parsed, condition["expression"]
    assert parsed.group(1) == daemonset_username(objects, namespace)
    accounts = [o for o in of_component(objects) if o["kind"] == "ServiceAccount"]
    if "serviceAccount.create=false" not in sets:  # the account the chart creates is the one both name
        assert [(a["metadata"]["namespace"], a["metadata"]["name"]) for a in accounts] == [
            tuple(parsed.group(1).split(":")[2:])
        ]


def test_binding_denies_through_this_policy(rendered: list[dict[str, Any]]) -> None:
    policy = slices_policy(rendered)
    binding = named(rendered, "ValidatingAdmissionPolicyBinding", "-own-node-slices")
    assert binding["spec"]["policyName"] == policy["metadata"]["name"]
    assert binding["spec"]["validationActions"] == ["Deny"]
    assert policy["spec"]["failurePolicy"] == "Fail"
    assert policy["apiVersion"] == binding["apiVersion"] == "admissionregistration.k8s.io/v1"
    [rule] = policy["spec"]["matchConstraints"]["resourceRules"]
    assert sorted(rule["operations"]) == ["CREATE", "DELETE", "UPDATE"]


NODE_NAME_DENIED = "the kubelet plugin on node node-1 may only write ResourceSlices whose spec.nodeName is node-1"
OLD_DENIED = (
    "the kubelet plugin on node node-1 may only change or delete ResourceSlices of its own node and pool (node-1)"
)


def pool_denied(pool: str) -> str:
    return f"the kubelet plugin on node node-1 may only write ResourceSlices whose spec.pool.name is node-1, not {pool}"


def judge(rendered: list[dict[str, Any]], operation: str, obj: Any, old: Any, node: str | None = "node-1") -> list[str]:
    """Messages of the failed validations for a request of the DaemonSet's service account."""
    policy = slices_policy(rendered)
    applies, failures = admit(policy, request(daemonset_username(rendered, NAMESPACE), operation, node), obj, old)
    assert applies
    return failures


def test_plugin_may_write_its_own_nodes_slices(rendered: list[dict[str, Any]]) -> None:
    own = slice_on("node-1")
    assert judge(rendered, "CREATE", own, None) == []
    assert judge(rendered, "UPDATE", own, slice_on("node-1")) == []
    assert judge(rendered, "DELETE", None, own) == []


def test_slice_names_are_not_pinned(rendered: list[dict[str, Any]]) -> None:
    """A name that looks like another node's is admitted: the plugin creates its slices with generateName and
    finds them by their fields, so no name can be squatted (tests/slices/test_publisher.py shows it)."""
    assert judge(rendered, "CREATE", slice_on("node-1", name="node-2-gpu-dra-dev-0"), None) == []


@pytest.mark.parametrize("operation", ["CREATE", "UPDATE", "DELETE"])
def test_plugin_may_not_write_another_nodes_slices(rendered: list[dict[str, Any]], operation: str) -> None:
    other = slice_on("node-2")
    obj, old = (None, other) if operation == "DELETE" else (other, other if operation == "UPDATE" else None)
    expected = {
        "CREATE": [NODE_NAME_DENIED, pool_denied("node-2")],
        "UPDATE": [NODE_NAME_DENIED, pool_denied("node-2"), OLD_DENIED],
        "DELETE": [OLD_DENIED],
    }[operation]
    assert judge(rendered, operation, obj, old) == expected


@pytest.mark.parametrize("operation", ["CREATE", "UPDATE", "DELETE"])
def test_plugin_may_not_use_another_nodes_pool_name(rendered: list[dict[str, Any]], operation: str) -> None:
    """Its own nodeName but node-2's pool name (with a higher generation this would hide node-2's devices)."""
    squat = slice_on("node-1", pool="node-2")
    obj, old = (None, squat) if operation == "DELETE" else (squat, squat if operation == "UPDATE" else None)
    expected = {
        "CREATE": [pool_denied("node-2")],
        "UPDATE": [pool_denied("node-2"), OLD_DENIED],
        "DELETE": [OLD_DENIED],
    }[operation]
    assert judge(rendered, operation, obj, old) == expected


def test_updates_may_not_move_a_slice_between_nodes_or_pools(rendered: list[dict[str, Any]]) -> None:
    assert judge(rendered, "UPDATE", slice_on("node-2"), slice_on("node-1")) == [
        NODE_NAME_DENIED,
        pool_denied("node-2"),
    ]
    assert judge(rendered, "UPDATE", slice_on("node-1"), slice_on("node-2")) == [OLD_DENIED]  # taking one over
    assert judge(rendered, "UPDATE", slice_on("node-1", pool="p"), slice_on("node-1")) == [pool_denied("p")]


def test_token_without_node_and_foreign_driver_are_denied(rendered: list[dict[str, Any]]) -> None:
    failures = judge(rendered, "CREATE", slice_on("node-1"), None, node=None)
    assert len(failures) == 3 and "not bound to a node" in failures[0]  # and neither node nor pool match ''
    assert judge(rendered, "DELETE", None, slice_on("node-1"), node=None)[1:] == [
        "the kubelet plugin on node  may only change or delete ResourceSlices of its own node and pool ()"
    ]
    foreign = ("the kubelet plugin may only write ResourceSlices of its own drivers gpu.dra.dev and "
               "compute-domain.gpu.dra.dev, not other.example.com")
    assert judge(rendered, "CREATE", slice_on("node-1", "other.example.com"), None) == [foreign]
    assert judge(rendered, "DELETE", None, slice_on("node-1", "other.example.com")) == [foreign]


def test_the_compute_domain_plugin_may_write_its_own_nodes_slices_only_when_enabled(
        rendered: list[dict[str, Any]], helm: Helm) -> None:
    """The pod's second container (computeDomains.enabled, the default) publishes compute-domain.gpu.dra.dev slices
    under the same service account: own node and pool still, and no other driver; without it, only the GPU driver."""
    cd = "compute-domain.gpu.dra.dev"
    assert judge(rendered, "CREATE", slice_on("node-1", cd), None) == []
    assert judge(rendered, "UPDATE", slice_on("node-1", cd), slice_on("node-1", cd)) == []
    assert judge(rendered, "CREATE", slice_on("node-2", cd), None) != []
    off = helm.render(["computeDomains.enabled=false"], release=RELEASE, namespace=NAMESPACE)
    assert judge(off, "CREATE", slice_on("node-1", cd), None) == [
        f"the kubelet plugin may only write ResourceSlices of its own driver gpu.dra.dev, not {cd}"]


def test_other_users_are_not_affected(rendered: list[dict[str, Any]]) -> None:
    policy = slices_policy(rendered)
    for user in (
        "system:serviceaccount:gpu-operators:accel-gpus-dra-driver-service-account",  # NVIDIA's mismatch
        f"system:serviceaccount:default:{one(of_component(rendered), 'ServiceAccount')['metadata']['name']}",  # other namespace
        "system:admin",
        "system:kube-scheduler",
    ):
        for operation, obj, old in (
            ("CREATE", slice_on("node-9", pool="node-2"), None),
            ("UPDATE", slice_on("node-9"), slice_on("node-2")),
            ("DELETE", None, slice_on("node-2")),
        ):
            assert admit(policy, request(user, operation, None), obj, old) == (False, []), (user, operation)
