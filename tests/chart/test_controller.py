"""The chart's controller: the CRD it ships is the one the product generates, the Deployment runs
`dra-driver controller` with flags the real parser accepts, and its ClusterRole grants exactly what the
controller's code and kopf send."""

from __future__ import annotations

from typing import Any

import pytest
import yaml

from dra_driver.commands import controller as controller_command
from dra_driver.commands.flags import FlagParser, apply_env_defaults
from dra_driver.policy.crd import crd_yaml, custom_resource_definition
from tests.chart.helm import CHART, Helm, by_kind, of_component, one
from tests.chart.test_rbac import CONTROLLER_FILES, Rule, code_calls, derived_rules, granted, rule_of

# What kopf itself sends (not in our code): its watch and annotation patches of the policies, CRD discovery,
# and events about the policies.
KOPF_RULES: set[Rule] = {
    ("gpu.dra.dev", "gpusharingpolicies", "list"),
    ("gpu.dra.dev", "gpusharingpolicies", "watch"),
    ("gpu.dra.dev", "gpusharingpolicies", "patch"),
    ("gpu.dra.dev", "gpusharingpolicies/status", "patch"),
    ("apiextensions.k8s.io", "customresourcedefinitions", "list"),
    ("apiextensions.k8s.io", "customresourcedefinitions", "watch"),
    ("", "events", "create"),
}


# The ComputeDomain reconciler (computeDomains.enabled): its code, and what it needs beyond that code: kopf's
# wake-up watch of the domains, and the Events it records with the product's recorder (k8s/events.py: create, then
# patch of a repeated series). Its roles are the `-compute-domains` ones (templates/computedomains.yaml).
CD_FILES = ("dra_driver/controller/computedomains/",)
CD_EXTRA_RULES: set[Rule] = {
    ("gpu.dra.dev", "computedomains", "list"),
    ("gpu.dra.dev", "computedomains", "watch"),
    ("", "events", "create"),
    ("", "events", "patch"),
}


def controller(objects: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The policy controller's own objects (the ComputeDomain roles: test_compute_domains.py and below)."""
    return [o for o in of_component(objects, "controller") if not o["metadata"]["name"].endswith("-compute-domains")]


def controller_rules(compute_domains: bool) -> set[Rule]:
    """What the controller's code and kopf send, with or without the ComputeDomain reconciler."""
    calls = [c for c in code_calls(CONTROLLER_FILES) if compute_domains or not c.where.startswith(CD_FILES)]
    rules = {r for c in calls if (r := rule_of(c.method, c.path)) is not None} | KOPF_RULES
    return rules | CD_EXTRA_RULES if compute_domains else rules


def test_the_chart_ships_the_generated_crd(helm: Helm) -> None:
    assert (CHART / "crds/gpusharingpolicies.yaml").read_text() == crd_yaml()
    shown = [d for d in yaml.safe_load_all(helm.run("show", "crds", str(CHART)).stdout) if d]
    # (The ComputeDomain CRDs are hand-written: tests/chart/test_compute_domains.py holds them to the model.)
    assert [d for d in shown if d["spec"]["group"] == "gpu.dra.dev" and d["spec"]["names"]["kind"].startswith(
        "GpuSharing")] == [custom_resource_definition()]
    assert sorted(d["metadata"]["name"] for d in shown) == [
        "computedomaincliques.gpu.dra.dev", "computedomains.gpu.dra.dev", "gpusharingpolicies.gpu.dra.dev"]


def test_the_controller_code_calls_only_deviceclasses_and_stale_slices() -> None:
    assert derived_rules(CONTROLLER_FILES) == {
        ("resource.k8s.io", "deviceclasses", "get"),
        ("resource.k8s.io", "deviceclasses", "create"),
        ("resource.k8s.io", "deviceclasses", "update"),
        ("resource.k8s.io", "resourceslices", "delete"),  # hygiene.py
        ("", "nodes", "get"),  # hygiene.py
        # operator.feeds (informer.py): the view behind status counts and slice hygiene, a paged LIST then a watch
        *((group, resource, verb) for group, resource in (("resource.k8s.io", "resourceslices"),
                                                           ("resource.k8s.io", "resourceclaims"), ("", "nodes"))
          for verb in ("list", "watch")),
        ("coordination.k8s.io", "leases", "get"),  # leader.py
        ("coordination.k8s.io", "leases", "create"),
        ("coordination.k8s.io", "leases", "update"),
        ("gpu.dra.dev", "gpusharingpolicies/status", "patch"),  # operator.py: the counts daemon
        # computedomains/loop.py (docs/compute-domains.md "The controller")
        ("gpu.dra.dev", "computedomains", "list"),
        ("gpu.dra.dev", "computedomains", "patch"),  # the finalizer
        ("gpu.dra.dev", "computedomains/status", "patch"),
        *(("gpu.dra.dev", "computedomaincliques", v) for v in ("list", "get", "update", "delete")),
        *(("resource.k8s.io", "resourceclaimtemplates", v) for v in ("get", "create", "patch", "delete")),
        *(("apps", "daemonsets", v) for v in ("get", "create", "update", "delete")),
        ("", "pods", "list"),
        ("", "nodes", "list"),
        ("", "nodes", "patch"),  # the gpu.dra.dev/computeDomain label
        ("resource.k8s.io", "resourceclaims/status", "patch"),  # binding conditions
        ("resource.k8s.io", "resourceslices", "list"),  # a waiting channel's clique
    }


LEASE_RULES: set[Rule] = {("coordination.k8s.io", "leases", v) for v in ("get", "create", "update")}


@pytest.mark.parametrize(("sets", "without"), [((), set()), (("controller.replicas=1",
                                                             "controller.leaderElection.enabled=false"), LEASE_RULES),
                                               (("computeDomains.enabled=false",), set())])
def test_the_role_grants_exactly_the_code_and_kopf(helm: Helm, sets: tuple[str, ...], without: set[Rule]) -> None:
    """Nothing of kopf's peering (kopf.dev clusterkopfpeerings) in either mode: the Lease is the one HA mechanism,
    and a standalone replica gets no Lease rights either; without ComputeDomains none of their rights."""
    objects = helm.render(sets)
    assert granted(objects, "controller") == controller_rules("computeDomains.enabled=false" not in sets) - without
    binding = one(controller(objects), "ClusterRoleBinding")
    account = one(controller(objects), "ServiceAccount")
    pod = one(controller(objects), "Deployment")["spec"]["template"]["spec"]
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": account["metadata"]["name"],
                                    "namespace": "dra-system"}]
    assert pod["serviceAccountName"] == account["metadata"]["name"]
    assert binding["roleRef"]["name"] == one(controller(objects), "ClusterRole")["metadata"]["name"]


