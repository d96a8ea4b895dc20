"""ComputeDomain and ComputeDomainClique (gpu.dra.dev/v1beta1) as the product reads them: frozen values, one
strict parser per kind naming the field path of bad input. Pure. The schema the API server enforces is the CRD
(charts/dra-driver/crds/); these parsers are the product's own second line, as for every object it reads.

    ComputeDomain (namespaced, /status subresource, spec immutable)
      spec.numNodes                              int >= 0 (default 0): nodes the domain waits for in status
      spec.channel.resourceClaimTemplate.name    the workload claim template the controller makes (required)
      spec.channel.allocationMode                Single (default: channel 0) | All (every channel)
      status.status                              Ready | NotReady
      status.nodes[]                             name, ipAddress, cliqueID, index, status

    ComputeDomainClique (namespaced, in the driver's namespace, name <cdUID>.<cliqueID>, no status subresource)
      daemons[]                                  nodeName, ipAddress, cliqueID, index, status
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from dra_driver.computedomain.names import CLIQUE_KIND, COMPUTE_DOMAIN_KIND, STATUS_NOT_READY, STATUS_READY
from dra_driver.resourceapi.fields import JSON, FieldReader, read_object


class AllocationMode(enum.StrEnum):
    SINGLE = "Single"  # channel 0
    ALL = "All"  # every channel the kernel offers


@dataclass(frozen=True)
class DomainNode:
    """One node of a domain (status.nodes[]) or one daemon of a clique (daemons[])."""

    name: str
    ip_address: str = ""
    clique_id: str = ""
    index: int = -1  # the daemon's slot in its clique's node map; -1 before it has one
    status: str = STATUS_NOT_READY

    @property
    def ready(self) -> bool:
        return self.status == STATUS_READY

    def to_json(self, *, key: str = "name") -> dict[str, Any]:
        """`key`: "name" in a domain's status.nodes, "nodeName" in a clique's daemons."""
        return {key: self.name, "ipAddress": self.ip_address, "cliqueID": self.clique_id, "index": self.index,
                "status": self.status}


@dataclass(frozen=True)
class ComputeDomain:
    namespace: str
    name: str
    uid: str
    num_nodes: int
    claim_template_name: str
    allocation_mode: AllocationMode
    status: str = STATUS_NOT_READY
    nodes: tuple[DomainNode, ...] = ()
    deleting: bool = False  # metadata.deletionTimestamp is set
    finalizers: tuple[str, ...] = ()
    resource_version: str = ""


@dataclass(frozen=True)
class ComputeDomainClique:
    namespace: str
    name: str  # <cdUID>.<cliqueID>
    daemons: tuple[DomainNode, ...] = ()
    resource_version: str = ""

    @property
    def domain_uid(self) -> str:
        return self.name.split(".", 1)[0]

    @property
    def clique_id(self) -> str:
        return self.name.split(".", 1)[1] if "." in self.name else ""

    def daemon(self, node: str) -> DomainNode | None:
        return next((d for d in self.daemons if d.name == node), None)


def _nodes(r: FieldReader, raw: Any, path: str, key: str) -> tuple[DomainNode, ...]:
    out: list[DomainNode] = []
    seen: set[str] = set()
    for i, item in enumerate(r.seq(raw, path)):
        at = f"{path}[{i}]"
        entry = r.mapping(item, at, required=True)
        name = r.string(entry.get(key), f"{at}.{key}", required=True)
        if name in seen:
            raise r.fail(f"{at}.{key}", f"duplicate entry {name!r} (the list is keyed by {key})")
        seen.add(name)
        status = r.string(entry.get("status"), f"{at}.status") or STATUS_NOT_READY
        if status not in (STATUS_READY, STATUS_NOT_READY):
            raise r.fail(f"{at}.status", f"must be {STATUS_READY} or {STATUS_NOT_READY}, got {status!r}")
        out.append(DomainNode(
            name=name,
            ip_address=r.string(entry.get("ipAddress"), f"{at}.ipAddress"),
            clique_id=r.string(entry.get("cliqueID"), f"{at}.cliqueID"),
            index=r.integer(entry.get("index"), f"{at}.index", default=-1),
            status=status,
        ))
    return tuple(out)


def parse_compute_domain(obj: JSON) -> ComputeDomain:
    r, meta = read_object(COMPUTE_DOMAIN_KIND, obj)
    spec = r.mapping(obj.get("spec"), "spec", required=True)
    channel = r.mapping(spec.get("channel"), "spec.channel", required=True)
    template = r.mapping(channel.get("resourceClaimTemplate"), "spec.channel.resourceClaimTemplate", required=True)
    mode_text = r.string(channel.get("allocationMode"), "spec.channel.allocationMode") or AllocationMode.SINGLE.value
    try:
        mode = AllocationMode(mode_text)
    except ValueError:
        raise r.fail("spec.channel.allocationMode", f"must be Single or All, got {mode_text!r}") from None
    num_nodes = r.integer(spec.get("numNodes"), "spec.numNodes", default=0)
    if num_nodes < 0:
        raise r.fail("spec.numNodes", f"must be >= 0, got {num_nodes}")
    status = r.mapping(obj.get("status"), "status")
    return ComputeDomain(
        namespace=r.string(meta.get("namespace"), "metadata.namespace", required=True),
        name=r.string(meta.get("name"), "metadata.name", required=True),
        uid=r.string(meta.get("uid"), "metadata.uid", required=True),
        num_nodes=num_nodes,
        claim_template_name=r.string(template.get("name"), "spec.channel.resourceClaimTemplate.name", required=True),
        allocation_mode=mode,
        status=r.string(status.get("status"), "status.status") or STATUS_NOT_READY,
        nodes=_nodes(r, status.get("nodes"), "status.nodes", "name"),
        deleting=bool(meta.get("deletionTimestamp")),
        finalizers=r.strings(meta.get("finalizers"), "metadata.finalizers"),
        resource_version=r.string(meta.get("resourceVersion"), "metadata.resourceVersion"),
    )


def parse_clique(obj: Mapping[str, Any]) -> ComputeDomainClique:
    r, meta = read_object(CLIQUE_KIND, obj)
    return ComputeDomainClique(
        namespace=r.string(meta.get("namespace"), "metadata.namespace", required=True),
        name=r.string(meta.get("name"), "metadata.name", required=True),
        daemons=_nodes(r, obj.get("daemons"), "daemons", "nodeName"),
        resource_version=r.string(meta.get("resourceVersion"), "metadata.resourceVersion"),
    )
