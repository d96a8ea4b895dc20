"""Kubernetes client objects -> the plain views the pure lifecycle functions take."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from dra_sandbox.kubelet.draclient import ClaimRef
from dra_sandbox.kubelet.lifecycle import (
    AllocatedDevice,
    ClaimUse,
    ClaimView,
    ContainerView,
    PodClaimSource,
    PodView,
)

Serialize = Callable[[Any], Any]

# The pod claim name under which a pod's extended-resource claim (KEP-5004, `pod.status.
# extendedResourceClaimStatus`) joins its ordinary claims here; not a valid pod claim name, so it never collides.
EXTENDED_RESOURCE_CLAIM = "(extended-resources)"


def _container(c: Any, extended: tuple[str, ...] = ()) -> ContainerView:
    """`extended`: the requests of the pod's extended-resource claim that this container gets (requestMappings)."""
    resources = getattr(c, "resources", None)
    claims = tuple(ClaimUse(u.name, u.request or None) for u in (getattr(resources, "claims", None) or []))
    claims += tuple(ClaimUse(EXTENDED_RESOURCE_CLAIM, r) for r in extended)
    # Only literal values: valueFrom (secrets, fieldRefs) needs an API lookup a sandbox does not do.
    env = tuple((e.name, e.value) for e in (c.env or []) if e.value is not None)
    return ContainerView(name=c.name, image=c.image or "", claims=claims, env=env, reads=_cat_paths(c))


def _cat_paths(c: Any) -> tuple[str, ...]:
    """The files a container whose command is `cat <path>...` prints: the runtime reads them back inside the
    container (docs/sandbox.md "What a container sees"), so a pod spec that works on a real node proves a mount."""
    argv = [*(getattr(c, "command", None) or []), *(getattr(c, "args", None) or [])]
    if not argv or str(argv[0]).rsplit("/", 1)[-1] != "cat":
        return ()
    return tuple(str(a) for a in argv[1:] if str(a).startswith("/"))


def pod_view(pod: Any, serialize: Serialize) -> PodView:
    meta, spec, status = pod.metadata, pod.spec, pod.status
    claim_statuses = {s.name: s.resource_claim_name for s in (getattr(status, "resource_claim_statuses", None) or [])}
    sources = tuple(
        PodClaimSource(rc.name, rc.resource_claim_name, rc.resource_claim_template_name)
        for rc in (spec.resource_claims or [])
    )
    # KEP-5004: the scheduler's claim for `resources.limits: {<extended resource>: N}`, and which container gets
    # which of its requests. The kubelet must use requestMappings, not the request names' format.
    extended = getattr(status, "extended_resource_claim_status", None)
    requests: dict[str, list[str]] = {}
    if extended is not None and extended.resource_claim_name:
        sources += (PodClaimSource(EXTENDED_RESOURCE_CLAIM, extended.resource_claim_name),)
        for m in extended.request_mappings or []:
            requests.setdefault(m.container_name, []).append(m.request_name)
    conditions = tuple(serialize(c) for c in (getattr(status, "conditions", None) or []))
    return PodView(
        namespace=meta.namespace or "default",
        name=meta.name,
        uid=meta.uid or "",
        node_name=spec.node_name or "",
        phase=(getattr(status, "phase", None) or "Pending"),
        deleting=meta.deletion_timestamp is not None,
        restart_policy=spec.restart_policy or "Always",
        resource_claims=sources,
        claim_statuses=claim_statuses,
        containers=tuple(_container(c, tuple(requests.get(c.name, ()))) for c in spec.containers or []),
        conditions=conditions,
        init_containers=tuple(_container(c, ()) for c in getattr(spec, "init_containers", None) or []),
        pod_group=getattr(getattr(spec, "scheduling_group", None), "pod_group_name", None) or None,
    )


def claim_view(claim: Any) -> ClaimView:
    meta, status = claim.metadata, claim.status
    allocation = getattr(status, "allocation", None)
    results = getattr(getattr(allocation, "devices", None), "results", None) or []
    reserved = getattr(status, "reserved_for", None) or []
    return ClaimView(
        ref=ClaimRef(meta.namespace, meta.name, meta.uid or ""),
        allocated=allocation is not None,
        devices=tuple(AllocatedDevice(r.request, r.driver, r.pool, r.device) for r in results),
        reserved_for=frozenset(r.uid for r in reserved if r.uid),
        reserved_groups=frozenset(r.name for r in reserved
                                  if r.api_group == "scheduling.k8s.io" and r.resource == "podgroups" and r.name),
    )
