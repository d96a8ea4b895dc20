"""The kubelet simulator's view of a pod with an extended-resource claim (KEP-5004): the claim joins the pod's
claims and each container references exactly the requests `requestMappings` gives it."""

from __future__ import annotations

import kubernetes.client as k

from dra_sandbox.kubelet.kubeviews import EXTENDED_RESOURCE_CLAIM, pod_view
from dra_sandbox.kubelet.lifecycle import ClaimUse, PodClaimSource, claim_names_for_pod


def test_request_mappings_give_each_container_its_requests() -> None:
    pod = k.V1Pod(
        metadata=k.V1ObjectMeta(name="legacy", namespace="ns", uid="u"),
        spec=k.V1PodSpec(node_name="n1", containers=[
            k.V1Container(name="a", resources=k.V1ResourceRequirements(limits={"nvidia.com/gpu": "1"})),
            k.V1Container(name="b"),
            k.V1Container(name="c", resources=k.V1ResourceRequirements(limits={"nvidia.com/gpu": "2"})),
        ]),
        status=k.V1PodStatus(extended_resource_claim_status=k.V1PodExtendedResourceClaimStatus(
            resource_claim_name="legacy-extended-resources-x7",
            request_mappings=[
                k.V1ContainerExtendedResourceRequest(container_name="a", resource_name="nvidia.com/gpu",
                                                     request_name="container-0-request-0"),
                k.V1ContainerExtendedResourceRequest(container_name="c", resource_name="nvidia.com/gpu",
                                                     request_name="container-2-request-0"),
            ])),
    )
    view = pod_view(pod, k.ApiClient().sanitize_for_serialization)
    assert view.resource_claims == (PodClaimSource(EXTENDED_RESOURCE_CLAIM, "legacy-extended-resources-x7"),)
    assert claim_names_for_pod(view).names == {EXTENDED_RESOURCE_CLAIM: "legacy-extended-resources-x7"}
    claims = {c.name: c.claims for c in view.containers}
    assert claims == {"a": (ClaimUse(EXTENDED_RESOURCE_CLAIM, "container-0-request-0"),), "b": (),
                      "c": (ClaimUse(EXTENDED_RESOURCE_CLAIM, "container-2-request-0"),)}


def test_a_pod_without_an_extended_resource_claim_is_unchanged() -> None:
    pod = k.V1Pod(metadata=k.V1ObjectMeta(name="p", namespace="ns", uid="u"),
                  spec=k.V1PodSpec(containers=[k.V1Container(name="a")]), status=k.V1PodStatus())
    view = pod_view(pod, k.ApiClient().sanitize_for_serialization)
    assert view.resource_claims == () and view.containers[0].claims == ()
