"""The ValidatingAdmissionPolicy that keeps the IMEX daemon's DeviceClass in the release namespace.

The daemon device hands a container its ComputeDomain's IMEX config directory read-write, the domain's identity and
the fabric-management capability; the compute-domain kubelet plugin prepares daemon claims of the driver's
namespace only (docs/compute-domains.md). The chart's policy refuses the others when they are written. Its rendered
CEL is evaluated as the API server applies it (tests/chart/test_admission_policy.py's `admit`), for the templates
the controller makes (dra_driver/controller/computedomains/objects.py) and for what a user could write.
"""

from __future__ import annotations

import copy
from typing import Any

import pytest

from dra_driver.computedomain.model import AllocationMode, ComputeDomain
from dra_driver.computedomain.names import DAEMON_CLASS
from dra_driver.controller.computedomains.objects import (
    DaemonSetSettings,
    daemon_claim_template,
    workload_claim_template,
)
from tests.chart.helm import Helm, by_kind
from tests.chart.test_admission_policy import NAMESPACE, RELEASE, admit, named

DOMAIN = ComputeDomain("team", "job", "0b7c1a52-3f7e-4c55-9d1e-6a0f3e2b8c11", 2, "job-channel", AllocationMode.SINGLE)


def refusal(namespace: str) -> str:
    return (f"DeviceClass {DAEMON_CLASS} (the IMEX daemon of a ComputeDomain) may be requested only in namespace "
            f"{NAMESPACE}, where the ComputeDomain controller runs the daemons, not in {namespace}: it grants the "
            "domain's IMEX config directory read-write and the fabric-management capability. A workload uses the "
            "channel claim template its ComputeDomain names in spec.channel.resourceClaimTemplate")


@pytest.fixture(scope="module")
def rendered(helm: Helm) -> list[dict[str, Any]]:
    return helm.render(release=RELEASE, namespace=NAMESPACE)


def judge(objects: list[dict[str, Any]], obj: dict[str, Any], namespace: str, operation: str = "CREATE") -> list[str]:
    policy = named(objects, "ValidatingAdmissionPolicy", "-compute-domain-daemon-claims")
    resource = "resourceclaimtemplates" if obj["kind"] == "ResourceClaimTemplate" else "resourceclaims"
    request = {"operation": operation, "namespace": namespace,
               "resource": {"group": "resource.k8s.io", "version": "v1", "resource": resource},
               "userInfo": {"username": "jane", "extra": {}}}
    applies, failures = admit(policy, request, obj, None, resource=resource)
    assert applies
    return failures


def daemon_template(namespace: str) -> dict[str, Any]:
    return daemon_claim_template(DOMAIN, DaemonSetSettings(namespace=namespace, image="dra-driver:test"))


def claim_from(template: dict[str, Any]) -> dict[str, Any]:
    """The ResourceClaim the resource claim controller makes from `template` for a pod."""
    return {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
            "metadata": {"name": "pod-daemon-x7k2p", "namespace": template["metadata"]["namespace"]},
            "spec": copy.deepcopy(template["spec"]["spec"])}


def test_the_policy_denies_for_everyone(rendered: list[dict[str, Any]]) -> None:
    policy = named(rendered, "ValidatingAdmissionPolicy", "-compute-domain-daemon-claims")
    binding = named(rendered, "ValidatingAdmissionPolicyBinding", "-compute-domain-daemon-claims")
    assert binding["spec"] == {"policyName": policy["metadata"]["name"], "validationActions": ["Deny"]}
    assert policy["spec"]["failurePolicy"] == "Fail" and "matchConditions" not in policy["spec"]
    constraints = policy["spec"]["matchConstraints"]
    assert constraints["matchPolicy"] == "Equivalent"  # v1beta1/v1beta2 requests are judged as v1
    [rule] = constraints["resourceRules"]
    assert rule["apiVersions"] == ["v1"] and rule["resources"] == ["resourceclaims", "resourceclaimtemplates"]


def test_the_controllers_objects_are_admitted(rendered: list[dict[str, Any]]) -> None:
    template = daemon_template(NAMESPACE)
    assert judge(rendered, template, NAMESPACE) == []
    assert judge(rendered, claim_from(template), NAMESPACE) == []
    workload = workload_claim_template(DOMAIN)
    assert judge(rendered, workload, "team") == [] and judge(rendered, claim_from(workload), "team") == []


@pytest.mark.parametrize("namespace", ["other", "team"])  # a stranger's namespace, and the domain's own
def test_daemon_claims_and_templates_elsewhere_are_refused(rendered: list[dict[str, Any]], namespace: str) -> None:
    template = daemon_template(namespace)
    assert judge(rendered, template, namespace) == [refusal(namespace)]
    assert judge(rendered, template, namespace, "UPDATE") == [refusal(namespace)]
    assert judge(rendered, claim_from(template), namespace) == [refusal(namespace)]
    # Asked for as one alternative of a request (KEP-4816 firstAvailable), beside a plain GPU request.
    hidden = claim_from(template)
    hidden["spec"]["devices"]["requests"] = [
        {"name": "gpu", "exactly": {"deviceClassName": "gpu.dra.dev"}},
        {"name": "any", "firstAvailable": [{"name": "gpu", "deviceClassName": "gpu.dra.dev"},
                                           {"name": "imex", "deviceClassName": DAEMON_CLASS}]},
    ]
    assert judge(rendered, hidden, namespace) == [refusal(namespace)]


def test_claims_of_other_classes_and_without_devices_are_admitted(rendered: list[dict[str, Any]]) -> None:
    gpu = {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim", "metadata": {"name": "c"},
           "spec": {"devices": {"requests": [{"name": "gpu", "exactly": {"deviceClassName": "gpu.dra.dev"}}]}}}
    assert judge(rendered, gpu, "other") == []
    assert judge(rendered, {**gpu, "spec": {}}, "other") == []
    assert judge(rendered, {**gpu, "spec": {"devices": {}}}, "other") == []


def test_only_with_compute_domains_and_admission_policies(helm: Helm) -> None:
    def policies(*sets: str) -> list[str]:
        return [o["metadata"]["name"] for o in by_kind(helm.render(sets), "ValidatingAdmissionPolicy")
                if o["metadata"]["name"].endswith("-compute-domain-daemon-claims")]

    assert len(policies()) == 1
    assert policies("computeDomains.enabled=false") == []
    assert policies("admissionPolicy.enabled=false") == []
