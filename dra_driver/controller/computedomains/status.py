"""A domain's status from its cliques, and the one-domain-per-clique rule (NVIDIA #892). Pure.

- status.nodes: every daemon entry of every ComputeDomainClique `<uid>.<cliqueID>`, sorted by node name, after
  pruning entries whose node has no daemon pod of the domain any more (a daemon killed without its SIGTERM
  handler, a node that vanished).
- status.status: Ready iff len(nodes) >= spec.numNodes and every node is Ready (NVIDIA's rule, cdstatus.go), and
  the domain is not refused; NotReady otherwise.
- A Ready condition in status.conditions says why (reason, message), so `kubectl describe` answers "why NotReady".

One domain per NVLink clique: two IMEX ensembles on one clique make concurrent cuMemSetAccess on fabric memory
fail intermittently (NVIDIA #892, open, no fix). The rule here: a clique belongs to the oldest live domain (by
creationTimestamp, then UID) that has a daemon in it; any other domain with daemons in that clique is refused:
NotReady with reason CliqueInUse, an Event, and its channel claims never get imex-ready (binding.py). The
compute-domain kubelet plugin refuses such a channel at prepare too (docs/compute-domains.md).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from dra_driver.computedomain.model import ComputeDomain, ComputeDomainClique, DomainNode
from dra_driver.computedomain.names import STATUS_NOT_READY, STATUS_READY
from dra_driver.controller.computedomains import reasons


@dataclass(frozen=True)
class Domain:
    """A live domain as one pass sees it."""

    domain: ComputeDomain
    created: str  # metadata.creationTimestamp (RFC 3339, UTC: sorts as text)

    @property
    def uid(self) -> str:
        return self.domain.uid

    @property
    def age_key(self) -> tuple[str, str]:
        return (self.created or "~", self.domain.uid)


@dataclass(frozen=True)
class CliqueConflict:
    clique_id: str
    owner_uid: str
    owner: str  # namespace/name of the domain that holds the clique


@dataclass(frozen=True)
class DomainStatus:
    status: str
    nodes: tuple[DomainNode, ...]
    reason: str
    message: str

    @property
    def ready(self) -> bool:
        return self.status == STATUS_READY


def cliques_of(uid: str, cliques: Iterable[ComputeDomainClique]) -> list[ComputeDomainClique]:
    return sorted((c for c in cliques if c.domain_uid == uid), key=lambda c: c.name)


def pruned(clique: ComputeDomainClique, daemon_nodes: Iterable[str]) -> tuple[DomainNode, ...] | None:
    """The clique's daemons without those whose node has no daemon pod of the domain; None when none goes."""
    alive = set(daemon_nodes)
    kept = tuple(d for d in clique.daemons if d.name in alive)
    return None if len(kept) == len(clique.daemons) else kept


def clique_owners(domains: Sequence[Domain], cliques: Iterable[ComputeDomainClique]) -> dict[str, Domain]:
    """clique ID -> the domain that holds it (the oldest live domain with a daemon in it)."""
    by_uid = {d.uid: d for d in domains}
    owners: dict[str, Domain] = {}
    for clique in cliques:
        domain = by_uid.get(clique.domain_uid)
        if domain is None or not clique.daemons or not clique.clique_id:
            continue
        held = owners.get(clique.clique_id)
        if held is None or domain.age_key < held.age_key:
            owners[clique.clique_id] = domain
    return owners


def conflict_of(domain: Domain, owners: Mapping[str, Domain], cliques: Iterable[ComputeDomainClique]) -> (
        CliqueConflict | None):
    """The first clique this domain has daemons in that another domain holds."""
    for clique in cliques_of(domain.uid, cliques):
        owner = owners.get(clique.clique_id)
        if clique.daemons and owner is not None and owner.uid != domain.uid:
            return CliqueConflict(clique.clique_id, owner.uid, f"{owner.domain.namespace}/{owner.domain.name}")
    return None


def domain_status(domain: ComputeDomain, cliques: Iterable[ComputeDomainClique], *,
                  conflict: CliqueConflict | None = None, refusal: str = "") -> DomainStatus:
    """`cliques`: this domain's, already pruned. `refusal`: why the controller could not make its objects."""
    nodes = tuple(sorted((d for c in cliques for d in c.daemons), key=lambda d: d.name))
    ready = [n for n in nodes if n.ready]
    if refusal:
        return DomainStatus(STATUS_NOT_READY, nodes, reasons.TEMPLATE_CONFLICT, refusal)
    if conflict is not None:
        return DomainStatus(STATUS_NOT_READY, nodes, reasons.CLIQUE_IN_USE, (
            f"NVLink clique {conflict.clique_id} already runs the IMEX daemons of ComputeDomain {conflict.owner}; "
            "two domains on one clique break fabric memory (NVIDIA #892), so this domain's channels are never "
            "made ready there: delete one of the domains or run this one on another clique"))
    if len(nodes) < domain.num_nodes:
        return DomainStatus(STATUS_NOT_READY, nodes, reasons.WAITING,
                            f"{len(nodes)} of {domain.num_nodes} nodes have joined ({len(ready)} ready)")
    if len(ready) < len(nodes):
        waiting = ", ".join(n.name for n in nodes if not n.ready)
        return DomainStatus(STATUS_NOT_READY, nodes, reasons.NODES_NOT_READY, f"IMEX daemons not ready on: {waiting}")
    return DomainStatus(STATUS_READY, nodes, reasons.ALL_READY, f"{len(nodes)} nodes, every IMEX daemon ready")


def status_patch(obj: Mapping[str, Any], wanted: DomainStatus, now: str) -> dict[str, Any]:
    """The status fields to merge-patch (empty: the status already says it). The Ready condition keeps its
    lastTransitionTime while its status does not change (as meta.SetStatusCondition)."""
    status = obj.get("status") or {}
    generation = (obj.get("metadata") or {}).get("generation")
    patch: dict[str, Any] = {}
    if status.get("status") != wanted.status:
        patch["status"] = wanted.status
    nodes = [n.to_json() for n in wanted.nodes]
    if (status.get("nodes") or []) != nodes:
        patch["nodes"] = nodes or None
    conditions = [c for c in status.get("conditions") or [] if isinstance(c, Mapping)]
    old = next((c for c in conditions if c.get("type") == "Ready"), None)
    state = "True" if wanted.ready else "False"
    condition = {
        "type": "Ready", "status": state, "reason": wanted.reason, "message": wanted.message,
        "lastTransitionTime": old.get("lastTransitionTime") if old and old.get("status") == state else now,
        "observedGeneration": generation,
    }
    if old is None or any(old.get(k) != v for k, v in condition.items()):
        patch["conditions"] = [*(dict(c) for c in conditions if c.get("type") != "Ready"), condition]
    return patch
