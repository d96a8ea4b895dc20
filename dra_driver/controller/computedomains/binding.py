"""KEP-5007 binding conditions on channel claims (clusters >= 1.36). Pure decisions; loop.py does the I/O.

Where the cluster has binding conditions, the compute-domain kubelet plugin publishes `channel-0` with
`bindsToNode: true`, `bindingConditions: [compute-domain.gpu.dra.dev/imex-ready]` and `bindingFailureConditions:
[compute-domain.gpu.dra.dev/imex-failed]`. The scheduler copies them into the claim's allocation result, writes the
chosen node into `status.allocation.nodeSelector` and holds the pod in PreBind until every binding condition is
True in the claim's `status.devices[]` entry of that device (a failure condition True, or its bindingTimeout of
600 s by default, sends the pod back to scheduling and frees the claim).

The controller's part, per such claim (read from kopf's claims watch):
1. the node from `allocation.nodeSelector` (matchFields metadata.name; the pool name, which is the node's, else);
2. refuse (imex-failed) when the node already serves another domain (its gpu.dra.dev/computeDomain label) or its
   clique is held by another domain (status.py, NVIDIA #892);
3. label the node `gpu.dra.dev/computeDomain=<uid>`: the daemon DaemonSet's node selector, so the daemon pod
   starts there before the workload pod is bound;
4. imex-ready True once that node's entry in the domain's clique is Ready; imex-failed True when the daemon pod
   there failed, or when it is not Ready within the controller's binding timeout (`--compute-domain-binding-
   timeout`, default 300 s: below the scheduler's 600 s, so the controller's clear reason wins over a bare
   "binding timeout").
"""

from __future__ import annotations

import enum
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, Final

from dra_driver.computedomain.model import DomainNode
from dra_driver.computedomain.names import (
    CHANNEL_CONFIG_KIND,
    DRIVER_NAME,
    FAILED_CONDITION,
    READY_CONDITION,
)
from dra_driver.controller.computedomains import reasons

DEFAULT_BINDING_TIMEOUT_S: Final = 300.0


@dataclass(frozen=True)
class ChannelClaim:
    """One allocated claim of a channel device whose result carries our binding condition."""

    namespace: str
    name: str
    uid: str
    resource_version: str
    pool: str
    device: str
    node: str
    domain_uid: str  # from the claim's opaque ComputeDomainChannelConfig ("" when it has none)
    allocated_at: datetime | None
    ready: bool  # imex-ready is already True in status.devices
    failed: bool  # imex-failed is already True

    @property
    def key(self) -> str:
        return f"{self.namespace}/{self.name}"

    @property
    def settled(self) -> bool:
        return self.ready or self.failed


def _parse_time(text: Any) -> datetime | None:
    if not isinstance(text, str) or not text:
        return None
    try:
        return datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        return None


def _node_of(allocation: Mapping[str, Any], pool: str) -> str:
    terms = ((allocation.get("nodeSelector") or {}).get("nodeSelectorTerms") or [])
    for term in terms:
        for field in (term or {}).get("matchFields") or []:
            values = field.get("values") or []
            if field.get("key") == "metadata.name" and field.get("operator") == "In" and len(values) == 1:
                return str(values[0])
    return pool  # our pools are named after their node


def _domain_uid(claim: Mapping[str, Any], allocation: Mapping[str, Any]) -> str:
    configs = [*((allocation.get("devices") or {}).get("config") or []),
               *(((claim.get("spec") or {}).get("devices") or {}).get("config") or [])]
    for config in configs:
        opaque = (config or {}).get("opaque") or {}
        params = opaque.get("parameters") or {}
        if opaque.get("driver") == DRIVER_NAME and params.get("kind") == CHANNEL_CONFIG_KIND:
            return str(params.get("domainID") or "")
    return ""


def _condition(entry: Mapping[str, Any] | None, kind: str) -> bool:
    return any(c.get("type") == kind and c.get("status") == "True" for c in (entry or {}).get("conditions") or []
               if isinstance(c, Mapping))


def _entry(claim: Mapping[str, Any], pool: str, device: str) -> Mapping[str, Any] | None:
    for entry in (claim.get("status") or {}).get("devices") or []:
        if isinstance(entry, Mapping) and (entry.get("driver"), entry.get("pool"), entry.get("device")) == (
                DRIVER_NAME, pool, device):
            return entry
    return None


def channel_claims(claim: Mapping[str, Any]) -> list[ChannelClaim]:
    """The claim's allocated devices of our driver that wait for imex-ready (none: not our business)."""
    meta = claim.get("metadata") or {}
    allocation = (claim.get("status") or {}).get("allocation") or {}
    out: list[ChannelClaim] = []
    for result in (allocation.get("devices") or {}).get("results") or []:
        if not isinstance(result, Mapping) or result.get("driver") != DRIVER_NAME:
            continue
        if READY_CONDITION not in (result.get("bindingConditions") or []):
            continue
        pool, device = str(result.get("pool") or ""), str(result.get("device") or "")
        entry = _entry(claim, pool, device)
        out.append(ChannelClaim(
            namespace=str(meta.get("namespace") or ""), name=str(meta.get("name") or ""),
            uid=str(meta.get("uid") or ""), resource_version=str(meta.get("resourceVersion") or ""),
            pool=pool, device=device, node=_node_of(allocation, pool), domain_uid=_domain_uid(claim, allocation),
            allocated_at=_parse_time(allocation.get("allocationTimestamp")),
            ready=_condition(entry, READY_CONDITION), failed=_condition(entry, FAILED_CONDITION),
        ))
    return out