def test_deployment_runs_the_controller_with_flags_the_parser_accepts(helm: Helm) -> None:
    deployment = one(controller(helm.render(["driverName=gpu.example.com", "computeDomains.enabled=false"])), "Deployment")
    assert deployment["spec"]["replicas"] == 2
    assert "strategy" not in deployment["spec"]  # leader election: a rolling update is safe
    [container] = deployment["spec"]["template"]["spec"]["containers"]
    assert container["command"] == ["dra-driver", "controller"]
    assert container["image"].startswith("dra-driver:")
    env = {e["name"]: e["value"] for e in container["env"] if "value" in e}
    parser = FlagParser()
    controller_command.add_arguments(parser)
    apply_env_defaults(parser, env)
    args = parser.parse_args(container["args"])
    assert args.driver_name == "gpu.example.com"
    assert (args.healthz_port, args.resync_interval) == (8080, 60.0)
    assert not any(name.endswith("PEERING") or name == "POD_ID" for name in env), env  # no kopf peering
    assert (args.leader_elect, args.lease_name, args.lease_duration) == (True, deployment["metadata"]["name"], 15.0)
    assert args.metrics_port == 8081
    pod_env = {e["name"]: e.get("valueFrom", {}).get("fieldRef", {}).get("fieldPath") for e in container["env"]}
    assert pod_env["POD_NAME"] == "metadata.name" and pod_env["POD_NAMESPACE"] == "metadata.namespace"
    for probe in ("livenessProbe", "readinessProbe"):
        assert container[probe]["httpGet"] == {"path": "/healthz", "port": "healthz"}
    assert container["ports"] == [{"name": "healthz", "containerPort": args.healthz_port},
                                  {"name": "metrics", "containerPort": args.metrics_port}]
    assert container["securityContext"]["readOnlyRootFilesystem"] is True


def test_disabled_controller_renders_nothing_of_it(helm: Helm) -> None:
    objects = helm.render(["controller.enabled=false"])
    assert controller(objects) == []
    assert not by_kind(objects, "Deployment")


def test_replicas_without_election_are_refused(helm: Helm) -> None:
    assert "controller.leaderElection.enabled" in helm.fail(["controller.replicas=2",
                                                             "controller.leaderElection.enabled=false"])


def test_the_removed_peering_value_is_refused_by_the_schema(helm: Helm) -> None:
    """kopf's peering was removed (docs/policies.md "High availability"): an old values file that still sets it
    fails, naming the value, instead of being silently ignored."""
    assert "peering" in helm.fail(["controller.peering=default"])


def test_the_removed_peering_flags_are_refused() -> None:
    parser = FlagParser()
    controller_command.add_arguments(parser)
    for flag in (["--peering", "default"], ["--priority", "3"]):
        with pytest.raises(SystemExit):
            parser.parse_args(flag)


def test_one_standalone_replica_is_recreated_without_lease_role_or_budget(helm: Helm) -> None:
    objects = controller(helm.render(["controller.replicas=1", "controller.leaderElection.enabled=false"]))
    deployment = one(objects, "Deployment")
    assert deployment["spec"]["strategy"] == {"type": "Recreate"}  # standalone: never two at once
    [container] = deployment["spec"]["template"]["spec"]["containers"]
    assert not any(a.startswith("--lease") or a == "--leader-elect" for a in container["args"])
    assert not by_kind(objects, "Role") and not by_kind(objects, "PodDisruptionBudget")


def test_leases_are_granted_by_a_role_in_the_release_namespace_only(helm: Helm) -> None:
    objects = controller(helm.render())
    role = one(objects, "Role")
    assert role["metadata"]["namespace"] == "dra-system"
    assert role["rules"] == [{"apiGroups": ["coordination.k8s.io"], "resources": ["leases"],
                              "verbs": ["get", "create", "update"]}]
    assert not any("leases" in r["resources"] for r in one(objects, "ClusterRole")["rules"])
    binding = one(objects, "RoleBinding")
    assert binding["metadata"]["namespace"] == "dra-system"
    assert binding["roleRef"] == {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role",
                                  "name": role["metadata"]["name"]}
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": one(objects, "ServiceAccount")["metadata"]["name"],
                                    "namespace": "dra-system"}]


def test_budget_and_metrics_service(helm: Helm) -> None:
    objects = controller(helm.render())
    deployment = one(objects, "Deployment")
    labels = deployment["spec"]["selector"]["matchLabels"]
    budget = one(objects, "PodDisruptionBudget")
    assert budget["spec"] == {"minAvailable": 1, "selector": {"matchLabels": labels}}
    service = one(objects, "Service")
    assert service["spec"]["selector"] == labels
    assert service["spec"]["ports"] == [{"name": "metrics", "port": 8081, "targetPort": "metrics"}]
