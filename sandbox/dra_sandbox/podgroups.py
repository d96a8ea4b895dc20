"""KEP-5729 workload claims as Kubernetes 1.37 serves them with `GenericWorkload` and `DRAWorkloadResourceClaims`
on (pure): a pod joins a PodGroup (`scheduling.k8s.io/v1beta1`) through `spec.schedulingGroup.podGroupName`, and a
pod claim that names the same claim as one of the PodGroup's `spec.resourceClaims` (same entry name and the same
`resourceClaimName` or `resourceClaimTemplateName`) is reserved for the PodGroup instead of the pod, so every pod of
the group shares it (k8s.io/dynamic-resource-allocation v0.37.2 `resourceclaim.BindTo` and `IsReservedForPod`).

The sandbox's scheduler stand-in writes such reservations, its kubelet accepts them for the group's pods, and its
claim release keeps one as long as its PodGroup exists (kube-controller-manager's resourceclaim controller releases
it when the PodGroup goes). Not imitated: claims the control plane generates for a PodGroup from a
ResourceClaimTemplate (`podgroup.status.resourceClaimStatuses`), Workload objects and gang scheduling.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any, Final

GROUP: Final = "scheduling.k8s.io"
VERSION: Final = "v1beta1"
RESOURCE: Final = "podgroups"
API: Final = f"/apis/{GROUP}/{VERSION}"
# The gates of kube-apiserver that serve the kind (GenericWorkload) and its `spec.resourceClaims`
# (DRAWorkloadResourceClaims): both beta and off by default in 1.37.
GENERIC_WORKLOAD: Final = "GenericWorkload"
WORKLOAD_CLAIMS: Final = "DRAWorkloadResourceClaims"
# resource/v1beta1 scheduling MaxPodGroupResourceClaims.
MAX_CLAIMS: Final = 4


def pod_group_name(pod: Mapping[str, Any]) -> str | None:
    group = (pod.get("spec") or {}).get("schedulingGroup") or {}
    name = group.get("podGroupName") if isinstance(group, Mapping) else None
    return name if isinstance(name, str) and name else None


def pod_group_path(namespace: str, name: str) -> str:
    return f"{API}/namespaces/{namespace}/{RESOURCE}/{name}"


def pod_consumer(pod: Mapping[str, Any]) -> dict[str, Any]:
    meta = pod["metadata"]
    return {"resource": "pods", "name": meta["name"], "uid": meta["uid"]}


def pod_claim_entry(pod: Mapping[str, Any], claim_name: str) -> Mapping[str, Any] | None:
    """The pod's `spec.resourceClaims` entry that resolves to the ResourceClaim `claim_name`."""
    statuses = {s.get("name"): s.get("resourceClaimName")
                for s in (pod.get("status") or {}).get("resourceClaimStatuses") or []}
    for entry in (pod.get("spec") or {}).get("resourceClaims") or []:
        if entry.get("resourceClaimName") == claim_name or statuses.get(entry.get("name")) == claim_name:
            return entry  # type: ignore[no-any-return]
    return None


def consumer_for(pod: Mapping[str, Any], group: Mapping[str, Any] | None, entry: Mapping[str, Any] | None
                 ) -> dict[str, Any]:
    """Whom the claim behind `entry` is reserved for: the pod's PodGroup when the group lists the same claim (entry
    name, resourceClaimName and resourceClaimTemplateName all equal), else the pod (`BindTo`)."""
    if group is not None and entry is not None and pod_group_name(pod) == group["metadata"]["name"]:
        for listed in (group.get("spec") or {}).get("resourceClaims") or []:
            if all(listed.get(k) == entry.get(k) for k in ("name", "resourceClaimName", "resourceClaimTemplateName")):
                meta = group["metadata"]
                return {"apiGroup": GROUP, "resource": RESOURCE, "name": meta["name"], "uid": meta["uid"]}
    return pod_consumer(pod)


def reserved_for_pod(pod: Mapping[str, Any], reserved: Iterable[Mapping[str, Any]]) -> bool:
    """The claim is reserved for the pod itself or for its PodGroup (`IsReservedForPod` with PodGroups accepted:
    a pod does not know its group's UID, so the group is matched by API group, resource and name)."""
    uid, group = pod["metadata"].get("uid"), pod_group_name(pod)
    return any(r.get("uid") == uid or (group is not None and r.get("apiGroup") == GROUP
                                       and r.get("resource") == RESOURCE and r.get("name") == group)
               for r in reserved)