class Verdict(enum.Enum):
    WAIT = "wait"  # label the node (if needed) and look again later
    READY = "ready"
    FAILED = "failed"


@dataclass(frozen=True)
class Decision:
    verdict: Verdict
    label: bool = False  # set the node label for the domain first
    reason: str = ""
    message: str = ""


def decide(
    claim: ChannelClaim,
    *,
    domain_known: bool,
    node_label: str | None,
    clique_owner_uid: str | None,
    clique_owner: str,
    entry: DomainNode | None,
    pod_failure: str,
    now: datetime,
    timeout_s: float,
) -> Decision:
    """What to do about one waiting channel claim.

    `node_label`: the node's gpu.dra.dev/computeDomain label (None: unlabelled); `clique_owner_uid`: the domain
    holding the node's clique (None: nobody, or the node's clique is not known); `entry`: the node's daemon entry
    in the domain's clique; `pod_failure`: why the domain's daemon pod on that node failed ("" : it did not)."""
    if not domain_known:
        return Decision(Verdict.FAILED, reason=reasons.NO_DOMAIN, message=(
            f"claim {claim.key} names ComputeDomain {claim.domain_uid or '<none>'}, which does not exist (or is "
            "being deleted): use the claim template the domain's controller made"))
    if node_label and node_label != claim.domain_uid:
        return Decision(Verdict.FAILED, reason=reasons.NODE_IN_USE, message=(
            f"node {claim.node} already serves ComputeDomain {node_label} (one domain per node)"))
    if clique_owner_uid and clique_owner_uid != claim.domain_uid:
        return Decision(Verdict.FAILED, reason=reasons.CLIQUE_IN_USE, message=(
            f"node {claim.node}'s NVLink clique already runs the IMEX daemons of ComputeDomain {clique_owner} "
            "(two domains on one clique break fabric memory, NVIDIA #892)"))
    if entry is not None and entry.ready:
        return Decision(Verdict.READY, reason=reasons.DAEMON_READY,
                        message=f"the IMEX daemon on node {claim.node} is ready (clique {entry.clique_id})")
    if pod_failure:
        return Decision(Verdict.FAILED, reason=reasons.DAEMON_FAILED,
                        message=f"the IMEX daemon on node {claim.node} failed: {pod_failure}")
    if claim.allocated_at is not None and now - claim.allocated_at > timedelta(seconds=timeout_s):
        return Decision(Verdict.FAILED, reason=reasons.DAEMON_TIMEOUT, message=(
            f"the IMEX daemon on node {claim.node} was not ready within {timeout_s:g} s of the allocation"))
    return Decision(Verdict.WAIT, label=node_label is None)


def devices_with(claim: Mapping[str, Any], channel: ChannelClaim, decision: Decision, now: str) -> list[dict[str, Any]]:
    """The claim's whole status.devices with the decided condition set in our entry (others' entries and the other
    conditions of ours, e.g. the plugin's Ready, stay as read)."""
    kind = READY_CONDITION if decision.verdict is Verdict.READY else FAILED_CONDITION
    generation = int((claim.get("metadata") or {}).get("generation") or 0)
    current = [dict(e) for e in (claim.get("status") or {}).get("devices") or [] if isinstance(e, Mapping)]
    key = (DRIVER_NAME, channel.pool, channel.device)
    entry = next((e for e in current if (e.get("driver"), e.get("pool"), e.get("device")) == key), None)
    if entry is None:
        entry = {"driver": DRIVER_NAME, "pool": channel.pool, "device": channel.device}
        current.append(entry)
    conditions = [dict(c) for c in entry.get("conditions") or [] if isinstance(c, Mapping) and c.get("type") != kind]
    conditions.append({"type": kind, "status": "True", "reason": decision.reason, "message": decision.message[:1024],
                       "lastTransitionTime": now, "observedGeneration": generation})
    entry["conditions"] = conditions[-8:]  # the API allows 8 per entry
    return current


def pod_failure(pods: Iterable[Mapping[str, Any]]) -> str:
    """Why the domain's daemon pod on a node failed ("" : it has not): the pod failed, or its container keeps
    crashing or cannot get its image."""
    for pod in pods:
        status = pod.get("status") or {}
        if status.get("phase") == "Failed":
            return f"pod {(pod.get('metadata') or {}).get('name')} failed: {status.get('reason') or ''}".rstrip(": ")
        for cs in status.get("containerStatuses") or []:
            waiting = ((cs or {}).get("state") or {}).get("waiting") or {}
            if waiting.get("reason") in ("CrashLoopBackOff", "ImagePullBackOff", "ErrImagePull", "InvalidImageName",
                                         "CreateContainerConfigError", "CreateContainerError"):
                return f"container {cs.get('name')}: {waiting.get('reason')}: {waiting.get('message') or ''}".rstrip(
                    ": ")
    return ""
