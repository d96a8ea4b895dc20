"""Planning a compute-domain claim: what its allocation asks of this node, before anything is touched (the GPU
driver's is plugin/claimplan.py). The ResourceClaim is read by the one strict parser (dra_driver/resourceapi); its
opaque configs resolved (class entries first, claim entries after, the last that applies wins; one domain per
claim); the domain read by UID; one device record per result; and each effect kind fills in its part.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from typing import Any

from dra_driver.computedomain.config import ChannelConfig, ConfigError, DaemonConfig, DomainConfig, decode_domain_config
from dra_driver.computedomain.names import (
    CHANNEL_CONFIG_KIND,
    CHANNEL_DEVICE,
    DAEMON_CONFIG_KIND,
    DAEMON_DEVICE,
    READY_CONDITION,
)
from dra_driver.computedomain.plugin.checkpoint import (
    ClaimRecord,
    ClaimState,
    DomainClaim,
    DomainDevice,
    DomainDeviceKind,
)
from dra_driver.computedomain.plugin.domains import DomainReader
from dra_driver.computedomain.plugin.effects.base import DomainEffects, DomainPlan, PermanentError
from dra_driver.errors import DraDriverError
from dra_driver.k8s.client import JsonObject
from dra_driver.kubeletplugin.driver import ClaimRef
from dra_driver.resourceapi import FROM_CLASS, parse_resource_claim
from dra_driver.resourceapi.claim import DeviceResult as AllocatedResult

DEVICE_KINDS = {CHANNEL_DEVICE: DomainDeviceKind.CHANNEL, DAEMON_DEVICE: DomainDeviceKind.DAEMON}


@dataclass(frozen=True)
class DomainEngineSettings:
    driver_name: str
    node_name: str
    readiness_wait_s: float = 10.0  # how long one prepare waits for the node's IMEX daemon before answering
    readiness_poll_s: float = 0.5


def allocation_fingerprint(claim: JsonObject) -> str:
    """Identifies one allocation of a claim: a stale prepare retry carries the allocation it was sent for."""
    allocation = (claim.get("status") or {}).get("allocation") or {}
    return "sha256:" + hashlib.sha256(json.dumps(allocation, sort_keys=True).encode()).hexdigest()[:32]


def plan_domain_claim(
settings: DomainEngineSettings,
effects: DomainEffects,
domains: DomainReader,
clique: str,
ref: ClaimRef,
obj: JsonObject | None,
) -> DomainPlan:
    """The claim's plan, each effect's part filled in. Raises PermanentError (a retry gives the same answer) or
    DraDriverError (retryable), naming the field."""
    where = f"ResourceClaim {ref.namespace}/{ref.name}"
    if obj is None:
        raise DraDriverError(f"{where} does not exist (deleted?); nothing to prepare")
    claim = parse_resource_claim(obj)
    if claim.uid != ref.uid:
        raise PermanentError(f"{where} has UID {claim.uid}, the kubelet asked for {ref.uid} (re-created?)")
    if claim.allocation is None:
        raise DraDriverError(f"{where} is not allocated")
    ours = claim.for_driver(settings.driver_name, settings.node_name)
    if not ours.results:
        raise PermanentError(f"{where} has no device of driver {settings.driver_name} on node "
                             f"{settings.node_name}")
    configs = domain_configs(where, ours.configs, ours.results)
    domain_ids = {c.domain_id for c in configs}
    if len(domain_ids) != 1:
        raise PermanentError(f"{where}: its devices name {len(domain_ids)} ComputeDomains "
                             f"({', '.join(sorted(domain_ids))}); a claim serves one domain")
    (domain_id,) = domain_ids
    domain = domains.domain(domain_id)
    if domain is None:
        raise DraDriverError(f"{where}: ComputeDomain with UID {domain_id} not found (not created yet, or "
                             "deleted); the kubelet retries")
    devices = tuple(
        DomainDevice(request_names=(r.request_name,), pool=r.pool, device=r.device, kind=DEVICE_KINDS[r.device])
        for r in ours.results
    )
    record = ClaimRecord(
        uid=ref.uid, namespace=ref.namespace, name=ref.name, state=ClaimState.PREPARE_STARTED,
        details=DomainClaim(domain.uid, domain.namespace, domain.name, clique),
        allocation=allocation_fingerprint(obj), devices=devices,
    )
    binding = any(READY_CONDITION in r.binding_conditions for r in ours.results if r.device == CHANNEL_DEVICE)
    plan = DomainPlan(ref=ref, domain=domain, config=configs[0], results=tuple(r.raw for r in ours.results),
                      clique_id=clique, binding_conditions=binding, record=record)
    return effects.plan(plan)

def domain_configs(where: str, entries: Any, results: tuple[AllocatedResult, ...]) -> list[DomainConfig]:
    """The config of each result: class entries first, claim entries after, the last that applies wins."""
    decoded: list[tuple[bool, Any, DomainConfig]] = []
    for entry in entries:
        if entry.opaque is None:
            raise PermanentError(f"{where}: {entry.path}: only opaque configuration is supported")
        try:
            config = decode_domain_config(entry.opaque.parameters, path=f"{entry.path}.opaque.parameters")
        except ConfigError as exc:
            raise PermanentError(f"{where}: {exc}") from None
        decoded.append((entry.source != FROM_CLASS, entry, config))
    decoded.sort(key=lambda t: t[0])
    out: list[DomainConfig] = []
    for result in results:
        if result.device not in DEVICE_KINDS:
            raise PermanentError(f"{where}: {result.path}: device {result.device!r} is not offered by this "
                                 f"driver (it offers {CHANNEL_DEVICE} and {DAEMON_DEVICE})")
        want: type[ChannelConfig | DaemonConfig] = (
            ChannelConfig if result.device == CHANNEL_DEVICE else DaemonConfig)
        chosen = [c for _, e, c in decoded if e.applies_to(result.request) and isinstance(c, want)]
        if not chosen:
            kind = CHANNEL_CONFIG_KIND if want is ChannelConfig else DAEMON_CONFIG_KIND
            raise PermanentError(
                f"{where}: device {result.device} (request {result.request!r}) has no {kind} naming its "
                "ComputeDomain; claims of this driver come from the claim templates the ComputeDomain "
                "controller makes"
            )
        out.append(chosen[-1])
    return out
